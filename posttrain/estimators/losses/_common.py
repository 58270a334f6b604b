"""What the ratio-based policy losses share: input checks, the clip diagnostics and the masking of the loss.

Each loss returns ``(loss [B, T], diagnostics)``; reduce with `posttrain.estimators.aggregate`.
Masked positions of the loss are exactly 0 (value and gradient), and the loss is marked so
(`posttrain.estimators._numerics.mark_zero_off_mask`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators._numerics import mark_zero_off_mask, zero_off_mask
from posttrain.estimators.aggregation import masked_sum
from posttrain.validate import (
    broadcast_to_tokens,
    check_finite,
    check_float,
    check_mask,
    check_nonempty_mask,
    check_positive,
    check_same_shape,
)

__all__ = ["ClipDiagnostics"]


class ClipDiagnostics(NamedTuple):
    """0-d tensors, token means over the mask (no gradient)."""

    clip_frac: Tensor
    """Fraction of tokens where the clipped branch is active (its gradient is zero)."""
    dual_clip_frac: Tensor
    """Fraction of tokens where the dual clip bound $-cA$ is active."""
    approx_kl: Tensor
    """$\\mathrm{mean}(\\ell_{old} - \\ell)$, verl's ``ppo_kl``."""
    ratio_mean: Tensor
    """Mean importance ratio."""


def _check_policy_inputs(logp: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Validate the four policy-loss inputs; return the advantages broadcast to ``[B, T]``."""
    _check_policy_shapes(logp, logp_old, advantages, mask)
    check_nonempty_mask("mask", mask)
    adv = broadcast_to_tokens("advantages", advantages, logp.shape)
    for name, t in (("logp", logp), ("logp_old", logp_old), ("advantages", adv)):
        check_finite(name, t, mask)
    return adv


def _check_policy_shapes(logp: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor) -> None:
    """Shape and dtype checks of the policy-loss inputs (always run; no pass over the data)."""
    check_float("logp", logp, ndim=2)
    check_float("logp_old", logp_old)
    check_same_shape("logp", logp, logp_old=logp_old)
    check_mask("mask", mask, logp.shape)
    broadcast_to_tokens("advantages", advantages, logp.shape)


def _check_clip(clip_low: float, clip_high: float, dual_clip: float | None) -> None:
    check_positive("clip_low", clip_low)
    check_positive("clip_high", clip_high)
    if clip_low >= 1.0:
        raise DomainError(f"clip_low: expected a value in (0, 1), got {clip_low!r}")
    if dual_clip is not None and not float(dual_clip) > 1.0:
        raise DomainError(f"dual_clip: expected a constant c > 1 (or None), got {dual_clip!r}")


def _diagnostics(
    n_clipped: Tensor, n_dual: Tensor, lr_sum: Tensor, ratio_sum: Tensor, n_valid: Tensor, dtype: torch.dtype
) -> ClipDiagnostics:
    """The clip diagnostics from token counts and sums over the mask (the one place they are defined)."""
    n = n_valid.clamp(min=1).to(dtype)
    return ClipDiagnostics(
        clip_frac=n_clipped.to(dtype) / n,
        dual_clip_frac=n_dual.to(dtype) / n,
        approx_kl=-lr_sum.to(dtype) / n,
        ratio_mean=ratio_sum.to(dtype) / n,
    )


def _masked_with_diagnostics(
    loss: Tensor, clipped: Tensor, dual: Tensor, lr: Tensor, ratio: Tensor, mask: Tensor
) -> tuple[Tensor, ClipDiagnostics]:
    """Zero the loss off the mask and compute the clip diagnostics as token means.

    ``clipped`` and ``dual`` are boolean (or, per position, fractions in [0, 1]) at the mask's shape.
    """
    loss = zero_off_mask(loss, mask)
    with torch.no_grad():
        dt = loss.dtype
        diag = _diagnostics(
            masked_sum(clipped.to(dt), mask),
            masked_sum(dual.to(dt), mask),
            masked_sum(lr, mask),
            masked_sum(ratio, mask),
            mask.count_nonzero(),
            dt,
        )
    return mark_zero_off_mask(loss, mask), diag
