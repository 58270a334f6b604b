r"""On-policy distillation (OPD) token advantages from teacher log-probs.

The per-token OPD advantage is the sampled-token reverse-KL estimator
$d_t = \log\pi_T(y_t\mid h_t) - \log\pi_{old}(y_t\mid h_t)$ (detached); summed over t and
averaged over student samples it is $-\mathrm{KL}(\pi_\theta\|\pi_T)$ at sequence level. The exact
and top-K forms of the same quantity are in `posttrain.estimators.divergences.reverse_kl`; the
rules that combine it with RL advantages in `posttrain.estimators.advantages.rules`; the losses
that take the teacher inside the loss in `posttrain.estimators.losses.teacher`.

References: Agarwal et al. 2024, On-policy distillation (GKD, arXiv:2306.13649); Li et al. 2026,
Sequential Beats Joint (arXiv:2609.04108).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators._numerics import computes_in_float32, zero_off_mask
from posttrain.estimators._registry import register_advantage
from posttrain.shapes import Bool, Float
from posttrain.validate import (
    check_finite,
    check_float,
    check_mask,
    check_nonempty_mask,
    check_same_shape,
    value_checks_enabled,
)

__all__ = ["eos_teacher_mask", "opd_token_advantages"]


_OPD_PAPER = "Agarwal et al. 2024, GKD, arXiv:2306.13649; Li et al. 2026, arXiv:2609.04108"


def eos_teacher_mask(mask: Bool[Tensor, "B T"]) -> Bool[Tensor, "B T"]:
    """``mask`` with the last valid position of every row set to False (the paper's (docs: methods/opd_then_rl.md) EOS rule).

    Teacher and base student often use different EOS tokens, so the teacher's log-prob of the
    student's EOS is meaningless; teacher terms are zeroed there.

    Examples:
        >>> eos_teacher_mask(torch.tensor([[True, True, False], [True, True, True]])).tolist()
        [[True, False, False], [True, True, False]]
    """
    if mask.ndim != 2:
        raise ShapeError(f"mask: expected rank 2, got shape {list(mask.shape)}")
    check_mask("mask", mask, mask.shape)
    t = mask.shape[-1]
    pos = torch.arange(t, device=mask.device).expand_as(mask)
    last = torch.where(mask, pos, torch.full_like(pos, -1)).amax(dim=-1, keepdim=True)
    return mask & (pos != last)


@register_advantage("opd", paper=_OPD_PAPER)
@computes_in_float32
def opd_token_advantages(
    logp_teacher: Float[Tensor, "B T"],
    logp_old: Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    teacher_mask: Bool[Tensor, "B T"] | None = None,
) -> Float[Tensor, "B T"]:
    r"""Per-token OPD advantage $d_t = \log\pi_T(y_t) - \log\pi_{old}(y_t)$ (detached).

    $$
    d_{it} = m^{T}_{it}\,\big(\ell^{T}_{it} - \ell^{old}_{it}\big)
    $$

    with $m^T$ = ``teacher_mask`` (default ``mask``; use `eos_teacher_mask` for the
    docs: methods/opd_then_rl.md EOS rule). Positions outside the teacher mask are exactly 0.

    Args:
        logp_teacher: ``[B, T]`` teacher log-prob of the student's sampled token.
        logp_old: ``[B, T]`` rollout-time student log-prob of that token.
        mask: ``[B, T]`` boolean response mask.
        teacher_mask: ``[B, T]`` boolean, a subset of ``mask``; None means ``mask``.

    Returns:
        ``[B, T]`` advantages without gradient.

    Raises:
        ShapeError: wrong ranks/shapes/dtypes.
        DomainError: non-finite log-probs on the mask, or a
            ``teacher_mask`` that is not a subset of ``mask``.

    Examples:
        >>> lt = torch.log(torch.tensor([[0.5, 0.25]]))
        >>> lo = torch.log(torch.tensor([[0.25, 0.25]]))
        >>> [round(x, 4) for x in opd_token_advantages(lt, lo, torch.tensor([[True, True]]))[0].tolist()]
        [0.6931, 0.0]
    """
    check_float("logp_teacher", logp_teacher, ndim=2)
    check_float("logp_old", logp_old, ndim=2)
    check_same_shape("logp_old", logp_old, logp_teacher=logp_teacher)
    check_mask("mask", mask, logp_old.shape)
    check_nonempty_mask("mask", mask)
    tm = mask if teacher_mask is None else check_mask("teacher_mask", teacher_mask, mask.shape)
    if value_checks_enabled() and teacher_mask is not None and bool((tm & ~mask).any()):
        raise DomainError("teacher_mask: expected a subset of mask, found positions outside the response")
    d = logp_teacher.detach() - logp_old.detach()  # the one [B, T] allocation; masked in place below
    d = zero_off_mask(d, tm, inplace=True)
    return check_finite("logp_teacher - logp_old", d)
