"""Per-token policy-gradient losses (to be minimised) with diagnostics.

Each loss returns ``(loss [B, T], diagnostics)``; reduce with
:func:`posttrain.estimators.aggregate`. Masked positions of the loss are exactly 0.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators._registry import register_policy_loss
from posttrain.estimators.aggregate import masked_mean
from posttrain.estimators.ratios import log_ratio, sequence_log_ratio
from posttrain.validate import (
    broadcast_to_tokens,
    check_finite,
    check_float,
    check_mask,
    check_nonempty_mask,
    check_positive,
    check_same_shape,
)

__all__ = ["ClipDiagnostics", "clipped_ratio_loss", "gspo_loss", "ppo_clip_objective"]


class ClipDiagnostics(NamedTuple):
    """0-d tensors, token means over the mask (no gradient)."""

    clip_frac: Tensor
    """Fraction of tokens where the clipped branch is active (its gradient is zero)."""
    dual_clip_frac: Tensor
    """Fraction of tokens where the dual clip bound :math:`-cA` is active."""
    approx_kl: Tensor
    """:math:`\\mathrm{mean}(\\ell_{old} - \\ell)`, verl's ``ppo_kl``."""
    ratio_mean: Tensor
    """Mean importance ratio."""


def _check_policy_inputs(
    logp: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor
) -> Tensor:
    check_float("logp", logp, ndim=2)
    check_same_shape("logp", logp, logp_old=logp_old)
    check_float("logp_old", logp_old)
    check_mask("mask", mask, logp.shape)
    check_nonempty_mask("mask", mask)
    adv = broadcast_to_tokens("advantages", advantages, logp.shape)
    for name, t in (("logp", logp), ("logp_old", logp_old), ("advantages", adv)):
        check_finite(name, torch.where(mask, t.detach(), torch.zeros((), dtype=t.dtype)))
    return adv


def ppo_clip_objective(
    ratio: Tensor,
    advantages: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""The elementwise PPO-clip loss :math:`\max(-A r, -A\,\mathrm{clip}(r, 1-\epsilon_l, 1+\epsilon_h))`,
    with the dual clip :math:`\min(\cdot, -cA)` for :math:`A < 0` when ``dual_clip=c``.

    Returns ``(loss, clipped, dual_clipped)`` where the last two are boolean masks of where each
    bound is the active branch. No validation: callers validate.
    """
    unclipped = -advantages * ratio
    clipped_val = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped_val)
    clipped = clipped_val > unclipped
    if dual_clip is None:
        return loss, clipped, torch.zeros_like(clipped)
    bound = -advantages * dual_clip
    dual = (advantages < 0) & (loss > bound)
    return torch.where(dual, bound, loss), clipped & ~dual, dual


def _check_clip(clip_low: float, clip_high: float, dual_clip: float | None) -> None:
    check_positive("clip_low", clip_low)
    check_positive("clip_high", clip_high)
    if clip_low >= 1.0:
        raise DomainError(f"clip_low: expected a value in (0, 1), got {clip_low!r}")
    if dual_clip is not None and not float(dual_clip) > 1.0:
        raise DomainError(f"dual_clip: expected a constant c > 1 (or None), got {dual_clip!r}")


def _masked_with_diagnostics(
    loss: Tensor, clipped: Tensor, dual: Tensor, lr: Tensor, ratio: Tensor, mask: Tensor
) -> tuple[Tensor, ClipDiagnostics]:
    """Zero the loss off the mask and compute the clip diagnostics as token means."""
    loss = torch.where(mask, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))
    with torch.no_grad():
        diag = ClipDiagnostics(
            clip_frac=masked_mean(clipped.to(loss.dtype), mask),
            dual_clip_frac=masked_mean(dual.to(loss.dtype), mask),
            approx_kl=masked_mean(-lr, mask),
            ratio_mean=masked_mean(ratio, mask),
        )
    return loss, diag


@register_policy_loss("ppo_clip", paper="Schulman et al. 2017, PPO, arXiv:1707.06347")
def clipped_ratio_loss(
    logp: Float[Tensor, "B T"],
    logp_old: Float[Tensor, "B T"],
    advantages: Float[Tensor, " B"] | Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[Float[Tensor, "B T"], ClipDiagnostics]:
    r"""PPO clipped-ratio policy loss per token (clip-higher and dual clip as options).

    .. math::
        r = \exp(\mathrm{clamp}(\ell - \ell_{old}, -20, 20)),\quad
        L = \max\big(-A r,\; -A\,\mathrm{clip}(r, 1-\epsilon_{low}, 1+\epsilon_{high})\big)

    and, with ``dual_clip = c > 1``, :math:`L \leftarrow \min(L, -cA)` where :math:`A < 0`.
    Masked positions are 0. Defaults: symmetric clip 0.2 and no dual clip; verl's ``vanilla`` is
    ``dual_clip=3.0``; DAPO's clip-higher is ``clip_high=0.28``; TRL does not clamp the log-ratio
    (irrelevant unless :math:`|\ell-\ell_{old}| > 20`).

    Args:
        logp: ``[B, T]`` current-policy token log-probs (carries gradient).
        logp_old: ``[B, T]`` behaviour (old-policy) token log-probs.
        advantages: ``[B]`` per-sequence or ``[B, T]`` per-token advantages.
        mask: ``[B, T]`` boolean response mask, at least one True.
        clip_low: :math:`\epsilon_{low} \in (0, 1)`.
        clip_high: :math:`\epsilon_{high} > 0`.
        dual_clip: the dual-clip constant :math:`c > 1`, or None.

    Returns:
        ``(loss [B, T], ClipDiagnostics)``.

    Raises:
        ShapeError: wrong ranks, dtypes or shapes. DomainError: bad clip values, empty mask,
        non-finite inputs on valid positions.

    References:
        Schulman et al. 2017 (arXiv:1707.06347); Ye et al. 2020 (dual clip, arXiv:1912.09729);
        Yu et al. 2025 (DAPO clip-higher, arXiv:2503.14476).

    Example:
        >>> lp = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5, 5.0]]))
        >>> m = torch.ones(1, 5, dtype=torch.bool)
        >>> a = torch.tensor([[1., 1., -1., -1., -1.]])
        >>> loss, _ = clipped_ratio_loss(lp, torch.zeros_like(lp), a, m, dual_clip=3.0)
        >>> [round(x, 4) for x in loss[0].tolist()]
        [-1.2, -0.5, 1.5, 0.8, 3.0]
    """
    _check_clip(clip_low, clip_high, dual_clip)
    adv = _check_policy_inputs(logp, logp_old, advantages, mask)
    lr = log_ratio(logp, logp_old)
    ratio = torch.exp(lr)
    loss, clipped, dual = ppo_clip_objective(
        ratio, adv, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    return _masked_with_diagnostics(loss, clipped, dual, lr, ratio, mask)


@register_policy_loss("gspo", paper="Zheng et al. 2025, GSPO, arXiv:2507.18071")
def gspo_loss(
    logp: Float[Tensor, "B T"],
    logp_old: Float[Tensor, "B T"],
    advantages: Float[Tensor, " B"] | Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> tuple[Float[Tensor, "B T"], ClipDiagnostics]:
    r"""GSPO: PPO clipping on the sequence-level (geometric-mean) importance ratio.

    .. math::
        \log s_i = \frac{1}{|y_i|}\sum_t m_{it}(\ell_{it} - \ell^{old}_{it}),\qquad
        s_{it} = \exp\big(\mathrm{sg}(\log s_i) + \ell_{it} - \mathrm{sg}(\ell_{it})\big)

    clamped at :math:`\log s_{it} \le \log 10`, then the PPO-clip loss with ``clip_low``/``clip_high``
    and no dual clip, per token. Its value is :math:`s_i` on every token of sequence :math:`i`
    and its gradient :math:`s_i \nabla \ell_{it}` (verl's per-token realisation). With advantages
    constant per sequence, aggregate with ``seq-mean-token-mean`` to get GSPO's objective.

    Args:
        logp, logp_old: ``[B, T]`` token log-probs. advantages: ``[B]`` or ``[B, T]``.
        mask: ``[B, T]`` boolean. clip_low, clip_high: the paper's 3e-4 / 4e-4 by default.

    Returns:
        ``(loss [B, T], ClipDiagnostics)``; ``dual_clip_frac`` is always 0.

    References:
        Zheng et al. 2025, Group Sequence Policy Optimization (arXiv:2507.18071).
    """
    _check_clip(clip_low, clip_high, None)
    adv = _check_policy_inputs(logp, logp_old, advantages, mask)
    seq_lr = sequence_log_ratio(logp, logp_old, mask).detach()
    token_lr = seq_lr.unsqueeze(-1) + logp - logp.detach()
    token_lr = token_lr.clamp(max=math.log(10.0))
    ratio = torch.exp(token_lr)
    loss, clipped, dual = ppo_clip_objective(ratio, adv, clip_low=clip_low, clip_high=clip_high, dual_clip=None)
    return _masked_with_diagnostics(loss, clipped, dual, log_ratio(logp, logp_old), ratio, mask)
