"""Diagnostics of the methods: quantities a paper reports about its own mechanism.

- `inversion_rate`: the fraction of above-mean rollouts whose advantage is not positive
  (advantage inversion by an injected oracle row; Li et al. 2026, arXiv:2608.20492);
- `topk_overlap`, `sign_conflict_rate`: agreement of student and teacher top-K sets, and of an
  update with the OPD update (Li et al. 2026, arXiv:2609.04108);
- `headroom_recovery`: the share of the gap to a reference score that a method closes
  (Gao et al. 2026, arXiv:2608.19098).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators._numerics import zero_off_mask
from posttrain.shapes import Bool, Float
from posttrain.validate import (
    check_float,
    check_mask,
    check_same_shape,
)

__all__ = ["headroom_recovery", "inversion_rate", "sign_conflict_rate", "topk_overlap"]


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


def headroom_recovery(score: Tensor, init: Tensor, reference: Tensor) -> Tensor:
    r"""Headroom recovery $(s - s_0)/(s_{ref} - s_0)$; raises where reference == init.

    Examples:
        >>> float(headroom_recovery(torch.tensor(0.5), torch.tensor(0.0), torch.tensor(1.0)))
        0.5
    """
    gap = reference - init
    if bool((gap == 0).any()):
        raise DomainError("reference: recovery is undefined where reference == init")
    return (score - init) / gap


def inversion_rate(
    rewards: Float[Tensor, "*S G n"],
    policy_advantages: Float[Tensor, "*S G n"],
    keep: Bool[Tensor, "*S G n"] | None = None,
) -> Float[Tensor, "*S"]:
    r"""Fraction of (kept) policy rows with $c_i = r_i - \mu_\pi > 0$ whose advantage is $\le 0$.

    Reduces over the last two axes (groups and rows), so leading (method, seed) axes give one
    rate each. Returns 0 where no row has $c_i > 0$.

    Examples:
        >>> from posttrain.estimators.advantages.oracle import naive_injection_advantages
        >>> r = torch.tensor([[0.2] * 7 + [0.28]])
        >>> float(inversion_rate(r, naive_injection_advantages(r, torch.ones(1))[:, :-1]))
        1.0
    """
    check_float("rewards", rewards, ndim=(2, 3, 4))
    check_float("policy_advantages", policy_advantages)
    if policy_advantages.shape != rewards.shape:
        raise ShapeError(
            f"policy_advantages: expected shape {list(rewards.shape)}, got {list(policy_advantages.shape)}"
        )
    c = rewards - rewards.mean(-1, keepdim=True)
    candidates = c > 0 if keep is None else (c > 0) & check_mask("keep", keep, rewards.shape)
    inverted = candidates & (policy_advantages <= 0)
    return inverted.sum((-2, -1)).to(rewards.dtype) / candidates.sum((-2, -1)).clamp(min=1).to(rewards.dtype)
