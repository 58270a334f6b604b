r"""Token entropy of a softmax policy from logits, and the entropy lens of Clay et al. (2026).

The lens scores the policy on fixed responses under teacher forcing: one response $\tilde y_x$ per
evaluation prompt, sampled from the base model before RL and frozen,

$$
\bar H = \frac1{|P|}\sum_{x}\frac1{|\tilde y_x|}\sum_t H\big(\pi_\theta(\cdot\mid x,\tilde y_{x,<t})\big),\quad
\overline{\log L} = \frac1{|P|}\sum_x\frac1{|\tilde y_x|}\sum_t\log\pi_\theta(\tilde y_{x,t}\mid x,\tilde y_{x,<t}).
$$

Full-vocabulary entropy (not the sampled-token surprisal, which is reported as the second column).
Reference: Clay et al. 2026, "Demystifying Reinforcement Learning Post-Training of Language Models",
arXiv:2608.24949, Appendix F.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators.aggregation import masked_mean
from posttrain.shapes import Bool, Float, Int
from posttrain.validate import check_finite, check_float, check_mask, check_tensor, value_checks_enabled

__all__ = ["EntropyLens", "domain_means", "entropy_lens", "token_entropy"]


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


class EntropyLens(NamedTuple):
    """Per-response means over response tokens: ``entropy [B]`` (nats) and ``loglik [B]`` (<= 0)."""

    entropy: Tensor
    loglik: Tensor


def entropy_lens(logits: Float[Tensor, "B T V"], tokens: Int[Tensor, "B T"], mask: Bool[Tensor, "B T"]) -> EntropyLens:
    r"""Per-response mean token entropy and mean token log-likelihood of fixed (teacher-forced) responses.

    Args:
        logits: ``[B, T, V]`` the policy's logits at each response position (teacher forcing).
        tokens: ``[B, T]`` the fixed response tokens.
        mask: ``[B, T]`` response positions; every row needs at least one.

    Returns:
        `EntropyLens` of ``[B]`` tensors: $\frac1{|\tilde y|}\sum_t H_t$ and
        $\frac1{|\tilde y|}\sum_t\log\pi(\tilde y_t\mid\cdot)$.

    Raises:
        ShapeError: wrong ranks, dtypes or shapes.
        DomainError: a row with no response token, non-finite logits.

    References:
        Clay et al. 2026, arXiv:2608.24949, Appendix F.

    Examples:
        >>> out = entropy_lens(torch.zeros(1, 2, 4), torch.tensor([[1, 2]]), torch.tensor([[True, False]]))
        >>> [round(float(x), 4) for x in (out.entropy[0], out.loglik[0])]  # log 4, -log 4
        [1.3863, -1.3863]
    """
    check_float("logits", logits, ndim=3)
    check_tensor("tokens", tokens, ndim=2)
    if tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise ShapeError(f"tokens: expected an integer dtype, got {tokens.dtype}")
    if tuple(tokens.shape) != tuple(logits.shape[:2]):
        raise ShapeError(
            f"tokens: expected shape {list(logits.shape[:2])} (the [B, T] of logits), got {list(tokens.shape)}"
        )
    check_mask("mask", mask, logits.shape[:2])
    if value_checks_enabled() and not bool(mask.any(-1).all()):
        raise DomainError("mask: every response needs at least one token (a row of the mask is all False)")
    safe = torch.where(mask[..., None], logits, torch.zeros((), dtype=logits.dtype))  # masked rows may be garbage
    check_finite("logits", safe)
    ent = token_entropy(safe)
    logp = torch.log_softmax(safe, -1).gather(-1, tokens.clamp(0, logits.shape[-1] - 1)[..., None])[..., 0]
    return EntropyLens(masked_mean(ent, mask, dim=-1), masked_mean(logp, mask, dim=-1))


def domain_means(values: Float[Tensor, " B"], domain: Int[Tensor, " B"], *, num_domains: int) -> Float[Tensor, " C"]:
    """Mean of ``values`` per domain id in ``[0, num_domains)`` (NaN for an empty domain).

    Examples:
        >>> domain_means(torch.tensor([1.0, 3.0, 5.0]), torch.tensor([0, 0, 2]), num_domains=3).tolist()
        [2.0, nan, 5.0]
    """
    check_float("values", values, ndim=1)
    check_tensor("domain", domain, ndim=1)
    if domain.is_floating_point() or domain.is_complex() or domain.dtype == torch.bool:
        raise ShapeError(f"domain: expected integer domain ids, got dtype {domain.dtype}")
    if domain.shape != values.shape:
        raise ShapeError(f"domain: expected shape {list(values.shape)} (the shape of values), got {list(domain.shape)}")
    sums = torch.zeros(num_domains, dtype=values.dtype).index_add_(0, domain, values)
    counts = torch.zeros(num_domains, dtype=values.dtype).index_add_(0, domain, torch.ones_like(values))
    return sums / counts
