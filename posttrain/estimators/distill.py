r"""On-policy distillation (OPD) signals from teacher log-probs, and distillation diagnostics.

The per-token OPD advantage is the sampled-token reverse-KL estimator
$d_t = \log\pi_T(y_t\mid h_t) - \log\pi_{old}(y_t\mid h_t)$ (detached); summed over t and
averaged over student samples it is $-\mathrm{KL}(\pi_\theta\|\pi_T)$ at sequence level.
Full-distribution (``[B, T, V]``) and top-k (``[B, T, K]``) forms give the same quantity as an
exact expectation over the student's next-token distribution (or its top-k part).

Shapes: ``[B, T]`` token tensors with a boolean ``mask``; ``[B, T, V]`` full log-prob tables;
``[B, T, K]`` top-k columns (here ``K`` is the top-k support size, as in docs: methods/open_mopd.md, methods/opd2.md).
The combination rules of the paper (docs: methods/opd_then_rl.md) (KDRL, SRPO, RLSD, OPD-then-RL, ...) live in
`posttrain.estimators.distill_rules`; the losses that take the teacher inside the loss (TRRD,
and OPD / KDRL for the LLM trainer) in `posttrain.estimators.distill_losses`.

References: Agarwal et al. 2024, On-policy distillation (GKD, arXiv:2306.13649); Li et al. 2026,
Sequential Beats Joint (arXiv:2609.04108).
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators._numerics import computes_in_float32, zero_off_mask
from posttrain.estimators._registry import register_advantage
from posttrain.validate import (
    check_finite,
    check_float,
    check_mask,
    check_nonempty_mask,
    check_positive,
    check_same_shape,
    value_checks_enabled,
)

__all__ = [
    "eos_teacher_mask",
    "full_reverse_kl",
    "opd_token_advantages",
    "sign_conflict_rate",
    "topk_overlap",
    "topk_reverse_kl",
    "topk_reverse_kl_reward",
    "zero_off_mask",
]

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


def topk_overlap(
    logp_student: Float[Tensor, "B T V"], logp_teacher: Float[Tensor, "B T V"], *, k: int
) -> tuple[Float[Tensor, "B T"], Float[Tensor, "B T"]]:
    r"""Top-K overlap diagnostic of the paper (docs: methods/opd_then_rl.md): $|\Omega_K|/K$ and the shared student mass.

    $\Omega_K$ is the intersection of the student's and the teacher's top-K next-token sets;
    the shared mass is $\sum_{y\in\Omega_K} p_S(y)$.

    Returns:
        ``(overlap_ratio [B, T], shared_mass [B, T])``.

    Examples:
        >>> ls = torch.log(torch.tensor([[[0.6, 0.3, 0.1]]]))
        >>> lt = torch.log(torch.tensor([[[0.1, 0.3, 0.6]]]))
        >>> [round(float(x), 4) for x in topk_overlap(ls, lt, k=2)]
        [0.5, 0.3]
    """
    check_float("logp_student", logp_student, ndim=(2, 3))
    check_same_shape("logp_student", logp_student, logp_teacher=logp_teacher)
    v = logp_student.shape[-1]
    if not 1 <= int(k) <= v:
        raise DomainError(f"k: expected an integer in [1, {v}], got {k!r}")
    s_top = torch.zeros_like(logp_student, dtype=torch.bool).scatter(-1, logp_student.topk(k, -1).indices, True)
    t_top = torch.zeros_like(logp_teacher, dtype=torch.bool).scatter(-1, logp_teacher.topk(k, -1).indices, True)
    both = s_top & t_top
    ratio = both.sum(-1).to(logp_student.dtype) / k
    shared = zero_off_mask(logp_student.exp(), both).sum(-1)
    return ratio, shared


def sign_conflict_rate(delta: Float[Tensor, " D"], delta_opd: Float[Tensor, " D"], *, top_fraction: float) -> Tensor:
    r"""Sign-conflict rate of a parameter update against the OPD update (docs: methods/opd_then_rl.md).

    $$
    S_K = \text{top-}K\%\text{ indices by }|\Delta\theta^{OPD}|,\qquad
                  \mathrm{SCR} = \frac{|\{i\in S_K: \mathrm{sgn}\,\Delta\theta_i \ne
                  \mathrm{sgn}\,\Delta\theta^{OPD}_i\}|}{|S_K|}
    $$

    Args:
        delta: ``[D]`` flattened update of the method, $\theta^m - \theta^{base}$.
        delta_opd: ``[D]`` flattened OPD update.
        top_fraction: K as a fraction in (0, 1].

    Returns:
        0-d tensor in [0, 1].

    Examples:
        >>> float(sign_conflict_rate(torch.tensor([1., -1., 1.]), torch.tensor([2., 1., -0.1]), top_fraction=2 / 3))
        0.5
    """
    check_float("delta", delta, ndim=1)
    check_same_shape("delta", delta, delta_opd=delta_opd)
    if not 0.0 < float(top_fraction) <= 1.0:
        raise DomainError(f"top_fraction: expected a value in (0, 1], got {top_fraction!r}")
    n = max(1, round(float(top_fraction) * delta.shape[0]))
    idx = delta_opd.abs().topk(n).indices
    conflict = torch.sign(delta[idx]) != torch.sign(delta_opd[idx])
    return conflict.to(delta.dtype).mean()
