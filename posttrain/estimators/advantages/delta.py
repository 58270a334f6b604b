r"""OPD²: on-policy distillation of the delta teacher-minus-teacher-base, and the ExOPD baseline.

Per position, with student top-K support columns (``[B, T, K]``, K = top-k size) and the
sampled token (``[B, T]``), all log-probs full-vocab normalised at the same temperature:

$$
R^{OPD}_t = \ell^*_t - \ell^\theta_t,\qquad R^{\Delta}_t = \ell^*_t - \ell^{base}_t,
$$

$$
A^{OPD}_t = R^{OPD}_t - \sum_k p_k(\ell^*_k - \ell^\theta_k),\qquad
A^{\Delta}_t = R^{\Delta}_t - \sum_k p_k(\ell^*_k - \ell^{base}_k),
$$

$$
A^{D^2}_t = A^\Delta_t\,[A^\Delta_t A^{OPD}_t > 0]\quad(\times\,0.1,\ \text{minus a bias})
$$

with $p_k = e^{\ell^\theta_k}$ the student's full-vocab probabilities (not renormalised over
K). Everything is detached. ExOPD: $\lambda(\ell^*-\ell^{ref}) - (\ell^\theta-\ell^{ref})$.

References: Heo, Hwang, Yun, Han 2026, On-Policy Delta Distillation (arXiv:2607.15161);
ExOPD / G-OPD reward extrapolation (arXiv:2602.12125).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators._numerics import computes_in_float32, zero_off_mask
from posttrain.estimators._registry import register_advantage
from posttrain.shapes import Bool, Float, Int
from posttrain.validate import (
    check_finite,
    check_float,
    check_mask,
    check_nonempty_mask,
    check_positive,
    check_same_shape,
    check_tensor,
    value_checks_enabled,
)

__all__ = [
    "centered_advantage",
    "exopd_advantages",
    "opd2_advantages",
    "sampled_on_support",
    "student_expectation",
    "tempered_log_softmax",
    "topk_support",
]

_PAPER = "Heo et al. 2026, On-Policy Delta Distillation, arXiv:2607.15161"


def tempered_log_softmax(logits: Float[Tensor, "B T V"], *, tau: float = 0.7) -> Float[Tensor, "B T V"]:
    r"""Full-vocab $\log\mathrm{softmax}(z/\tau)$ in float32 or wider (same τ for all three models).

    Examples:
        >>> round(float(tempered_log_softmax(torch.zeros(1, 1, 4), tau=0.7)[0, 0, 0].exp()), 4)
        0.25
    """
    check_float("logits", logits)
    tau = check_positive("tau", tau)
    z = logits if logits.dtype == torch.float64 else logits.float()
    return torch.log_softmax(z / tau, dim=-1)


def topk_support(logp_student: Float[Tensor, "B T V"], sampled: Int[Tensor, "B T"], *, k: int) -> Int[Tensor, "B T K"]:
    """The student's top-``k`` ids per position, the sampled id forced into the last column if absent.

    Examples:
        >>> lp = torch.log(torch.tensor([[[0.5, 0.3, 0.15, 0.05]]]))
        >>> topk_support(lp, torch.tensor([[3]]), k=2).tolist()
        [[[0, 3]]]
    """
    check_float("logp_student", logp_student, ndim=3)
    check_tensor("sampled", sampled, ndim=2)
    if tuple(sampled.shape) != tuple(logp_student.shape[:2]):
        raise ShapeError(f"sampled: expected shape {list(logp_student.shape[:2])}, got {list(sampled.shape)}")
    if not 1 <= int(k) <= logp_student.shape[-1]:
        raise DomainError(f"k: expected an integer in [1, {logp_student.shape[-1]}], got {k!r}")
    ids = logp_student.topk(int(k), dim=-1).indices
    present = (ids == sampled.unsqueeze(-1)).any(-1, keepdim=True)
    last = torch.where(present, ids[..., -1:], sampled.unsqueeze(-1))
    return torch.cat([ids[..., :-1], last], dim=-1)


def sampled_on_support(
    values_k: Float[Tensor, "B T K"],
    topk_ids: Int[Tensor, "B T K"],
    sampled: Int[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
) -> Float[Tensor, "B T"]:
    """The column of ``values_k`` whose id is the sampled token (`topk_support` puts it in the support).

    Raises:
        DomainError: the sampled id is missing from ``topk_ids`` at a valid (mask=True) position.

    Examples:
        >>> ids = torch.tensor([[[0, 3], [1, 2]]])
        >>> sampled_on_support(torch.tensor([[[-0.5, -2.0], [-1.0, -0.7]]]), ids, torch.tensor([[3, 1]]),
        ...                    torch.tensor([[True, True]])).tolist()
        [[-2.0, -1.0]]
    """
    check_float("values_k", values_k, ndim=3)
    check_tensor("topk_ids", topk_ids, ndim=3)
    check_tensor("sampled", sampled, ndim=2)
    if tuple(topk_ids.shape) != tuple(values_k.shape):
        raise ShapeError(
            f"topk_ids: expected shape {list(values_k.shape)} (the shape of values_k), got {list(topk_ids.shape)}"
        )
    check_mask("mask", mask, values_k.shape[:2])
    if tuple(sampled.shape) != tuple(values_k.shape[:2]):
        raise ShapeError(f"sampled: expected shape {list(values_k.shape[:2])}, got {list(sampled.shape)}")
    hit = topk_ids == sampled.unsqueeze(-1)
    if not bool(hit.any(-1)[mask].all()):
        raise DomainError("topk_ids: the sampled id must be in the support at every valid position (see topk_support)")
    return values_k.gather(-1, hit.int().argmax(-1, keepdim=True)).squeeze(-1)


def student_expectation(
    logp_student_k: Float[Tensor, "B T K"], values_k: Float[Tensor, "B T K"]
) -> Float[Tensor, "B T"]:
    r"""$\sum_k e^{\ell^\theta_k} x_k$: top-K expectation under the student, weights not renormalised.

    Examples:
        >>> float(student_expectation(torch.log(torch.tensor([[[0.5, 0.25]]])), torch.tensor([[[2.0, 4.0]]])))
        2.0
    """
    check_float("logp_student_k", logp_student_k, ndim=3)
    check_same_shape("logp_student_k", logp_student_k, values_k=values_k)
    return (logp_student_k.exp() * values_k).sum(-1)


def centered_advantage(
    reward: Float[Tensor, "B T"], logp_student_k: Float[Tensor, "B T K"], reward_k: Float[Tensor, "B T K"]
) -> Float[Tensor, "B T"]:
    r"""Centred token advantage $R_t - \sum_k p_k R_k$ (the student's expected reward is subtracted)."""
    check_float("reward", reward, ndim=2)
    if tuple(reward.shape) != tuple(logp_student_k.shape[:2]):
        raise ShapeError(f"reward: expected shape {list(logp_student_k.shape[:2])}, got {list(reward.shape)}")
    return reward - student_expectation(logp_student_k, reward_k)


@register_advantage("opd2", paper=_PAPER)
@computes_in_float32
def opd2_advantages(
    logp_student: Float[Tensor, "B T"],
    logp_teacher: Float[Tensor, "B T"],
    logp_base: Float[Tensor, "B T"],
    logp_student_k: Float[Tensor, "B T K"],
    logp_teacher_k: Float[Tensor, "B T K"],
    logp_base_k: Float[Tensor, "B T K"],
    mask: Bool[Tensor, "B T"],
    *,
    scale: float = 0.1,
    bias: float = 0.0,
    use_delta: bool = True,
    center: bool = True,
    condition: bool = True,
) -> Float[Tensor, "B T"]:
    r"""OPD² per-token advantage (delta signal, student-centred, sign-gated by the centred OPD advantage).

    $$
    A_t = s\,\big(A^{\Delta}_t\,[A^\Delta_t A^{OPD}_t > 0] - b\big)\,m_t
    $$

    Ablations by flag: ``use_delta=False`` uses $A^{OPD}$ itself ("no delta" = centred OPD);
    ``condition=False`` drops the gate ("no condition"); ``center=False`` uses the uncentred
    $R^\Delta$ gated by $\operatorname{sign}(R^\Delta A^{OPD})$ ("no centering").
    Non-finite values become 0.

    Args:
        logp_student, logp_teacher, logp_base: ``[B, T]`` log-probs of the sampled token under
            the student, the teacher $\pi^*$ and the teacher-base $\pi^*_{base}$.
        logp_student_k, logp_teacher_k, logp_base_k: ``[B, T, K]`` log-probs on the student's
            top-K ids (`topk_support`).
        mask: ``[B, T]`` boolean. scale: the global reward scale (0.1). bias: ``rewards_bias`` (0).

    Returns:
        ``[B, T]`` detached advantages, 0 off the mask.

    Examples:
        >>> ls = torch.log(torch.tensor([[[0.5, 0.5]]]))
        >>> lt = torch.log(torch.tensor([[[0.8, 0.2]]]))
        >>> lb = torch.log(torch.tensor([[[0.5, 0.5]]]))
        >>> m = torch.tensor([[True]])
        >>> round(float(opd2_advantages(ls[..., 0], lt[..., 0], lb[..., 0], ls, lt, lb, m, scale=1.0)), 4)
        0.6931
    """
    for name, x in (("logp_student", logp_student), ("logp_teacher", logp_teacher), ("logp_base", logp_base)):
        check_float(name, x, ndim=2)
    check_same_shape("logp_student", logp_student, logp_teacher=logp_teacher, logp_base=logp_base)
    for name, x in (
        ("logp_student_k", logp_student_k),
        ("logp_teacher_k", logp_teacher_k),
        ("logp_base_k", logp_base_k),
    ):
        check_float(name, x, ndim=3)
    check_same_shape("logp_student_k", logp_student_k, logp_teacher_k=logp_teacher_k, logp_base_k=logp_base_k)
    if tuple(logp_student_k.shape[:2]) != tuple(logp_student.shape):
        raise ShapeError(
            f"logp_student_k: expected shape [{', '.join(map(str, logp_student.shape))}, K], got {list(logp_student_k.shape)}"
        )
    check_mask("mask", mask, logp_student.shape)
    check_nonempty_mask("mask", mask)
    for name, x in (("logp_student", logp_student), ("logp_teacher", logp_teacher), ("logp_base", logp_base)):
        check_finite(name, x, mask)
    for name, x in (
        ("logp_student_k", logp_student_k),
        ("logp_teacher_k", logp_teacher_k),
        ("logp_base_k", logp_base_k),
    ):
        if value_checks_enabled() and bool((torch.isnan(x.detach()) | (x.detach() == torch.inf))[mask].any()):
            raise DomainError(f"{name}: expected log-probs (finite or -inf) on valid positions, found NaN or +inf")
    ls, lt, lb = logp_student.detach(), logp_teacher.detach(), logp_base.detach()
    ls_k, lt_k, lb_k = logp_student_k.detach(), logp_teacher_k.detach(), logp_base_k.detach()
    a_opd = centered_advantage(lt - ls, ls_k, lt_k - ls_k)
    if not use_delta:
        signal = a_opd
    elif center:
        signal = centered_advantage(lt - lb, ls_k, lt_k - lb_k)
    else:
        signal = lt - lb
    if condition and use_delta:
        signal = torch.where(signal * a_opd > 0, signal, torch.zeros_like(signal))
    out = float(scale) * (signal - float(bias))
    out = torch.where(torch.isfinite(out), out, torch.zeros_like(out))
    return zero_off_mask(out, mask)


@register_advantage("exopd", paper="ExOPD / G-OPD reward extrapolation, arXiv:2602.12125")
@computes_in_float32
def exopd_advantages(
    logp_student: Float[Tensor, "B T"],
    logp_teacher: Float[Tensor, "B T"],
    logp_ref: Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    lam: float = 1.25,
    scale: float = 0.1,
) -> Float[Tensor, "B T"]:
    r"""ExOPD per-token reward $s\,[\lambda(\ell^*-\ell^{ref}) - (\ell^\theta-\ell^{ref})]$ (detached).

    ``lam = 1`` gives the OPD reward $s(\ell^*-\ell^\theta)$ for any reference; the paper's (docs: methods/opd2.md)
    default reference is the teacher-base.

    Examples:
        >>> z = torch.zeros(1, 1)
        >>> float(exopd_advantages(z, torch.ones(1, 1), z, torch.tensor([[True]]), scale=1.0))
        1.25
    """
    for name, x in (("logp_student", logp_student), ("logp_teacher", logp_teacher), ("logp_ref", logp_ref)):
        check_float(name, x, ndim=2)
    check_same_shape("logp_student", logp_student, logp_teacher=logp_teacher, logp_ref=logp_ref)
    check_mask("mask", mask, logp_student.shape)
    check_nonempty_mask("mask", mask)
    for name, x in (("logp_student", logp_student), ("logp_teacher", logp_teacher), ("logp_ref", logp_ref)):
        check_finite(name, x, mask)
    ls, lt, lr = logp_student.detach(), logp_teacher.detach(), logp_ref.detach()
    return zero_off_mask(float(scale) * (float(lam) * (lt - lr) - (ls - lr)), mask)
