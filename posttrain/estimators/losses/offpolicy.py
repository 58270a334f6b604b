"""Off-policy corrected PPO-family losses: SIS with GRPO's and GSPO's ratios, truncated IS, no correction.

Selective importance sampling (SIS) treats the tokens that pass its rejection test as on-policy
(ratio 1, no clip) and keeps the clipped ratio on the others. The test, the effective behaviour
log-probs and the notes on the released form against the earlier reconstruction are in
`posttrain.estimators.importance.acceptance`.

Reference: Li et al. 2026, "Turning Off-Policy Tokens On-Policy: A Plug-in Approach for Improving
LLM Alignment", arXiv:2607.04728; the released code (github.com/liyu199809/SIS).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from posttrain.estimators._numerics import computes_in_float32, zero_off_mask
from posttrain.estimators._registry import register_policy_loss
from posttrain.estimators.aggregation import masked_mean
from posttrain.estimators.importance.acceptance import sis_divergence
from posttrain.estimators.importance.ratios import log_ratio
from posttrain.estimators.losses._common import (
    ClipDiagnostics,
    _check_clip,
    _check_policy_inputs,
    _masked_with_diagnostics,
)
from posttrain.estimators.losses.ppo import GSPO_LOG_RATIO_MAX, clipped_ratio_loss, ppo_clip_objective
from posttrain.shapes import Bool, Float
from posttrain.validate import check_float, check_mask, check_positive

__all__ = ["SISDiagnostics", "no_correction_loss", "sis_gspo_loss", "sis_loss", "truncated_is_loss"]


PAPER = "Li et al. 2026, Selective Importance Sampling, arXiv:2607.04728"


class SISDiagnostics(NamedTuple):
    """Diagnostics of an SIS loss (no gradient)."""

    accept_rate: Tensor
    """0-d: $\\sum m\\,\\mathrm{acc} / \\sum m$."""
    d_orig: Tensor | None
    """``[B]``: per-sequence mean absolute log-ratio (rejected tokens' clipped), see `sis_divergence`."""
    d_sis: Tensor | None
    """``[B]``: the same over the rejected tokens only; never above ``d_orig``."""
    clip: ClipDiagnostics
    """Clip diagnostics of the underlying PPO-clip loss (accepted tokens are never clipped)."""


@register_policy_loss("sis", paper=PAPER)
@computes_in_float32
def sis_loss(
    logp: Float[Tensor, "B T"],
    logp_old: Float[Tensor, "B T"],
    advantages: Float[Tensor, " B"] | Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    accepted: Bool[Tensor, "B T"],
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    divergence: bool = True,
) -> tuple[Float[Tensor, "B T"], SISDiagnostics]:
    r"""GRPO/PPO + SIS per-token loss: accepted tokens on-policy and unclipped, rejected ones PPO-clipped.

    $$
    \ell_{bt} = \mathrm{acc}_{bt}\big(-A_b e^{\ell_{bt} - \mathrm{sg}(\ell_{bt})}\big)
    + (1-\mathrm{acc}_{bt})\max\big(-A_b\rho_{bt},\,
    -A_b\,\mathrm{clip}(\rho_{bt}, 1-\epsilon_{low}, 1+\epsilon_{high})\big)
    $$

    (*reconstructed* plug-in form). Equal to ``clipped_ratio_loss(logp, sis_logp_old(logp, logp_old,
    accepted), ...)``, computed as ``clipped_ratio_loss(..., on_policy=accepted)`` (the substitution is
    made in the loss's own log-ratio temporary: no ``[B, T]`` copy of ``logp_old``). With ``accepted`` all False this is exactly the clipped token-IS loss; with
    ``logp == logp_old`` it is exactly on-policy GRPO whatever ``accepted`` is.

    Args:
        logp: ``[B, T]`` current-policy log-probs (gradient). logp_old: ``[B, T]`` behaviour log-probs.
        advantages: ``[B]`` or ``[B, T]``. mask: ``[B, T]`` boolean response mask.
        accepted: ``[B, T]`` boolean outcome of the rejection test (`sis_accept`).
        clip_low, clip_high, dual_clip: PPO-clip settings applied to rejected tokens.
        divergence: also compute ``d_orig``/``d_sis`` (three extra passes; None when False).

    Returns:
        ``(loss [B, T], SISDiagnostics)``; masked positions are 0.

    Raises:
        ShapeError, DomainError: as `clipped_ratio_loss`.

    References:
        Li et al. 2026 (arXiv:2607.04728); Schulman et al. 2017 (arXiv:1707.06347).

    Examples:
        >>> lp = torch.log(torch.tensor([[1.5, 1.5]])); m = torch.ones(1, 2, dtype=torch.bool)
        >>> loss, d = sis_loss(lp, torch.zeros_like(lp), torch.tensor([1.0]), m, torch.tensor([[True, False]]))
        >>> loss[0].tolist(), float(d.accept_rate)
        ([-1.0, -1.2000000476837158], 0.5)
    """
    check_float("logp", logp, ndim=2)  # before accepted, so a bad logp is reported as such
    check_mask("accepted", accepted, logp.shape)
    loss, clip = clipped_ratio_loss(
        logp,
        logp_old,
        advantages,
        mask,
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip=dual_clip,
        on_policy=accepted,
    )
    return loss, _diagnostics(
        logp, logp_old, accepted, mask, clip, divergence=divergence, clip_range=(clip_low, clip_high)
    )


def _diagnostics(
    logp: Tensor,
    logp_old: Tensor,
    accepted: Tensor,
    mask: Tensor,
    clip: ClipDiagnostics,
    *,
    divergence: bool,
    clip_range: tuple[float, float],
) -> SISDiagnostics:
    """Accept rate over the mask and, when asked, `sis_divergence` at ``clip_range`` (no gradient)."""
    with torch.no_grad():
        dt = clip.clip_frac.dtype
        rate = masked_mean(accepted.to(dt), mask)  # 0 on an empty mask
        lo, hi = clip_range
        d = sis_divergence(logp, logp_old, accepted, mask, clip_low=lo, clip_high=hi) if divergence else (None, None)
    return SISDiagnostics(rate, d[0], d[1], clip)


@register_policy_loss("sis_gspo", paper=PAPER)
@computes_in_float32
def sis_gspo_loss(
    logp: Float[Tensor, "B T"],
    logp_old: Float[Tensor, "B T"],
    advantages: Float[Tensor, " B"] | Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    accepted: Bool[Tensor, "B T"],
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    divergence: bool = True,
) -> tuple[Float[Tensor, "B T"], SISDiagnostics]:
    r"""GSPO + SIS as released: the sequence ratio over the rejected tokens; accepted tokens ratio 1, unclipped.

    $$
    \log s^{rej}_b = \frac{\sum_t m_{bt}(1-\mathrm{acc}_{bt})\log\rho_{bt}}{\max(1, \sum_t m_{bt}(1-\mathrm{acc}_{bt}))},\qquad
    s_{bt} = \exp\big(\min(10, \mathrm{sg}(\log s^{rej}_b) + \ell_{bt} - \mathrm{sg}(\ell_{bt}))\big)
    $$

    $$
    \ell_{bt} = \mathrm{acc}_{bt}\big(-A_b e^{\ell_{bt} - \mathrm{sg}(\ell_{bt})}\big)
    + (1-\mathrm{acc}_{bt})\max\big(-A_b s_{bt},\,-A_b\,\mathrm{clip}(s_{bt}, 1-\epsilon_{low}, 1+\epsilon_{high})\big)
    $$

    Aggregate with ``seq-mean-token-mean`` (as GSPO). With ``accepted`` all False this is exactly
    `gspo_loss`; with ``accepted`` all True it is on-policy GRPO with
    sequence-mean aggregation. The earlier reconstruction, ``gspo_loss(logp, sis_logp_old(...))``,
    averaged the log-ratios over all tokens (accepted ones contributing 0) and clipped every token,
    so an accepted token lost its gradient whenever its sequence's ratio left the clip range.

    Args:
        logp: ``[B, T]`` current-policy log-probs (gradient). logp_old: ``[B, T]`` behaviour log-probs.
        advantages: ``[B]`` or ``[B, T]``. mask: ``[B, T]`` boolean response mask.
        accepted: ``[B, T]`` boolean outcome of the rejection test.
        clip_low, clip_high: GSPO's clip range (the paper's 3e-4 / 4e-4) on the rejected tokens.
        divergence: also compute ``d_orig``/``d_sis`` (`sis_divergence` at the released
            trainer's PPO range 0.2 / 0.2).

    Returns:
        ``(loss [B, T], SISDiagnostics)``; masked positions are 0.

    References:
        Li et al. 2026 (arXiv:2607.04728) and its released code; Zheng et al. 2025, GSPO (arXiv:2507.18071).

    Examples:
        >>> lp = torch.log(torch.tensor([[2.0, 1.0, 1.5]])); m = torch.ones(1, 3, dtype=torch.bool)
        >>> loss, d = sis_gspo_loss(lp, torch.zeros_like(lp), torch.tensor([1.0]), m, torch.tensor([[True, False, False]]))
        >>> [round(x, 4) for x in loss[0].tolist()]
        [-1.0, -1.0004, -1.0004]
    """
    _check_clip(clip_low, clip_high, None)
    check_float("logp", logp, ndim=2)  # before accepted, so a bad logp is reported as such
    check_mask("accepted", accepted, logp.shape)
    adv = _check_policy_inputs(logp, logp_old, advantages, mask)
    logp_v = zero_off_mask(logp, mask)  # off-mask NaN/inf reach neither value nor gradient
    rejected = mask & ~accepted
    lr = log_ratio(logp, logp_old)
    seq_lr = masked_mean(zero_off_mask(lr.detach(), mask), rejected, dim=-1)  # [B], over rejected tokens only
    own = logp_v - logp_v.detach()  # value 0, gradient of log pi
    token_lr = torch.where(accepted, own, (seq_lr.unsqueeze(-1) + own).clamp(max=GSPO_LOG_RATIO_MAX))
    ratio = torch.exp(token_lr)
    clipped_loss, clipped, dual = ppo_clip_objective(ratio, adv, clip_low=clip_low, clip_high=clip_high, dual_clip=None)
    loss = torch.where(accepted, -adv * ratio, clipped_loss)
    loss, clip = _masked_with_diagnostics(loss, clipped & ~accepted, dual, lr, ratio, mask)
    return loss, _diagnostics(logp, logp_old, accepted, mask, clip, divergence=divergence, clip_range=(0.2, 0.2))


def _token_policy_loss(weight: Tensor, logp: Tensor, adv: Tensor, mask: Tensor) -> Tensor:
    """$-A w e^{\\ell - \\mathrm{sg}(\\ell)}$: value $-Aw$, gradient $-Aw\\nabla\\ell$; 0 off mask."""
    lp = zero_off_mask(logp, mask)  # masked -inf/NaN would give NaN in exp's gradient (0 * NaN)
    loss = -(zero_off_mask(adv, mask) * zero_off_mask(weight.detach(), mask)) * torch.exp(lp - lp.detach())
    return zero_off_mask(loss, mask)


@register_policy_loss("truncated_is", paper="Ionides 2008, truncated importance sampling; Yao et al. 2025 (TIS)")
@computes_in_float32
def truncated_is_loss(
    logp: Float[Tensor, "B T"],
    logp_old: Float[Tensor, "B T"],
    advantages: Float[Tensor, " B"] | Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    cap: float = 2.0,
) -> Float[Tensor, "B T"]:
    r"""Truncated token IS: $\ell = -A\,\mathrm{sg}(\min(\rho, C))\,e^{\ell-\mathrm{sg}(\ell)}$ per token.

    Value $-A\min(\rho, C)$, gradient $-A\min(\rho, C)\nabla\ell$ (the weight is
    truncated, never zeroed, unlike the PPO clip). A baseline for SIS.

    Args:
        logp, logp_old: ``[B, T]`` log-probs. advantages: ``[B]`` or ``[B, T]``. mask: ``[B, T]``.
        cap: truncation level $C > 0$.

    Returns:
        ``[B, T]`` loss, 0 on masked positions.

    Examples:
        >>> lp = torch.log(torch.tensor([[0.5, 3.0]])); m = torch.ones(1, 2, dtype=torch.bool)
        >>> truncated_is_loss(lp, torch.zeros_like(lp), torch.tensor([1.0]), m).tolist()
        [[-0.5, -2.0]]
    """
    cap = check_positive("cap", cap)
    adv = _check_policy_inputs(logp, logp_old, advantages, mask)
    weight = torch.exp(log_ratio(logp, logp_old)).clamp(max=cap)
    return _token_policy_loss(weight, logp, adv, mask)


@register_policy_loss("no_is_correction", paper="baseline: stale samples trained as on-policy")
@computes_in_float32
def no_correction_loss(
    logp: Float[Tensor, "B T"],
    logp_old: Float[Tensor, "B T"],
    advantages: Float[Tensor, " B"] | Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
) -> Float[Tensor, "B T"]:
    r"""No off-policy correction: ratio $\equiv 1$, $\ell = -A\,e^{\ell-\mathrm{sg}(\ell)}$ per token.

    ``logp_old`` is validated but unused (the signature matches the other policy losses).

    Examples:
        >>> lp = torch.tensor([[-1.0]]); m = torch.ones(1, 1, dtype=torch.bool)
        >>> no_correction_loss(lp, lp - 3.0, torch.tensor([2.0]), m).tolist()
        [[-2.0]]
    """
    adv = _check_policy_inputs(logp, logp_old, advantages, mask)
    return _token_policy_loss(torch.ones_like(adv), logp, adv, mask)
