"""Per-token policy-gradient losses (to be minimised) with diagnostics.

Each loss returns ``(loss [B, T], diagnostics)``; reduce with
:func:`posttrain.estimators.aggregate`. Masked positions of the loss are exactly 0.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators._registry import register_policy_loss
from posttrain.estimators.aggregate import _zero_off_mask, masked_mean
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
"""verl clamps GSPO's token-level log sequence ratio at 10 (ratio at most :math:`e^{10}`) before ``exp``."""


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
    r"""The elementwise PPO-clip loss :math:`\max(-A r, -A\,\mathrm{clip}(r, 1-\epsilon_l, 1+\epsilon_h))`,
    with the dual clip :math:`\min(\cdot, -cA)` for :math:`A < 0` when ``dual_clip=c``.

    Returns ``(loss, clipped, dual_clipped)`` where the last two are boolean masks of where each
    bound is the active branch (its gradient with respect to ``ratio`` is then zero). ``ratio``
    must be positive. No validation: callers validate.
    """
    r_eff = _clipped_ratio(ratio, advantages, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip)
    moved = r_eff != ratio
    dual = moved & (advantages < 0) & (r_eff < ratio) if dual_clip is not None else torch.zeros_like(moved)
    return -advantages * r_eff, moved & ~dual, dual


def _clipped_ratio(
    ratio: Tensor, advantages: Tensor, *, clip_low: float, clip_high: float, dual_clip: float | None
) -> Tensor:
    r"""The effective ratio :math:`\tilde r` with :math:`L = -A\tilde r` equal to the PPO-clip loss.

    Since :math:`r > 0`: for :math:`A > 0`, :math:`\max(-Ar, -A\,\mathrm{clip}(r)) = -A\min(r, 1+\epsilon_h)`;
    for :math:`A < 0` it is :math:`-A\max(r, 1-\epsilon_l)`, and the dual clip caps that at
    :math:`c`. So one ``clamp`` with per-element bounds (computed at the advantages' shape, ``[B, 1]``
    for sequence advantages) gives the loss, and its gradient is zero exactly where a bound is active.
    With :math:`A = 0` no bound applies (the loss is 0 either way; nothing counts as clipped).
    """
    dtype, device = ratio.dtype, ratio.device
    inf = torch.tensor(float("inf"), dtype=dtype, device=device)
    neg = advantages < 0
    lower = torch.where(neg, torch.tensor(1.0 - clip_low, dtype=dtype, device=device), torch.zeros((), dtype=dtype))
    upper_neg = inf if dual_clip is None else torch.tensor(float(dual_clip), dtype=dtype, device=device)
    upper = torch.where(
        advantages > 0, torch.tensor(1.0 + clip_high, dtype=dtype, device=device), torch.where(neg, upper_neg, inf)
    )
    return torch.clamp(ratio, lower, upper)


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
    on_policy: Bool[Tensor, "B T"] | None = None,
) -> tuple[Float[Tensor, "B T"], ClipDiagnostics]:
    r"""PPO clipped-ratio policy loss per token (clip-higher and dual clip as options).

    .. math::
        r = \exp(\mathrm{clamp}(\ell - \ell_{old}, -20, 20)),\quad
        L = \max\big(-A r,\; -A\,\mathrm{clip}(r, 1-\epsilon_{low}, 1+\epsilon_{high})\big)

    and, with ``dual_clip = c > 1``, :math:`L \leftarrow \min(L, -cA)` where :math:`A < 0`.
    Masked positions are 0 and get zero gradient whatever the inputs hold there (NaN and inf
    included); the gradient is zero exactly where a clip bound is active (and where :math:`A = 0`).
    Computed as :math:`L = -A\,\mathrm{clamp}(r, l_A, u_A)` with per-sign bounds (see
    ``_clipped_ratio``), equal to the max/min form. Defaults: symmetric clip 0.2 and no dual clip; verl's ``vanilla`` is
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
        on_policy: optional ``[B, T]`` boolean; on these tokens the log-ratio is replaced by
            :math:`\ell - \mathrm{sg}(\ell)` (ratio value 1, gradient :math:`\nabla\ell`, never clipped),
            in place of a substituted copy of ``logp_old`` (SIS's accepted tokens,
            :func:`posttrain.estimators.sis.sis_loss`).

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
    _check_policy_shapes(logp, logp_old, advantages, mask)
    # One pass per step, no [B, T] copy of sequence advantages: bounds are computed at [B, 1].
    n_valid = mask.count_nonzero()
    if value_checks_enabled() and int(n_valid) == 0:
        raise DomainError("mask: the mask selects no position; at least one token is required")
    mask8 = mask.view(torch.uint8)
    if advantages.ndim == 1:  # rows without a valid token get advantage 0 (NaN there never leaks)
        adv = _zero_off_mask(advantages, mask8.amax(dim=-1).view(torch.bool)).unsqueeze(-1)
    else:
        adv = _zero_off_mask(advantages, mask)
    check_finite("advantages", adv)
    # Off the mask the log-ratio is 0 (ratio 1, never clipped), so NaN/inf there reach neither
    # the value nor the gradient, and the diagnostics need no further masking.
    # In-place steps act on temporaries made here (fewer [B, T] allocations; autograd-safe).
    lr = _zero_off_mask(logp - logp_old, mask, inplace=True)
    if value_checks_enabled() and not bool(torch.isfinite(lr.detach().sum())):
        check_finite("logp", logp, mask)
        check_finite("logp_old", logp_old, mask)
    if on_policy is not None:  # value 0, gradient kept: edit the data only (no saved tensor holds lr yet)
        check_mask("on_policy", on_policy, logp.shape)
        lr.detach().mul_((~on_policy).view(torch.uint8))
    lr = lr.clamp_(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(lr)
    r_eff = _clipped_ratio(ratio, adv, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip)
    loss = (r_eff * -adv).mul_(mask8)  # finite everywhere here, so a multiply masks exactly
    with torch.no_grad():
        n = n_valid.clamp(min=1).to(logp.dtype)
        n_moved = (r_eff != ratio).count_nonzero()
        n_dual = ((r_eff < ratio) & (adv < 0)).count_nonzero() if dual_clip is not None else torch.zeros_like(n_moved)
        diag = ClipDiagnostics(
            clip_frac=(n_moved - n_dual).to(logp.dtype) / n,
            dual_clip_frac=n_dual.to(logp.dtype) / n,
            approx_kl=-lr.sum() / n,
            ratio_mean=(ratio.sum() - (mask.numel() - n_valid).to(logp.dtype)) / n,
        )
    return loss, diag


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

    clamped at :math:`\log s_{it} \le 10` (verl's literal), then the PPO-clip loss with ``clip_low``/``clip_high``
    and no dual clip, per token. Its value is :math:`s_i` on every token of sequence :math:`i`
    and its gradient :math:`s_i \nabla \ell_{it}` (verl's per-token realisation). With advantages
    constant per sequence, aggregate with ``seq-mean-token-mean`` to get GSPO's objective.

    Args:
        logp, logp_old: ``[B, T]`` token log-probs. advantages: ``[B]`` or ``[B, T]``.
        mask: ``[B, T]`` boolean. clip_low, clip_high: the paper's 3e-4 / 4e-4 by default.

    Returns:
        ``(loss [B, T], ClipDiagnostics)``; ``dual_clip_frac`` is always 0.

    Raises:
        ShapeError: wrong ranks, dtypes or shapes. DomainError: bad clip values, empty mask,
        non-finite inputs on valid positions.

    References:
        Zheng et al. 2025, Group Sequence Policy Optimization (arXiv:2507.18071).

    Example:
        >>> lp = torch.log(torch.tensor([[2.0, 0.5]]))  # token ratios 2 and 1/2: geometric mean 1
        >>> loss, _ = gspo_loss(lp, torch.zeros_like(lp), torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool))
        >>> loss.tolist()
        [[-1.0, -1.0]]
    """
    _check_clip(clip_low, clip_high, None)
    adv = _check_policy_inputs(logp, logp_old, advantages, mask)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    logp_v = torch.where(mask, logp, zero)  # off-mask NaN/inf reach neither value nor gradient
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

    .. math::
        r = \exp(\mathrm{clamp}(\ell - \ell_{old}, -20, 20)),\qquad
        L = -\,\mathrm{sg}(w)\,A\,\ell,\qquad
        w = \begin{cases}\mathrm{clip}(r, 1-\epsilon_{low}, 1+\epsilon_{high}) & \texttt{clip\_mode="verl"}\\
        \min(r, \epsilon_{high}) & \texttt{clip\_mode="minimax"}\end{cases}

    so :math:`\partial L/\partial\ell = -wA`: unlike the PPO clip, a clipped token keeps a (capped)
    gradient instead of none. The value is the literal :math:`-wA\ell` of verl's and TRL's ``cispo``
    (not the ratio surrogate :math:`-wA e^{\ell-\mathrm{sg}(\ell)}`; the gradients agree). At
    :math:`\ell = \ell_{old}`, :math:`w = 1` and the gradient is the REINFORCE/GRPO one, :math:`-A\nabla\ell`.

    Conventions: ``"verl"`` (default; verl's ``cispo`` loss mode, defaults
    :math:`\epsilon_{low} = \epsilon_{high} = 0.2` as verl's ``clip_ratio``; any
    :math:`\epsilon_{low} \ge 1` removes the lower bound, the MiniMax paper's practice) and
    ``"minimax"`` (TRL's ``loss_type="cispo"``: no lower bound, ``clip_high`` is the absolute cap
    :math:`\epsilon_{high} \ge 1`, default 5.0; ``clip_low`` must be None). The paper's optional token
    mask (its unified PPO-style formulation) is not implemented.

    Args:
        logp: ``[B, T]`` current-policy token log-probs (carries gradient).
        logp_old: ``[B, T]`` behaviour (old-policy) token log-probs.
        advantages: ``[B]`` per-sequence or ``[B, T]`` per-token advantages.
        mask: ``[B, T]`` boolean response mask, at least one True.
        clip_mode: ``"verl"`` or ``"minimax"`` (above).
        clip_low: :math:`\epsilon_{low} > 0` (``"verl"`` only; None = 0.2).
        clip_high: :math:`\epsilon_{high}`: > 0 relative (``"verl"``, None = 0.2) or >= 1 absolute
            (``"minimax"``, None = 5.0).
        on_policy: optional ``[B, T]`` boolean; on these tokens the ratio is 1 and so is the weight
            (SIS's accepted tokens, as ``clipped_ratio_loss(..., on_policy=...)``): CISPO + SIS,
            :math:`-\mathrm{sg}(\mathrm{clip}(\tilde\rho))A\ell`, is ``on_policy=accepted``
            (*reconstructed* plug-in form, spec 16 section 3.3; equal to substituting
            :func:`~posttrain.estimators.sis.sis_logp_old` for ``logp_old``).

    Returns:
        ``(loss [B, T], ClipDiagnostics)``; masked positions are 0 and get zero gradient whatever
        the inputs hold there (NaN included); ``clip_frac`` counts tokens whose weight was clipped
        (their gradient is scaled, not zeroed); ``dual_clip_frac`` is always 0.

    Raises:
        ShapeError: wrong ranks, dtypes or shapes. DomainError: unknown ``clip_mode``, bad clip
        values, empty mask, non-finite inputs on valid positions.

    References:
        MiniMax 2025, MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention
        (arXiv:2506.13585), section 3.1 (CISPO).

    Example:
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
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    logp_v = torch.where(mask, logp, zero)  # off-mask NaN/inf reach neither value nor gradient
    with torch.no_grad():
        lr = torch.where(mask, log_ratio(logp, logp_old), zero)
        if on_policy is not None:
            lr = lr.masked_fill_(on_policy, 0.0)  # ratio 1, inside every clip range: weight exactly 1
        ratio = torch.exp(lr)
        weight = ratio.clamp(lower, upper)
        scaled = torch.where(mask, adv, zero).mul_(weight)
    loss = -scaled * logp_v
    return _masked_with_diagnostics(loss, weight != ratio, torch.zeros_like(mask), lr, ratio, mask)
