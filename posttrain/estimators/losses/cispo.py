"""CISPO: REINFORCE weighted by the clipped, stop-gradient importance ratio (MiniMax-M1).

Returns ``(loss [B, T], ClipDiagnostics)``; reduce with `posttrain.estimators.aggregate`. Masked
positions of the loss are exactly 0. Reference: MiniMax 2025 (arXiv:2506.13585), section 3.1.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators._numerics import computes_in_float32, zero_off_mask
from posttrain.estimators._registry import register_policy_loss
from posttrain.estimators.importance.ratios import log_ratio
from posttrain.estimators.losses._common import ClipDiagnostics, _check_policy_inputs, _masked_with_diagnostics
from posttrain.shapes import Bool, Float
from posttrain.validate import (
    check_mask,
    check_positive,
)

__all__ = ["CISPO_CLIP_MODES", "cispo_loss"]


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
