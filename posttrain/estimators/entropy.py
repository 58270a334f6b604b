"""Token entropy of a softmax policy from logits."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from posttrain.errors import DomainError
from posttrain.validate import check_float

__all__ = ["token_entropy"]


def _entropy_chunk(logits: Tensor) -> Tensor:
    logp = torch.log_softmax(logits, dim=-1)
    # -sum p log p with p = exp(logp); exp(-inf) * -inf is avoided by xlogy-free form:
    p = logp.exp()
    return -(p * torch.where(p > 0, logp, torch.zeros((), dtype=logp.dtype, device=logp.device))).sum(-1)


def token_entropy(logits: Float[Tensor, "B T V"], *, chunk_size: int = 1024) -> Float[Tensor, "B T"]:
    r"""Entropy $H_t = -\sum_v \pi_t(v)\log\pi_t(v)$ of the softmax over the last axis.

    Uses ``log_softmax`` (stable for large logits) and processes ``chunk_size`` token positions
    at a time, so the extra memory is ``chunk_size x V`` rather than ``B x T x V`` (with autograd
    too: each chunk is recomputed in backward). Logits of
    ``-inf`` (masked vocabulary entries) contribute 0. Autograd flows through every chunk.

    Args:
        logits: ``[..., V]`` (usually ``[B, T, V]``) float logits.
        chunk_size: positions per chunk, positive.

    Returns:
        ``[...]`` entropies in nats (``[B, T]``).

    Examples:
        >>> round(float(token_entropy(torch.zeros(1, 1, 4))[0, 0]), 4)  # log 4
        1.3863
    """
    check_float("logits", logits, ndim=(2, 3))
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise DomainError(f"chunk_size: expected a positive integer, got {chunk_size!r}")
    lead = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    if flat.shape[0] <= chunk_size:
        return _entropy_chunk(flat).reshape(lead)
    if flat.requires_grad:
        # Recompute each chunk's softmax in backward, so that autograd keeps no [B*T, V] buffers.
        parts = [checkpoint(_entropy_chunk, c, use_reentrant=False) for c in torch.split(flat, chunk_size, dim=0)]
    else:
        parts = [_entropy_chunk(c) for c in torch.split(flat, chunk_size, dim=0)]
    return torch.cat(parts).reshape(lead)
