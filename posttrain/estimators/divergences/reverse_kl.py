"""Reverse KL between a student and a teacher: exact over the vocabulary, or on the student's top-K support.

Shapes: ``[B, T, V]`` full log-prob tables; ``[B, T, K]`` top-K columns (here ``K`` is the top-K
support size) with a boolean ``mask [B, T]``. The sampled-token estimator of the same quantity is
`posttrain.estimators.advantages.teacher.opd_token_advantages`.

References: Agarwal et al. 2024 (GKD, arXiv:2306.13649); Gao et al. 2026, Open-MOPD (arXiv:2608.19098).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators._numerics import computes_in_float32, zero_off_mask
from posttrain.shapes import Bool, Float
from posttrain.validate import (
    check_finite,
    check_float,
    check_mask,
    check_nonempty_mask,
    check_positive,
    check_same_shape,
    value_checks_enabled,
)

__all__ = ["full_reverse_kl", "topk_reverse_kl", "topk_reverse_kl_reward"]


@computes_in_float32
def full_reverse_kl(logp_student: Float[Tensor, "B T V"], logp_teacher: Float[Tensor, "B T V"]) -> Float[Tensor, "B T"]:
    r"""Exact per-position reverse KL $\sum_v \pi_\theta(v)(\ell^\theta_v-\ell^T_v)$.

    Gradients flow through ``logp_student`` (the analytic OPD / OPSD loss); detach it for a
    signal. Entries with $\pi_\theta(v)=0$ contribute 0 even if the teacher puts
    $-\infty$ there.

    Args:
        logp_student, logp_teacher: ``[..., V]`` normalised log-probabilities.

    Returns:
        ``[...]`` (usually ``[B, T]``) non-negative KL values in nats.

    Raises:
        ShapeError: non-float or mismatched inputs. DomainError (value checks on): the teacher's
            log-prob is $-\infty$ where the student's probability is positive (the KL is
            $+\infty$), or a NaN where the student's probability is positive.

    Examples:
        >>> ls = torch.log(torch.tensor([[[0.5, 0.5]]]))
        >>> lt = torch.log(torch.tensor([[[0.75, 0.25]]]))
        >>> round(float(full_reverse_kl(ls, lt)), 4)
        0.1438
    """
    check_float("logp_student", logp_student, ndim=(2, 3))
    check_float("logp_teacher", logp_teacher)
    check_same_shape("logp_student", logp_student, logp_teacher=logp_teacher)
    p = logp_student.exp()
    kl = (p * zero_off_mask(logp_student - logp_teacher, p > 0)).sum(-1)
    if value_checks_enabled() and not bool(torch.isfinite(kl.detach()).all()):
        check_finite("logp_student", torch.where(p > 0, logp_student, 0.0))  # NaN; -inf is probability 0
        if bool(((logp_teacher == -torch.inf) & (p > 0)).any()):
            raise DomainError(
                "logp_teacher: the teacher gives probability 0 (log-prob -inf) to a token the student can "
                "sample; the reverse KL is infinite there"
            )
        check_finite("logp_teacher", torch.where(p > 0, logp_teacher, 0.0))
    return kl


def topk_reverse_kl_reward(
    logp_student_k: Float[Tensor, "B T K"],
    logp_teacher_k: Float[Tensor, "B T K"],
    mask: Bool[Tensor, "B T"],
) -> Float[Tensor, "B T K"]:
    r"""Per-candidate top-k OPD reward with renormalised student weights (Open-MOPD form).

    $$
    \tilde p_k = \operatorname{softmax}_{k\le K}(\ell^S_k),\qquad
                  r_{t,k} = \operatorname{sg}\big[(\ell^T_k - \ell^S_k)\,\tilde p_k\big]\,m_t
    $$

    $\sum_k r_{t,k}$ is minus the top-K reverse KL estimate; for K = V it is exactly
    $-\mathrm{KL}(p_S\|p_T)$.

    Args:
        logp_student_k: ``[B, T, K]`` student log-probs on its top-K ids (full-vocab normalised).
        logp_teacher_k: ``[B, T, K]`` teacher log-probs on the same ids and prefixes.
        mask: ``[B, T]`` boolean.

    Returns:
        ``[B, T, K]`` detached rewards, 0 off the mask.

    References:
        Gao et al. 2026, Open-MOPD (arXiv:2608.19098).

    Examples:
        >>> ls = torch.log(torch.tensor([[[0.5, 0.5]]]))
        >>> lt = torch.log(torch.tensor([[[0.75, 0.25]]]))
        >>> round(float(topk_reverse_kl_reward(ls, lt, torch.tensor([[True]])).sum()), 4)
        -0.1438
    """
    check_float("logp_student_k", logp_student_k, ndim=3)
    check_float("logp_teacher_k", logp_teacher_k, ndim=3)
    check_same_shape("logp_student_k", logp_student_k, logp_teacher_k=logp_teacher_k)
    check_mask("mask", mask, logp_student_k.shape[:2])
    check_nonempty_mask("mask", mask)
    ls = logp_student_k.detach()
    weights = torch.softmax(ls, dim=-1)
    reward = zero_off_mask((logp_teacher_k.detach() - ls) * weights, mask)
    return check_finite("topk reward", reward)


def topk_reverse_kl(
    logp_student_k: Float[Tensor, "B T K"],
    logp_teacher_k: Float[Tensor, "B T K"],
    mask: Bool[Tensor, "B T"],
    *,
    chunk_size: int = 16384,
) -> Float[Tensor, "B T"]:
    r"""Top-K reverse-KL estimate $\sum_k \tilde p_k(\ell^S_k-\ell^T_k)$ per position (detached, 0 off mask).

    Equal to ``-topk_reverse_kl_reward(...).sum(-1)`` but computed ``chunk_size`` positions at a
    time, so the ``[B, T, K]`` intermediates never exist at once (memory-bound otherwise).

    Examples:
        >>> ls = torch.log(torch.tensor([[[0.5, 0.5]]]))
        >>> lt = torch.log(torch.tensor([[[0.75, 0.25]]]))
        >>> round(float(topk_reverse_kl(ls, lt, torch.tensor([[True]]))), 4)
        0.1438
    """
    check_float("logp_student_k", logp_student_k, ndim=3)
    check_float("logp_teacher_k", logp_teacher_k, ndim=3)
    check_same_shape("logp_student_k", logp_student_k, logp_teacher_k=logp_teacher_k)
    check_mask("mask", mask, logp_student_k.shape[:2])
    check_nonempty_mask("mask", mask)
    size = int(check_positive("chunk_size", chunk_size))
    k = logp_student_k.shape[-1]
    ls, lt = logp_student_k.detach().reshape(-1, k), logp_teacher_k.detach().reshape(-1, k)
    out = torch.empty(ls.shape[0], dtype=torch.result_type(ls, lt), device=ls.device)
    for a, b, o in zip(ls.split(size), lt.split(size), out.split(size), strict=True):
        diff = torch.sub(a, b)  # chunk-sized temporaries only; the product is formed in place
        torch.sum(diff.mul_(torch.softmax(a, -1)), -1, out=o)
    kl = zero_off_mask(out.reshape(mask.shape), mask, inplace=True)
    return check_finite("topk reverse KL", kl)
