r"""The PPO-clip loss in one pass over its inputs on CPU: the speed path of `clipped_ratio_loss`.

The registered loss (`posttrain.estimators.losses.ppo.clipped_ratio_loss`) reads as its formula
and calls `clipped_ratio_loss` here where it applies; the tests hold the two equal in value,
gradient and diagnostics.

What it computes: with $m$ the mask, $d = m\,(\ell - \ell_{old})$ (0 also on ``on_policy``
tokens), the guarded log-ratio $\lambda = \mathrm{clamp}(d, -20, 20)$, $r = e^\lambda$ and the
per-row (or per-token) bounds $(l_A, u_A)$ of `clip_bounds`,

$$
c = \mathrm{clamp}(r, l_A, u_A),\qquad L = -A\,c\,m,\qquad
\frac{\partial L}{\partial \ell} = L\;[c = r]\,[\lambda = d]
$$

which is the max/min form of `ppo_clip_objective` for $r > 0$ (see `clip_bounds`), the gradient
zero wherever a clip bound or the $\pm 20$ guard is active. The indicator times $L$ is saved in
the forward as the gradient coefficient, so the backward is one multiply.

How: row blocks of about `ROW_BLOCK_BYTES / 4` (`row_blocks`) stay in cache while every step runs
on them: the subtraction, the mask (its uint8 view copied to the loss dtype once per block and
used twice), the guard, ``exp``, the clamp (as ``maximum`` then ``clamp_max_``: a clamp with tensor
bounds is several times slower on CPU), the loss and the gradient coefficient, written into the
outputs, and the clip statistics as sums of 0/1 floats in the same block (no ``count_nonzero``,
no boolean temporaries, no ``where``: all three are several times slower on CPU than float
arithmetic). Off the mask $d = 0$, so $r = c = 1$ and nothing is clipped there; the statistics
subtract those positions.

When it applies: CPU tensors of one floating dtype, 2-d and contiguous, advantages without
gradient. Masking by multiplication lets a NaN or infinity anywhere in the inputs (even off the
mask) reach the block sums; when the sum of $d$ (and of the per-token advantages) is not finite,
the pass is run again masking with ``where`` (exact whatever the masked entries hold, several
times slower), and when it is still not finite (a NaN or infinity on the mask) `clipped_ratio_loss`
returns None and the registered loss takes its formula form, which raises `DomainError` naming the
argument. The test reads one 0-d CPU tensor after the pass: no device synchronisation, nothing per
block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from posttrain.estimators._numerics import row_blocks
from posttrain.estimators.importance.ratios import LOG_RATIO_CLAMP

__all__ = ["applies", "clip_bounds", "clipped_ratio_loss"]

BLOCK_DIVISOR = 4
"""About six block-sized temporaries are live per block: blocks of a quarter of ``ROW_BLOCK_BYTES``."""


def applies(logp: Tensor, logp_old: Tensor, advantages: Tensor, on_policy: Tensor | None) -> bool:
    """Whether the one-pass path can compute `clipped_ratio_loss` for these (validated) inputs."""
    tensors = (logp, logp_old, advantages) if on_policy is None else (logp, logp_old, advantages, on_policy)
    return (
        logp.device.type == "cpu"
        and logp.ndim == 2
        and logp.numel() > 0
        and logp_old.dtype == logp.dtype == advantages.dtype
        and not (advantages.requires_grad and torch.is_grad_enabled())
        and all(t.is_contiguous() for t in tensors)
    )


def clip_bounds(
    advantages: Tensor, *, clip_low: float, clip_high: float, dual_clip: float | None
) -> tuple[Tensor, Tensor]:
    r"""Per-element bounds $(l_A, u_A)$ with PPO-clip $= -A\,\mathrm{clamp}(r, l_A, u_A)$ for $r > 0$.

    For $A > 0$, $\max(-Ar, -A\,\mathrm{clip}(r)) = -A\min(r, 1+\epsilon_h)$; for $A < 0$ it is
    $-A\max(r, 1-\epsilon_l)$, and the dual clip caps that at $c$; $A = 0$ gets no bound (the loss
    is 0 either way; nothing counts as clipped). At the advantages' shape (``[B, 1]`` for sequence
    advantages), so it costs nothing per token.
    """
    neg, pos = advantages < 0, advantages > 0
    zero, inf = torch.zeros_like(advantages), torch.full_like(advantages, float("inf"))
    lower = torch.where(neg, torch.full_like(advantages, 1.0 - clip_low), zero)
    upper_neg = inf if dual_clip is None else torch.full_like(advantages, float(dual_clip))
    upper = torch.where(pos, torch.full_like(advantages, 1.0 + clip_high), torch.where(neg, upper_neg, inf))
    return lower, upper


def _block(
    rows: slice,
    logp: Tensor,
    logp_old: Tensor,
    mask8: Tensor,
    keep8: Tensor | None,
    neg_adv: Tensor,
    lower: Tensor,
    upper: Tensor,
    dual_rows: Tensor | None,
    loss: Tensor,
    coef: Tensor,
    exact: bool,
) -> Tensor:
    """One row block: writes ``loss[rows]`` and ``coef[rows]``; returns its sums (see `_STATS`).

    ``exact``: mask with ``where`` (a NaN or infinity off the mask becomes 0) instead of a multiply.
    """
    lp = logp[rows]
    maskf = torch.empty_like(lp).copy_(mask8[rows])  # the mask in the loss dtype, once per block
    d = torch.sub(lp, logp_old[rows])
    d = torch.where(mask8[rows].bool(), d, 0.0) if exact else d.mul_(maskf)
    if keep8 is not None:  # on-policy tokens: log-ratio 0 (ratio 1, never clipped, gradient kept)
        d.mul_(torch.empty_like(lp).copy_(keep8[rows]))
    lam = torch.clamp(d, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    unguarded = torch.eq(lam, d, out=torch.empty_like(lp))  # [lambda = d] as 0/1
    sums = [d.sum(), lam.sum(), maskf.sum()]
    ratio = lam.exp_()
    sums.append(torch.mul(ratio, maskf, out=d).sum())  # over the mask only (d is free now): nothing to subtract
    lo, hi, na = lower[rows], upper[rows], neg_adv[rows]
    if exact and na.shape[-1] != 1:
        na = torch.where(mask8[rows].bool(), na, 0.0)
    clamped = torch.maximum(ratio, lo, out=loss[rows]).clamp_max_(hi)
    active = torch.eq(clamped, ratio, out=coef[rows]).mul_(unguarded)
    sums.append(active.sum())
    if dual_rows is None:
        sums.append(torch.zeros((), dtype=lp.dtype))
    else:  # the dual bound binds where A < 0 and c < r
        below, negative = torch.lt(clamped, ratio, out=unguarded), dual_rows[rows]
        per_row = negative.shape[-1] == 1
        sums.append((below.sum(-1, keepdim=True) * negative).sum() if per_row else (below * negative).sum())
    if na.shape[-1] != 1:
        sums.append(na.sum())  # per-token advantages: non-finite ones must reach the check
    clamped.mul_(na).mul_(maskf)
    active.mul_(clamped)
    return torch.stack(sums)


_STATS = ("sum d", "sum lambda", "tokens", "sum r on the mask", "active", "dual", "sum -A")


class _OnePassClippedLoss(torch.autograd.Function):
    """PPO-clip per-token loss whose backward is ``grad * coef``; ``compute()`` returns ``(loss, coef, totals)``."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, logp: Tensor, logp_old: Tensor, compute: Callable[[], tuple[Tensor, Tensor, Tensor]]
    ) -> tuple[Tensor, Tensor]:
        loss, coef, totals = compute()
        ctx.save_for_backward(coef)
        ctx.mark_non_differentiable(totals)
        return loss, totals

    @staticmethod
    def backward(ctx: Any, grad: Tensor, _: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        (coef,) = ctx.saved_tensors
        g = grad * coef
        return (g if ctx.needs_input_grad[0] else None), (-g if ctx.needs_input_grad[1] else None), None


def clipped_ratio_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
    on_policy: Tensor | None,
) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor, Tensor, Tensor]] | None:
    """The loss ``[B, T]`` and the sums ``(tokens, n_clipped, n_dual, sum lambda, sum r)`` over the mask.

    ``advantages`` are validated, ``[B, 1]`` or ``[B, T]``, 0 on rows without a valid token. None
    when a non-finite value is on the mask (see the module docstring): the caller uses the formula.
    """
    b, t = logp.shape
    lp, lp_old = logp.detach(), logp_old.detach()
    neg_adv = -advantages.detach()
    lower, upper = clip_bounds(-neg_adv, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip)
    dual_rows = None if dual_clip is None else (neg_adv > 0).to(logp.dtype)
    mask8 = mask.view(torch.uint8)
    keep8 = None if on_policy is None else (mask & ~on_policy).view(torch.uint8)

    def compute(exact: bool) -> Callable[[], tuple[Tensor, Tensor, Tensor]]:
        def run() -> tuple[Tensor, Tensor, Tensor]:
            loss, coef = torch.empty_like(lp), torch.empty_like(lp)
            blocks = row_blocks(b, t * lp.element_size() * BLOCK_DIVISOR)
            args = (lp, lp_old, mask8, keep8, neg_adv, lower, upper, dual_rows, loss, coef, exact)
            return loss, coef, torch.stack([_block(r, *args) for r in blocks]).double().sum(0)

        return run

    per_token = advantages.shape[-1] != 1
    for exact in (False, True):  # a non-finite sum: again with exact masking; still one: on the mask
        out, totals = _OnePassClippedLoss.apply(logp, logp_old, compute(exact))
        if bool(torch.isfinite(totals[0] + totals[6] if per_token else totals[0])):
            break
    else:
        return None
    tokens, n_dual = totals[2], totals[5]
    n_clipped = float(b * t) - totals[4] - n_dual  # off the mask: lambda = 0, r = c = 1, active
    return out, (tokens, n_clipped, n_dual, totals[1], totals[3])
