r"""The entropy lens of paper 06: entropy and log-likelihood of fixed responses under teacher forcing.

Before RL, one response $\tilde y_x$ per evaluation prompt is sampled from the base model and
frozen; during training the policy is scored on these fixed responses:

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
from jaxtyping import Bool, Float, Int
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators.aggregate import masked_mean
from posttrain.estimators.entropy import token_entropy
from posttrain.validate import check_finite, check_float, check_mask, check_tensor, value_checks_enabled

__all__ = ["EntropyLens", "domain_means", "entropy_lens"]


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
    if domain.shape != values.shape:
        raise ShapeError(f"domain: expected shape {list(values.shape)} (the shape of values), got {list(domain.shape)}")
    sums = torch.zeros(num_domains, dtype=values.dtype).index_add_(0, domain, values)
    counts = torch.zeros(num_domains, dtype=values.dtype).index_add_(0, domain, torch.ones_like(values))
    return sums / counts
