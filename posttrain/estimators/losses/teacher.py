r"""Policy losses that use the teacher inside the loss (the paper's (docs: methods/opd_then_rl.md) TRRD, and OPD / KDRL for a trainer).

They follow the trainer's calling convention ``loss(logp, logp_old, advantages, mask, **needs)``:
``logp_teacher`` is a keyword-only argument, so an LLM trainer that fills batch fields named in a
loss's signature (``posttrain.llm.methods.algorithm``) runs the teacher forward for exactly these losses.
``advantages`` are the RL advantages $\hat A$ (``[B]`` or ``[B, T]``).

Reference: Li, Chen, Yang, Nie, Zhao, Ye 2026, Sequential Beats Joint (arXiv:2609.04108).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.estimators._numerics import computes_in_float32, zero_off_mask
from posttrain.estimators._registry import register_policy_loss
from posttrain.estimators.advantages.teacher import eos_teacher_mask, opd_token_advantages
from posttrain.estimators.importance.ratios import LOG_RATIO_CLAMP
from posttrain.estimators.losses._common import (
    ClipDiagnostics,
    _check_clip,
    _check_policy_inputs,
    _masked_with_diagnostics,
)
from posttrain.estimators.losses.ppo import clipped_ratio_loss, ppo_clip_objective
from posttrain.shapes import Bool, Float
from posttrain.validate import (
    check_finite,
    check_float,
    check_in_range,
    check_mask,
    check_nonempty_mask,
    check_positive,
    check_same_shape,
)

__all__ = ["opd_policy_loss", "topk_distill_loss", "trrd_loss"]


_PAPER = "Li et al. 2026, Sequential Beats Joint, arXiv:2609.04108"

_PAPER = "Gao et al. 2026, Open-MOPD, arXiv:2608.19098"


def _teacher_signal(
    logp_teacher: Tensor, logp_old: Tensor, mask: Tensor, teacher_mask: Tensor | None, mask_final_token: bool
) -> Tensor:
    check_float("logp_teacher", logp_teacher)
    check_same_shape("logp_old", logp_old, logp_teacher=logp_teacher)
    tm = eos_teacher_mask(mask) if mask_final_token else mask
    if teacher_mask is not None:
        tm = tm & check_mask("teacher_mask", teacher_mask, mask.shape)
    return opd_token_advantages(logp_teacher, logp_old, mask, teacher_mask=tm)


@register_policy_loss("opd", paper=_PAPER)
@computes_in_float32
def opd_policy_loss(
    logp: Float[Tensor, "B T"],
    logp_old: Float[Tensor, "B T"],
    advantages: Float[Tensor, " B"] | Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    logp_teacher: Float[Tensor, "B T"],
    beta: float | None = None,
    mask_final_token: bool = False,
    teacher_mask: Bool[Tensor, "B T"] | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> tuple[Float[Tensor, "B T"], ClipDiagnostics]:
    r"""PPO-clip loss on the OPD advantage $d_t$ (``beta=None``) or on KDRL's $\hat A + \beta d_t$.

    $$
    d_t = \mathrm{sg}[\ell^T_t - \ell^{old}_t],\qquad
                  A_t = d_t\ \ (\beta = \text{None})\quad\text{or}\quad A_t = \hat A_t + \beta d_t
    $$

    ``mask_final_token`` applies the paper's (docs: methods/opd_then_rl.md) EOS rule (teacher terms 0 on each row's last token).

    Examples:
        >>> lp = torch.zeros(1, 2)
        >>> m = torch.ones(1, 2, dtype=torch.bool)
        >>> loss, _ = opd_policy_loss(lp, lp, torch.zeros(1), m, logp_teacher=torch.full((1, 2), -0.5))
        >>> loss.tolist()
        [[0.5, 0.5]]
    """
    d = _teacher_signal(logp_teacher, logp_old, mask, teacher_mask, mask_final_token)
    if beta is None:
        adv = d
    else:
        a_hat = _check_policy_inputs(logp, logp_old, advantages, mask)
        adv = zero_off_mask(a_hat, mask) + check_positive("beta", beta, strict=False) * d
    return clipped_ratio_loss(logp, logp_old, adv, mask, clip_low=clip_low, clip_high=clip_high)


@register_policy_loss("trrd", paper=_PAPER)
@computes_in_float32
def trrd_loss(
    logp: Float[Tensor, "B T"],
    logp_old: Float[Tensor, "B T"],
    advantages: Float[Tensor, " B"] | Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    logp_teacher: Float[Tensor, "B T"],
    alpha: float = 0.5,
    mask_final_token: bool = False,
    teacher_mask: Bool[Tensor, "B T"] | None = None,
    teacher_grad: bool = True,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> tuple[Float[Tensor, "B T"], ClipDiagnostics]:
    r"""TRRD: PPO-clip loss with the ratio against the geometric mixture $\pi_{old}^\alpha\pi_T^{1-\alpha}$.

    $$
    \log\rho_t = \alpha(\ell_t - \ell^{old}_t) + (1-\alpha)(\ell_t - \ell^T_t)
                  = (\ell_t - \ell^{old}_t) - (1-\alpha)\,d_t
    $$

    with $d_t = \ell^T_t - \ell^{old}_t$ (0 outside the teacher mask), i.e.
    $\rho = r^\alpha e^{-(1-\alpha)d_t}$ in value. *Reconstructed reading* (docs: methods/opd_then_rl.md): the
    gradient flows through $\ell$ in both terms; ``teacher_grad=False`` keeps only
    $\alpha\nabla\ell$ (the teacher factor as a constant). ``alpha = 1`` is the GRPO ratio.
    The advantage is the unmodified $\hat A$, so the sign of $A$ never changes.

    Args:
        logp, logp_old, logp_teacher: ``[B, T]`` log-probs of the sampled tokens.
        advantages: ``[B]`` or ``[B, T]``. mask, teacher_mask: ``[B, T]`` boolean.
        alpha: $\alpha \in [0, 1]$; the paper uses 0.5.

    Returns:
        ``(loss [B, T], ClipDiagnostics)``.

    Examples:
        >>> lp = torch.zeros(1, 1)
        >>> m = torch.ones(1, 1, dtype=torch.bool)
        >>> loss, _ = trrd_loss(lp, lp, torch.ones(1), m, logp_teacher=torch.log(torch.tensor([[0.5]])))
        >>> round(float(loss), 4)  # rho = 2 ** 0.5 clipped to 1.2
        -1.2
    """
    _check_clip(clip_low, clip_high, None)
    alpha = check_in_range("alpha", alpha, 0.0, 1.0)
    adv = _check_policy_inputs(logp, logp_old, advantages, mask)
    d = _teacher_signal(logp_teacher, logp_old, mask, teacher_mask, mask_final_token)
    lr = zero_off_mask(logp - logp_old, mask)  # NaN off the mask never reaches the ratio or a gradient
    log_rho = lr - (1.0 - alpha) * d if teacher_grad else alpha * lr - (1.0 - alpha) * d
    log_rho = log_rho.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    rho = torch.exp(log_rho)
    loss, clipped, dual = ppo_clip_objective(rho, adv, clip_low=clip_low, clip_high=clip_high, dual_clip=None)
    return _masked_with_diagnostics(loss, clipped, dual, log_rho, rho, mask)


@register_policy_loss("mopd_topk", paper=_PAPER)
@computes_in_float32
def topk_distill_loss(
    logp_k: Float[Tensor, "B T K"],
    logp_old_k: Float[Tensor, "B T K"],
    advantages_k: Float[Tensor, "B T K"],
    mask: Bool[Tensor, "B T"],
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = 3.0,
) -> tuple[Float[Tensor, "B T"], ClipDiagnostics]:
    r"""Per-candidate dual-clip PPO loss summed over the K top-k candidates (Open-MOPD).

    $$
    L_t = \sum_k \mathrm{PPO}_{dual}(\rho_{t,k}, A_{t,k}),\quad \rho_{t,k} = e^{\ell_{t,k}-\ell^{old}_{t,k}}
    $$

    Reduce with ``aggregate(loss, mask, "token-mean")``. Diagnostics are token means of the
    per-candidate means (unweighted by the domain weights, which live in the advantage).

    Examples:
        >>> lp = torch.log(torch.tensor([[[0.5, 0.5]]]))
        >>> loss, _ = topk_distill_loss(lp, lp, torch.tensor([[[1.0, -2.0]]]), torch.tensor([[True]]))
        >>> float(loss)
        1.0
    """
    _check_clip(clip_low, clip_high, dual_clip)
    for name, x in (("logp_k", logp_k), ("logp_old_k", logp_old_k), ("advantages_k", advantages_k)):
        check_float(name, x, ndim=3)
    check_same_shape("logp_k", logp_k, logp_old_k=logp_old_k, advantages_k=advantages_k)
    check_mask("mask", mask, logp_k.shape[:2])
    check_nonempty_mask("mask", mask)
    check_finite("advantages_k", zero_off_mask(advantages_k.detach(), mask))
    for name, x in (("logp_k", logp_k), ("logp_old_k", logp_old_k)):
        check_finite(name, x, mask.unsqueeze(-1).expand_as(x))
    lr = zero_off_mask(logp_k - logp_old_k, mask).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(lr)
    loss, clipped, dual = ppo_clip_objective(
        ratio, advantages_k.detach(), clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    return _masked_with_diagnostics(
        loss.sum(-1), clipped.float().mean(-1), dual.float().mean(-1), lr.mean(-1), ratio.mean(-1), mask
    )
