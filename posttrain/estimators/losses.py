"""Per-token policy-gradient losses (to be minimised) with diagnostics.

Each loss returns ``(loss [B, T], diagnostics)``; reduce with
`posttrain.estimators.aggregate`. Masked positions of the loss are exactly 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators._numerics import computes_in_float32, row_any, row_blocks, zero_off_mask
from posttrain.estimators._registry import register_policy_loss
from posttrain.estimators.aggregate import masked_sum
from posttrain.estimators.ratios import LOG_RATIO_CLAMP, log_ratio, sequence_log_ratio
from posttrain.validate import (
    broadcast_to_tokens,
    check_finite,
    check_float,
    check_mask,
    check_nonempty_mask,
    check_positive,
    check_same_shape,
    value_checks_enabled,
)

__all__ = [
    "CISPO_CLIP_MODES",
    "GSPO_LOG_RATIO_MAX",
    "ClipDiagnostics",
    "cispo_loss",
    "clipped_ratio_loss",
    "gspo_loss",
    "ppo_clip_objective",
]


GSPO_LOG_RATIO_MAX = 10.0
"""verl clamps GSPO's token-level log sequence ratio at 10 (ratio at most $e^{10}$) before ``exp``."""


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
    must be positive. No validation: callers validate. `clipped_ratio_loss` computes the same
    numbers in fewer passes; its tests compare it with this form.

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


def _clip_bounds(
    advantages: Tensor, *, clip_low: float, clip_high: float, dual_clip: float | None
) -> tuple[Tensor, Tensor]:
    r"""Per-element bounds $(l_A, u_A)$ with PPO-clip $= -A\,\mathrm{clamp}(r, l_A, u_A)$ for $r > 0$.

    For $A > 0$, $\max(-Ar, -A\,\mathrm{clip}(r)) = -A\min(r, 1+\epsilon_h)$; for
    $A < 0$ it is $-A\max(r, 1-\epsilon_l)$, and the dual clip caps that at $c$;
    $A = 0$ gets no bound (the loss is 0 either way; nothing counts as clipped). Computed at
    the advantages' shape (``[B, 1]`` for sequence advantages), so it costs nothing per token.
    """
    dtype, device = advantages.dtype, advantages.device
    inf = torch.tensor(float("inf"), dtype=dtype, device=device)
    neg = advantages < 0
    lower = torch.where(neg, torch.tensor(1.0 - clip_low, dtype=dtype, device=device), torch.zeros((), dtype=dtype))
    upper_neg = inf if dual_clip is None else torch.tensor(float(dual_clip), dtype=dtype, device=device)
    upper = torch.where(
        advantages > 0, torch.tensor(1.0 + clip_high, dtype=dtype, device=device), torch.where(neg, upper_neg, inf)
    )
    return lower, upper


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
    return loss, diag


def _plain_clipped_ratio_loss(
    logp: Tensor,
    logp_old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
    on_policy: Tensor | None,
) -> tuple[Tensor, ClipDiagnostics]:
    """`clipped_ratio_loss` in the plain form (validated inputs; ``adv`` already ``[B, T]``)."""
    lr = zero_off_mask(logp - logp_old, mask)  # off-mask NaN/inf reach neither value nor gradient
    if on_policy is not None:  # value 0, gradient kept
        lr = lr - zero_off_mask(lr.detach(), on_policy)
    lr = lr.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(lr)
    loss, clipped, dual = ppo_clip_objective(
        ratio, zero_off_mask(adv, mask), clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    return _masked_with_diagnostics(loss, clipped, dual, lr, ratio, mask)


def _masked_log_ratio(logp: Tensor, logp_old: Tensor, keep8: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(lr, min, max)``: the log-ratio times the uint8 mask ``keep8`` (no gradient) and its range.

    A NaN or infinity off the mask survives the multiply (``NaN * 0``) and shows in the range; the
    caller then masks with ``where`` (`_masked_log_ratio_where`).
    """
    lr = torch.sub(logp, logp_old).mul_(keep8)
    lo, hi = torch.aminmax(lr)
    return lr, lo, hi


def _masked_log_ratio_where(logp: Tensor, logp_old: Tensor, keep: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """`_masked_log_ratio` with ``where``: exact zeros off the mask whatever it holds."""
    lr = torch.where(keep, torch.sub(logp, logp_old), torch.zeros((), dtype=logp.dtype, device=logp.device))
    lo, hi = torch.aminmax(lr)
    return lr, lo, hi


def _fused_forward(
    lr: Tensor,
    neg_adv: Tensor,
    lower: Tensor,
    upper: Tensor,
    maskf: Tensor,
    with_dual: bool,
    out: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    r"""Forward of the fused PPO-clip loss: ``(loss, dloss/dlogp, n_active, n_dual, sum lr, sum r)``.

    ``lr`` is the log-ratio, 0 off the mask and on on-policy tokens (consumed: edited in place),
    finite and within $\pm 20$ (the caller checks, so the clamp is the identity);
    ``neg_adv`` is $-A$ (0 off the mask), ``lower``/``upper`` the bounds of ``_clip_bounds``,
    ``maskf`` the mask in the loss dtype. With $c = \mathrm{clamp}(r, l_A, u_A)$:
    $L = -A\,c\,m$ and $\partial L/\partial\ell = L\,[c = r]$ ($-A r$ where no bound is active,
    else 0). Sums run over every entry: off the mask $\log r = 0$, $r = c = 1$ and nothing is
    clipped. The activity indicator is written as 0/1 in the loss dtype (no boolean tensor, so no
    dtype conversion when it multiplies). ``out``: tensors of ``lr``'s shape that receive the loss
    and the gradient coefficient.
    """
    lr_sum = lr.sum()
    ratio = lr.exp_()
    clamped = torch.clamp(ratio, lower, upper, out=None if out is None else out[0])
    coef = torch.eq(clamped, ratio, out=torch.empty_like(ratio) if out is None else out[1])  # [c = r] as 0/1
    if not with_dual:
        n_dual = torch.zeros((), dtype=torch.long, device=lr.device)
    elif neg_adv.shape[-1] == 1:  # per-row advantages: the upper bound binds on rows with A < 0 only
        n_dual = torch.count_nonzero(ratio > upper, dim=-1)[neg_adv[:, 0] > 0].sum()
    else:
        n_dual = ((clamped < ratio) & (neg_adv > 0)).count_nonzero()
    n_active, ratio_sum = coef.count_nonzero(), ratio.sum()
    loss = clamped.mul_(neg_adv).mul_(maskf)
    return loss, coef.mul_(loss), n_active, n_dual, lr_sum, ratio_sum


def _fused_forward_blocked(
    logp: Tensor,
    logp_old: Tensor,
    mask8: Tensor,
    keep8: Tensor | None,
    neg_adv: Tensor,
    lower: Tensor,
    upper: Tensor,
    with_dual: bool,
) -> tuple[Tensor, ...]:
    """`_fused_forward` from the log-probs, row block by row block (`row_blocks`, in cache).

    Returns ``(loss, coef, n_active, n_dual, sum lr, sum r, min lr, max lr)``; the log-ratio is
    ``(logp - logp_old) * mask`` (range taken there), then times ``keep8`` (on-policy tokens to 0).
    Each block converts its mask slice to the loss dtype once (mixed-dtype multiplies convert on
    every use). Valid only when the range is finite and within the clamp: the caller checks and
    otherwise discards the result (a NaN off the mask survives ``NaN * 0`` and shows in the range).
    """
    loss, coef = torch.empty_like(logp), torch.empty_like(logp)
    stats: list[list[Tensor]] = [[] for _ in range(6)]
    for rows in row_blocks(logp.shape[0], logp.shape[1] * logp.element_size() * _LOSS_BLOCK_DIVISOR):
        maskf = mask8[rows].to(logp.dtype)
        lr = torch.sub(logp[rows], logp_old[rows]).mul_(maskf)
        lo, hi = torch.aminmax(lr)
        if keep8 is not None:
            lr = lr.mul_(keep8[rows].to(logp.dtype))
        _, _, *sums = _fused_forward(
            lr, neg_adv[rows], lower[rows], upper[rows], maskf, with_dual, out=(loss[rows], coef[rows])
        )
        for acc, value in zip(stats, (*sums, lo, hi), strict=True):
            acc.append(value)
    n_active, n_dual, lr_sum, ratio_sum = (torch.stack(v).sum() for v in stats[:4])
    return loss, coef, n_active, n_dual, lr_sum, ratio_sum, torch.stack(stats[4]).min(), torch.stack(stats[5]).max()


_LOSS_BLOCK_DIVISOR = 4
"""The fused loss keeps about six block-sized temporaries live: blocks of a quarter of `ROW_BLOCK_BYTES`."""


class _FusedClippedLoss(torch.autograd.Function):
    """PPO-clip per-token loss with a one-pass backward: ``dL/dlogp = grad * coef`` (coef saved).

    ``compute()`` (no gradient) returns ``(loss, coef, *statistics)``; the statistics come out
    non-differentiable after the loss.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, logp: Tensor, logp_old: Tensor, compute: Callable[[], tuple[Tensor, ...]]
    ) -> tuple[Tensor, ...]:
        loss, coef, *statistics = compute()
        ctx.save_for_backward(coef)
        ctx.mark_non_differentiable(*statistics)
        return loss, *statistics

    @staticmethod
    def backward(ctx: Any, grad: Tensor, *_: Any) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        (coef,) = ctx.saved_tensors
        g = grad * coef
        g_old = -g if ctx.needs_input_grad[1] else None
        return (g if ctx.needs_input_grad[0] else None), g_old, None


def _fused_result(
    out: tuple[Tensor, ...],
    logp: Tensor,
    logp_old: Tensor,
    adv: Tensor,
    neg_adv: Tensor,
    lower: Tensor,
    upper: Tensor,
    mask: Tensor,
    keep8: Tensor | None,
    n_valid: Tensor,
) -> tuple[Tensor, ClipDiagnostics]:
    """The loss and diagnostics of `clipped_ratio_loss` from ``(loss, n_active, n_dual, sum lr, sum r)``."""
    loss, n_active, n_dual, lr_sum, ratio_sum = out
    if adv.requires_grad:  # the advantages' gradient, -clamp(r) (never needed for the policy update)
        keep = mask if keep8 is None else keep8.bool()
        r_eff = torch.clamp(torch.exp(zero_off_mask(logp.detach() - logp_old.detach(), keep)), lower, upper)
        loss = loss + zero_off_mask(r_eff * (-adv - neg_adv), mask)
    n_off = mask.numel() - n_valid  # off the mask: log-ratio 0, ratio 1, never clipped
    n_clipped = mask.numel() - n_active - n_dual
    return loss, _diagnostics(n_clipped, n_dual, lr_sum, ratio_sum - n_off, n_valid, logp.dtype)


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
    $|\ell-\ell_{old}| > 20$). float16/bfloat16 inputs are computed in float32 and the outputs
    returned in the input dtype.

    The default (``fused=True``) computes $L = -A\,\mathrm{clamp}(r, l_A, u_A)$ with
    per-sign bounds (equal to the max/min form for $r > 0$, see ``_clip_bounds``) in a
    custom autograd function: a few in-place passes forward and one multiply backward
    ($\partial L/\partial\ell = -A r$ where no bound is active, else 0, saved in the
    forward). ``fused=False`` is the plain form (`ppo_clip_objective` on masked tensors);
    the tests hold the two equal in value, gradient and diagnostics. Log-ratios beyond $\pm 20$ on the mask (the clamp binds) take the plain form.

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
            `posttrain.estimators.sis.sis_loss`).
        fused: the fused computation (default) or the plain reference form.

    Returns:
        ``(loss [B, T], ClipDiagnostics)``.

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
    n_valid = mask.count_nonzero()
    if value_checks_enabled() and int(n_valid) == 0:
        raise DomainError("mask: the mask selects no position; at least one token is required")
    mask8 = mask.view(torch.uint8)
    if advantages.ndim == 1:  # rows without a valid token get advantage 0 (NaN there never leaks)
        adv = zero_off_mask(advantages, row_any(mask)).unsqueeze(-1)
    else:
        adv = zero_off_mask(advantages, mask)
    check_finite("advantages", adv)
    if fused:
        wide = torch.promote_types(adv.dtype, logp.dtype)
        adv = adv.to(wide)  # clip bounds and -A in the promoted dtype, as the plain form computes them
        keep8 = None if on_policy is None else (mask & ~on_policy).view(torch.uint8)
        neg_adv = -adv.detach()
        lower, upper = _clip_bounds(adv.detach(), clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip)
        lp, lp_old, with_dual = logp.detach(), logp_old.detach(), dual_clip is not None
        if logp.device.type == "cpu":  # row-blocked (in cache); its range decides whether it stands
            out = _FusedClippedLoss.apply(
                logp,
                logp_old,
                lambda: _fused_forward_blocked(lp, lp_old, mask8, keep8, neg_adv, lower, upper, with_dual),
            )
            lo, hi = out[-2:]
            if bool(torch.isfinite(lo) & torch.isfinite(hi) & (lo >= -LOG_RATIO_CLAMP) & (hi <= LOG_RATIO_CLAMP)):
                return _fused_result(out[:5], logp, logp_old, adv, neg_adv, lower, upper, mask, keep8, n_valid)
        with torch.no_grad():  # the range over the whole mask (on-policy tokens included), then their lr set to 0
            lr, lo, hi = _masked_log_ratio(lp, lp_old, mask8)
            if not bool(torch.isfinite(lo) & torch.isfinite(hi)):  # NaN/inf somewhere: off the mask, or an error
                lr, lo, hi = _masked_log_ratio_where(lp, lp_old, mask)
            if keep8 is not None:
                lr = lr.mul_(keep8)
        # NaN/inf on the mask, or a log-ratio where the +-20 clamp binds: the plain form (which raises on NaN/inf)
        if bool((lo >= -LOG_RATIO_CLAMP) & (hi <= LOG_RATIO_CLAMP)):
            maskf = mask.to(lr.dtype)
            out = _FusedClippedLoss.apply(
                logp, logp_old, lambda: _fused_forward(lr, neg_adv, lower, upper, maskf, with_dual)
            )
            return _fused_result(out, logp, logp_old, adv, neg_adv, lower, upper, mask, keep8, n_valid)
    check_finite("logp", logp, mask)
    check_finite("logp_old", logp_old, mask)
    return _plain_clipped_ratio_loss(
        logp, logp_old, adv, mask, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, on_policy=on_policy
    )


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


CISPO_CLIP_MODES = ("verl", "minimax")
"""The two conventions for CISPO's weight: relative bounds around 1 (verl) or an absolute cap (MiniMax/TRL)."""


def _cispo_bounds(clip_mode: str, clip_low: float | None, clip_high: float | None) -> tuple[float, float]:
    """The weight's ``(lower, upper)`` clamp bounds for ``clip_mode``; DomainError naming the bad option."""
    if clip_mode == "verl":
        low = check_positive("clip_low", 0.2 if clip_low is None else clip_low)
        high = check_positive("clip_high", 0.2 if clip_high is None else clip_high)
        return max(1.0 - low, 0.0), 1.0 + high
    if clip_mode == "minimax":
        if clip_low is not None:
            raise DomainError(f"clip_low: not used with clip_mode='minimax' (no lower bound), got {clip_low!r}")
        cap = 5.0 if clip_high is None else float(clip_high)
        if not cap >= 1.0:  # also NaN; a relative epsilon such as 0.28 here is the likely mistake
            raise DomainError(
                f"clip_high: with clip_mode='minimax' it is the absolute cap on the weight, expected a number >= 1, "
                f"got {clip_high!r} (relative bounds are clip_mode='verl')"
            )
        return 0.0, cap
    raise DomainError(f"clip_mode: expected one of {', '.join(CISPO_CLIP_MODES)}, got {clip_mode!r}")


@register_policy_loss("cispo", paper="MiniMax 2025, MiniMax-M1 (CISPO), arXiv:2506.13585")
@computes_in_float32
def cispo_loss(
    logp: Float[Tensor, "B T"],
    logp_old: Float[Tensor, "B T"],
    advantages: Float[Tensor, " B"] | Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    clip_mode: str = "verl",
    clip_low: float | None = None,
    clip_high: float | None = None,
    on_policy: Bool[Tensor, "B T"] | None = None,
) -> tuple[Float[Tensor, "B T"], ClipDiagnostics]:
    r"""CISPO: REINFORCE weighted by the clipped, stop-gradient importance ratio, per token.

    $$
    r = \exp(\mathrm{clamp}(\ell - \ell_{old}, -20, 20)),\qquad
    L = -\,\mathrm{sg}(w)\,A\,\ell,\qquad
    w = \begin{cases}\mathrm{clip}(r, 1-\epsilon_{low}, 1+\epsilon_{high}) & \texttt{clip\_mode="verl"}\\
    \min(r, \epsilon_{high}) & \texttt{clip\_mode="minimax"}\end{cases}
    $$

    so $\partial L/\partial\ell = -wA$: unlike the PPO clip, a clipped token keeps a (capped)
    gradient instead of none. The value is the literal $-wA\ell$ of verl's and TRL's ``cispo``
    (not the ratio surrogate $-wA e^{\ell-\mathrm{sg}(\ell)}$; the gradients agree). At
    $\ell = \ell_{old}$, $w = 1$ and the gradient is the REINFORCE/GRPO one, $-A\nabla\ell$.

    Conventions: ``"verl"`` (default; verl's ``cispo`` loss mode, defaults
    $\epsilon_{low} = \epsilon_{high} = 0.2$ as verl's ``clip_ratio``; any
    $\epsilon_{low} \ge 1$ removes the lower bound, the MiniMax paper's practice) and
    ``"minimax"`` (TRL's ``loss_type="cispo"``: no lower bound, ``clip_high`` is the absolute cap
    $\epsilon_{high} \ge 1$, default 5.0; ``clip_low`` must be None). The paper's optional token
    mask (its unified PPO-style formulation) is not implemented.

    Args:
        logp: ``[B, T]`` current-policy token log-probs (carries gradient).
        logp_old: ``[B, T]`` behaviour (old-policy) token log-probs.
        advantages: ``[B]`` per-sequence or ``[B, T]`` per-token advantages.
        mask: ``[B, T]`` boolean response mask, at least one True.
        clip_mode: ``"verl"`` or ``"minimax"`` (above).
        clip_low: $\epsilon_{low} > 0$ (``"verl"`` only; None = 0.2).
        clip_high: $\epsilon_{high}$: > 0 relative (``"verl"``, None = 0.2) or >= 1 absolute
            (``"minimax"``, None = 5.0).
        on_policy: optional ``[B, T]`` boolean; on these tokens the ratio is 1 and so is the weight
            (SIS's accepted tokens, as ``clipped_ratio_loss(..., on_policy=...)``): CISPO + SIS,
            $-\mathrm{sg}(\mathrm{clip}(\tilde\rho))A\ell$, is ``on_policy=accepted``
            (*reconstructed* plug-in form, docs: methods/sis.md; equal to substituting
            `sis_logp_old` for ``logp_old``).

    Returns:
        ``(loss [B, T], ClipDiagnostics)``; masked positions are 0 and get zero gradient whatever
        the inputs hold there (NaN included); ``clip_frac`` counts tokens whose weight was clipped
        (their gradient is scaled, not zeroed); ``dual_clip_frac`` is always 0.

    Raises:
        ShapeError: wrong ranks, dtypes or shapes.
        DomainError: unknown ``clip_mode``, bad clip
            values, empty mask, non-finite inputs on valid positions.

    References:
        MiniMax 2025, MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention
        (arXiv:2506.13585), section 3.1 (CISPO).

    Examples:
        >>> lp = torch.log(torch.tensor([[1.5, 0.5, 1.1]])).requires_grad_()  # ratios vs logp_old = 0
        >>> m = torch.ones(1, 3, dtype=torch.bool)
        >>> loss, d = cispo_loss(lp, torch.zeros(1, 3), torch.tensor([1.0]), m)
        >>> loss.sum().backward()
        >>> [round(-g, 4) for g in lp.grad[0].tolist()]  # the weights w = clip(r, 0.8, 1.2)
        [1.2, 0.8, 1.1]
        >>> round(float(d.clip_frac), 4)
        0.6667
        >>> loss, _ = cispo_loss(lp, torch.zeros(1, 3), torch.tensor([1.0]), m, clip_mode="minimax", clip_high=1.25)
        >>> torch.allclose(loss.detach(), -torch.tensor([[1.25, 0.5, 1.1]]) * lp.detach())  # w = min(r, 1.25)
        True
    """
    lower, upper = _cispo_bounds(clip_mode, clip_low, clip_high)
    adv = _check_policy_inputs(logp, logp_old, advantages, mask)
    if on_policy is not None:
        check_mask("on_policy", on_policy, logp.shape)
    logp_v = zero_off_mask(logp, mask)  # off-mask NaN/inf reach neither value nor gradient
    with torch.no_grad():
        lr = zero_off_mask(log_ratio(logp, logp_old), mask)
        if on_policy is not None:
            lr = lr.masked_fill_(on_policy, 0.0)  # ratio 1, inside every clip range: weight exactly 1
        ratio = torch.exp(lr)
        weight = ratio.clamp(lower, upper)
        scaled = zero_off_mask(adv, mask).mul_(weight)
    loss = -scaled * logp_v
    return _masked_with_diagnostics(loss, weight != ratio, torch.zeros_like(mask), lr, ratio, mask)
