"""Token entropy of a softmax policy from logits."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from posttrain.validate import check_float, check_positive

__all__ = ["token_entropy"]


def _entropy_chunk(logits: Tensor) -> Tensor:
    logp = torch.log_softmax(logits, dim=-1)
    # -sum p log p with p = exp(logp); exp(-inf) * -inf is avoided by xlogy-free form:
    p = logp.exp()
    return -(p * torch.where(p > 0, logp, torch.zeros((), dtype=logp.dtype, device=logp.device))).sum(-1)


def token_entropy(
    logits: Float[Tensor, "B T V"], *, chunk_size: int = 1024
) -> Float[Tensor, "B T"]:
    r"""Entropy :math:`H_t = -\sum_v \pi_t(v)\log\pi_t(v)` of the softmax over the last axis.

    Uses ``log_softmax`` (stable for large logits) and processes ``chunk_size`` token positions
    at a time, so the extra memory is ``chunk_size x V`` rather than ``B x T x V``. Logits of
    ``-inf`` (masked vocabulary entries) contribute 0. Autograd flows through every chunk.

    Args:
        logits: ``[..., V]`` (usually ``[B, T, V]``) float logits.
        chunk_size: positions per chunk, positive.

    Returns:
        ``[...]`` entropies in nats (``[B, T]``).

    Example:
        >>> round(float(token_entropy(torch.zeros(1, 1, 4))[0, 0]), 4)  # log 4
        1.3863
    """
    check_float("logits", logits, ndim=(2, 3))
    size = int(check_positive("chunk_size", chunk_size))
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    if flat.shape[0] <= size:
        return _entropy_chunk(flat).reshape(lead)
    parts = [_entropy_chunk(c) for c in torch.split(flat, size, dim=0)]
    return torch.cat(parts).reshape(lead)
