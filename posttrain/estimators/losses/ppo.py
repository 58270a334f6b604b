"""The PPO clipped-ratio family: the clip objective, the token-ratio loss and GSPO's sequence-ratio loss.

Each loss returns ``(loss [B, T], ClipDiagnostics)``; reduce with `posttrain.estimators.aggregate`.
Masked positions of the loss are exactly 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.estimators import _fused
from posttrain.estimators._numerics import computes_in_float32, mark_zero_off_mask, row_any, zero_off_mask
from posttrain.estimators._registry import register_policy_loss
from posttrain.estimators.importance.ratios import LOG_RATIO_CLAMP, log_ratio, sequence_log_ratio
from posttrain.estimators.losses._common import (
    ClipDiagnostics,
    _check_clip,
    _check_policy_inputs,
    _check_policy_shapes,
    _diagnostics,
    _masked_with_diagnostics,
)
from posttrain.shapes import Bool, Float
from posttrain.validate import (
    check_finite,
    check_float,
    check_mask,
    check_nonempty_mask,
    value_checks_enabled,
)

__all__ = ["GSPO_LOG_RATIO_MAX", "clipped_ratio_loss", "gspo_loss", "ppo_clip_objective"]


GSPO_LOG_RATIO_MAX = 10.0
"""verl clamps GSPO's token-level log sequence ratio at 10 (ratio at most $e^{10}$) before ``exp``."""


def ppo_clip_objective(
    ratio: Tensor,
    advantages: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""The elementwise PPO-clip loss, written as in the paper (the plain reference form).

    $$
    L = \max\big(-A r,\; -A\,\mathrm{clip}(r, 1-\epsilon_l, 1+\epsilon_h)\big),\qquad
    L \leftarrow \min(L, -cA)\ \text{where}\ A < 0\ \text{(dual clip, ``dual_clip=c``)}
    $$

    Returns ``(loss, clipped, dual_clipped)``: the loss at the broadcast shape of ``ratio`` and
    ``advantages``, and boolean masks of where the clipped branch, respectively the dual bound
    $-cA$, is the active one (the gradient with respect to ``ratio`` is zero there). ``ratio``
    must be positive. No validation: callers validate.

    Examples:
        >>> loss, clipped, dual = ppo_clip_objective(
        ...     torch.tensor([1.5, 0.5, 5.0]), torch.tensor([1.0, -1.0, -1.0]), clip_low=0.2, clip_high=0.2, dual_clip=3.0)
        >>> loss.tolist(), clipped.tolist(), dual.tolist()
        ([-1.2000000476837158, 0.800000011920929, 3.0], [True, True, False], [False, False, True])
    """
    check_float("ratio", ratio)
    check_float("advantages", advantages)
    unclipped = -advantages * ratio
    clipped_branch = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped_branch)
    clipped = clipped_branch > unclipped
    if dual_clip is None:
        return loss, clipped, torch.zeros_like(clipped)
    bound = -float(dual_clip) * advantages
    dual = (advantages < 0) & (loss > bound)
    return torch.where(dual, bound, loss), clipped & ~dual, dual


@register_policy_loss("ppo_clip", paper="Schulman et al. 2017, PPO, arXiv:1707.06347")
@computes_in_float32
def clipped_ratio_loss(
    logp: Float[Tensor, "B T"],
    logp_old: Float[Tensor, "B T"],
    advantages: Float[Tensor, " B"] | Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    on_policy: Bool[Tensor, "B T"] | None = None,
    fused: bool = True,
) -> tuple[Float[Tensor, "B T"], ClipDiagnostics]:
    r"""PPO clipped-ratio policy loss per token (clip-higher and dual clip as options).

    $$
    r = \exp(\mathrm{clamp}(\ell - \ell_{old}, -20, 20)),\quad
    L = \max\big(-A r,\; -A\,\mathrm{clip}(r, 1-\epsilon_{low}, 1+\epsilon_{high})\big)
    $$

    and, with ``dual_clip = c > 1``, $L \leftarrow \min(L, -cA)$ where $A < 0$.
    Masked positions are 0 and get zero gradient whatever the inputs hold there (NaN and inf
    included); the gradient is zero exactly where a clip bound is active (and where $A = 0$).
    Defaults: symmetric clip 0.2 and no dual clip; verl's ``vanilla`` is ``dual_clip=3.0``; DAPO's
    clip-higher is ``clip_high=0.28``; TRL does not clamp the log-ratio (irrelevant unless
    $|\ell-\ell_{old}| > 20$, where the clamp's gradient is zero). float16/bfloat16 inputs are
    computed in float32 and the outputs returned in the input dtype.

    The body below is the formula (`ppo_clip_objective` on masked tensors). On CPU the same numbers
    come from one pass over the inputs (`posttrain.estimators._fused`: the loss, its gradient
    coefficient and the clip statistics, row block by row block in cache, no host synchronisation);
    ``fused=False`` forces the formula. The tests hold the two equal in value, gradient and
    diagnostics.

    Args:
        logp: ``[B, T]`` current-policy token log-probs (carries gradient).
        logp_old: ``[B, T]`` behaviour (old-policy) token log-probs.
        advantages: ``[B]`` per-sequence or ``[B, T]`` per-token advantages.
        mask: ``[B, T]`` boolean response mask, at least one True.
        clip_low: $\epsilon_{low} \in (0, 1)$.
        clip_high: $\epsilon_{high} > 0$.
        dual_clip: the dual-clip constant $c > 1$, or None.
        on_policy: optional ``[B, T]`` boolean; on these tokens the log-ratio is replaced by
            $\ell - \mathrm{sg}(\ell)$ (ratio value 1, gradient $\nabla\ell$, never clipped),
            in place of a substituted copy of ``logp_old`` (SIS's accepted tokens,
            `posttrain.estimators.losses.offpolicy.sis_loss`).
        fused: the one-pass computation where it applies (default) or always the formula.

    Returns:
        ``(loss [B, T], ClipDiagnostics)``. ``clip_frac`` counts the tokens whose gradient a bound
        other than the dual clip zeroes: the clip range, or the $\pm 20$ guard on the log-ratio.
        The loss is marked as 0 off ``mask`` (value and gradient), so ``aggregate(loss, mask)``
        with this mask sums it without masking it again.

    Raises:
        ShapeError: wrong ranks, dtypes or shapes.
        DomainError: bad clip values, empty mask,
            non-finite inputs on valid positions.

    References:
        Schulman et al. 2017 (arXiv:1707.06347); Ye et al. 2020 (dual clip, arXiv:1912.09729);
        Yu et al. 2025 (DAPO clip-higher, arXiv:2503.14476).

    Examples:
        >>> lp = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5, 5.0]]))
        >>> m = torch.ones(1, 5, dtype=torch.bool)
        >>> a = torch.tensor([[1., 1., -1., -1., -1.]])
        >>> loss, _ = clipped_ratio_loss(lp, torch.zeros_like(lp), a, m, dual_clip=3.0)
        >>> [round(x, 4) for x in loss[0].tolist()]
        [-1.2, -0.5, 1.5, 0.8, 3.0]
    """
    _check_clip(clip_low, clip_high, dual_clip)
    _check_policy_shapes(logp, logp_old, advantages, mask)
    if on_policy is not None:
        check_mask("on_policy", on_policy, logp.shape)
    if advantages.ndim == 2 and logp.shape[-1] == 1:  # one token per row: per-token advantages are per-row
        advantages = advantages.squeeze(-1)
    if advantages.ndim == 1:  # rows without a valid token get advantage 0 (NaN there never leaks)
        advantages = check_finite("advantages", zero_off_mask(advantages, row_any(mask))).unsqueeze(-1)
    if fused and _fused.applies(logp, logp_old, advantages, on_policy):
        out = _fused.clipped_ratio_loss(
            logp, logp_old, advantages, mask, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip,
            on_policy=on_policy,
        )  # fmt: skip
        if out is not None:  # None: a NaN or inf on the mask; the formula below raises naming the argument
            loss, (tokens, n_clipped, n_dual, lr_sum, ratio_sum) = out
            if value_checks_enabled() and not bool(tokens > 0):
                check_nonempty_mask("mask", mask)  # raises
            return mark_zero_off_mask(loss, mask), _diagnostics(
                n_clipped, n_dual, lr_sum, ratio_sum, tokens, loss.dtype
            )
    check_nonempty_mask("mask", mask)
    adv = zero_off_mask(advantages.expand(logp.shape), mask)
    for name, x in (("logp", logp), ("logp_old", logp_old), ("advantages", adv)):
        check_finite(name, x, mask)
    lr = zero_off_mask(logp - logp_old, mask)  # off-mask NaN/inf reach neither value nor gradient
    if on_policy is not None:  # value 0, gradient kept
        lr = lr - zero_off_mask(lr.detach(), on_policy)
    guarded = lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(guarded)
    loss, clipped, dual = ppo_clip_objective(ratio, adv, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip)
    clipped = clipped | ((guarded != lr) & ~dual)  # the guard zeroes the gradient too
    return _masked_with_diagnostics(loss, clipped, dual, guarded, ratio, mask)


@register_policy_loss("gspo", paper="Zheng et al. 2025, GSPO, arXiv:2507.18071")
@computes_in_float32
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

    $$
    \log s_i = \frac{1}{|y_i|}\sum_t m_{it}(\ell_{it} - \ell^{old}_{it}),\qquad
    s_{it} = \exp\big(\mathrm{sg}(\log s_i) + \ell_{it} - \mathrm{sg}(\ell_{it})\big)
    $$

    clamped at $\log s_{it} \le 10$ (verl's literal), then the PPO-clip loss with ``clip_low``/``clip_high``
    and no dual clip, per token. Its value is $s_i$ on every token of sequence $i$
    and its gradient $s_i \nabla \ell_{it}$ (verl's per-token realisation). With advantages
    constant per sequence, aggregate with ``seq-mean-token-mean`` to get GSPO's objective.

    Args:
        logp, logp_old: ``[B, T]`` token log-probs. advantages: ``[B]`` or ``[B, T]``.
        mask: ``[B, T]`` boolean. clip_low, clip_high: the paper's 3e-4 / 4e-4 by default.

    Returns:
        ``(loss [B, T], ClipDiagnostics)``; ``dual_clip_frac`` is always 0.

    Raises:
        ShapeError: wrong ranks, dtypes or shapes.
        DomainError: bad clip values, empty mask,
            non-finite inputs on valid positions.

    References:
        Zheng et al. 2025, Group Sequence Policy Optimization (arXiv:2507.18071).

    Examples:
        >>> lp = torch.log(torch.tensor([[2.0, 0.5]]))  # token ratios 2 and 1/2: geometric mean 1
        >>> loss, _ = gspo_loss(lp, torch.zeros_like(lp), torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool))
        >>> loss.tolist()
        [[-1.0, -1.0]]
    """
    _check_clip(clip_low, clip_high, None)
    adv = _check_policy_inputs(logp, logp_old, advantages, mask)
    logp_v = zero_off_mask(logp, mask)  # off-mask NaN/inf reach neither value nor gradient
    seq_lr = sequence_log_ratio(logp, logp_old, mask).detach()
    token_lr = seq_lr.unsqueeze(-1) + logp_v - logp_v.detach()
    token_lr = token_lr.clamp(max=GSPO_LOG_RATIO_MAX)
    ratio = torch.exp(token_lr)
    loss, clipped, dual = ppo_clip_objective(ratio, adv, clip_low=clip_low, clip_high=clip_high, dual_clip=None)
    return _masked_with_diagnostics(loss, clipped, dual, log_ratio(logp, logp_old), ratio, mask)
