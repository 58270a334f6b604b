r"""How RL and on-policy distillation are combined: every rule of Table 1 of Li et al. (2026).

All rules return per-token advantages ``[B, T]`` from the group advantage $\hat A$
(``[G, K]`` or ``[B]``, e.g. `group_normalized_advantages`) and the
OPD signal $d$ (``[B, T]``, `opd_token_advantages`):

| rule | paradigm | advantage $A_t$ (ratio $r$ unless noted) |
| --- | --- | --- |
| GRPO | -- | $\hat A$ |
| OPD | -- | $d_t$ |
| KDRL | additive | $\hat A + \beta d_t$ |
| KDRL-mask | additive | $\hat A + (1-c)\beta d_t$ |
| SRPO | additive | $c\hat A + (1-c) d_t$ |
| HDPO | additive | $\hat A + C(x)\beta d_t$ |
| TRRD | modulate | $\hat A$, ratio $r^\alpha e^{-(1-\alpha)d_t}$ (`posttrain.estimators.losses.teacher.trrd_loss`) |
| RLSD | modulate | $((1-\lambda)+\lambda\,\mathrm{clip}(e^{\mathrm{sgn}(\hat A)d_t}))\hat A$ |
| KDRL-annealing | scheduling | $\hat A + \beta(\text{step}) d_t$ |
| OPD-then-RL | scheduling | $d_t$ if step $\le S$ else $\hat A$ |

$c$ is the correct-rollout flag, $C(x)$ the all-wrong-group flag
(`correctness_flags`). Schedules are pure functions of step counters and validation scores
(registry kind ``"schedule"``); nothing here keeps state.

Reference: Li, Chen, Yang, Nie, Zhao, Ye 2026, Sequential Beats Joint (arXiv:2609.04108).
RLSD's clip is to $[1-\epsilon_R, 1+\epsilon_R]$.
(† SRPO, HDPO, RLSD are self-distillation methods there; only the combination rule is kept.)
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators._numerics import computes_in_float32, zero_off_mask
from posttrain.estimators._registry import register_advantage
from posttrain.estimators.advantages.group import broadcast_sequence_advantages
from posttrain.estimators.selection.schedules import kdrl_annealed_beta, opd_phase
from posttrain.shapes import Bool, Float
from posttrain.validate import (
    check_finite,
    check_float,
    check_in_range,
    check_mask,
    check_nonempty_mask,
    check_positive,
    check_same_shape,
    check_tensor,
)

__all__ = [
    "additive_distill_advantages",
    "correctness_flags",
    "hdpo_advantages",
    "kdrl_advantages",
    "kdrl_annealing_advantages",
    "kdrl_mask_advantages",
    "opd_then_rl_advantages",
    "rlsd_advantages",
    "srpo_advantages",
]


_PAPER = "Li et al. 2026, Sequential Beats Joint, arXiv:2609.04108"


def correctness_flags(
    rewards: Float[Tensor, "G K"], *, correct_value: float = 1.0
) -> tuple[Bool[Tensor, "G K"], Bool[Tensor, "G K"]]:
    """``(c, C)``: rollout is correct (``R == correct_value``) and its group has no correct rollout.

    Examples:
        >>> c, C = correctness_flags(torch.tensor([[1., 0.], [0., 0.]]))
        >>> c.tolist(), C.tolist()
        ([[True, False], [False, False]], [[False, False], [True, True]])
    """
    check_float("rewards", rewards, ndim=2)
    c = rewards == correct_value
    return c, (~c.any(dim=-1, keepdim=True)).expand_as(c)


def _rule_inputs(seq_advantages: Tensor, opd: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Validate and return ``(A_hat [B, T] broadcast over mask, d [B, T] zero off mask)``."""
    check_float("opd", opd, ndim=2)
    check_tensor("mask", mask, ndim=2)
    check_same_shape("mask", mask, opd=opd)
    check_mask("mask", mask, opd.shape)
    check_nonempty_mask("mask", mask)
    check_float("seq_advantages", seq_advantages, ndim=(1, 2))
    if seq_advantages.numel() != opd.shape[0]:
        raise ShapeError(
            f"seq_advantages: expected {opd.shape[0]} entries (one per row of opd), got {list(seq_advantages.shape)}"
        )
    check_finite("opd", opd, mask)
    check_finite("seq_advantages", seq_advantages)
    return broadcast_sequence_advantages(seq_advantages, mask), zero_off_mask(opd, mask)


def _check_flag(name: str, flag: Tensor, rows: int) -> Tensor:
    """A ``[B]`` (or ``[G, K]``) boolean flag with one entry per row; ShapeError naming it otherwise."""
    check_tensor(name, flag)
    if flag.dtype != torch.bool:
        raise ShapeError(f"{name}: expected dtype torch.bool, got {flag.dtype}")
    if flag.numel() != rows:
        raise ShapeError(f"{name}: expected {rows} entries (one per row), got {list(flag.shape)}")
    return flag


def _row_flag(name: str, flag: Tensor, rows: int, dtype: torch.dtype) -> Tensor:
    """A ``[B]`` bool (or ``[G, K]``) flag as a ``[B, 1]`` float column."""
    return _check_flag(name, flag, rows).reshape(-1, 1).to(dtype)


def additive_distill_advantages(
    seq_advantages: Float[Tensor, " B"] | Float[Tensor, "G K"],
    opd: Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    beta: float,
    rl_gate: Bool[Tensor, " B"] | None = None,
    opd_gate: Bool[Tensor, " B"] | None = None,
) -> Float[Tensor, "B T"]:
    r"""The weighted-additive family $A_t = u\,\hat A + \beta\,w\,d_t$ (u, w row gates in {0, 1}).

    KDRL: u = w = 1. KDRL-mask: w = 1 - c. SRPO: u = c, w = 1 - c, $\beta = 1$. HDPO: w = C(x).

    Args:
        seq_advantages: ``[B]`` or ``[G, K]`` group advantages $\hat A$.
        opd: ``[B, T]`` OPD signal $d$.
        mask: ``[B, T]`` boolean response mask.
        beta: OPD weight $\beta \ge 0$.
        rl_gate, opd_gate: ``[B]`` (or ``[G, K]``) boolean gates u and w; None means all ones.

    Returns:
        ``[B, T]`` advantages, 0 off the mask.

    Examples:
        >>> m = torch.ones(2, 1, dtype=torch.bool)
        >>> additive_distill_advantages(torch.tensor([1., -1.]), torch.tensor([[-2.], [-2.]]), m, beta=0.5).tolist()
        [[0.0], [-2.0]]
    """
    a_hat, d = _rule_inputs(seq_advantages, opd, mask)
    beta = check_positive("beta", beta, strict=False)
    rows = d.shape[0]
    u = 1.0 if rl_gate is None else _row_flag("rl_gate", rl_gate, rows, d.dtype)
    w = 1.0 if opd_gate is None else _row_flag("opd_gate", opd_gate, rows, d.dtype)
    return u * a_hat + (beta * w) * d


@register_advantage("kdrl", paper=_PAPER)
@computes_in_float32
def kdrl_advantages(seq_advantages: Tensor, opd: Tensor, mask: Tensor, *, beta: float = 0.2) -> Tensor:
    r"""KDRL: $A_t = \hat A + \beta d_t$ (weighted-additive; can flip the sign of $\hat A$).

    Examples:
        >>> kdrl_advantages(torch.tensor([0.5]), torch.tensor([[-5.0]]), torch.tensor([[True]])).tolist()
        [[-0.5]]
    """
    return additive_distill_advantages(seq_advantages, opd, mask, beta=beta)


@register_advantage("kdrl_mask", paper=_PAPER)
@computes_in_float32
def kdrl_mask_advantages(
    seq_advantages: Tensor, opd: Tensor, mask: Tensor, correct: Tensor, *, beta: float = 0.2
) -> Tensor:
    r"""KDRL-mask: $A_t = \hat A + (1-c)\beta d_t$ (OPD only on incorrect rollouts).

    Examples:
        >>> m = torch.ones(2, 1, dtype=torch.bool)
        >>> c = torch.tensor([True, False])
        >>> kdrl_mask_advantages(torch.tensor([1., -1.]), torch.full((2, 1), -1.), m, c).tolist()
        [[1.0], [-1.2000000476837158]]
    """
    a_hat, _ = _rule_inputs(seq_advantages, opd, mask)
    _check_flag("correct", correct, a_hat.shape[0])
    return additive_distill_advantages(seq_advantages, opd, mask, beta=beta, opd_gate=~correct)


@register_advantage("srpo", paper=_PAPER)
@computes_in_float32
def srpo_advantages(seq_advantages: Tensor, opd: Tensor, mask: Tensor, correct: Tensor) -> Tensor:
    r"""SRPO rule: $A_t = c\hat A + (1-c)d_t$ (RL on correct rollouts, OPD on the rest).

    Examples:
        >>> m = torch.ones(2, 1, dtype=torch.bool)
        >>> srpo_advantages(torch.tensor([1., -1.]), torch.full((2, 1), -0.3), m, torch.tensor([True, False])).tolist()
        [[1.0], [-0.30000001192092896]]
    """
    a_hat, _ = _rule_inputs(seq_advantages, opd, mask)
    _check_flag("correct", correct, a_hat.shape[0])
    return additive_distill_advantages(seq_advantages, opd, mask, beta=1.0, rl_gate=correct, opd_gate=~correct)


@register_advantage("hdpo", paper=_PAPER)
@computes_in_float32
def hdpo_advantages(
    seq_advantages: Tensor, opd: Tensor, mask: Tensor, all_wrong: Tensor, *, beta: float = 0.2
) -> Tensor:
    r"""HDPO rule: $A_t = \hat A + C(x)\beta d_t$ (OPD only in all-wrong groups).

    Examples:
        >>> m = torch.ones(2, 1, dtype=torch.bool)
        >>> hdpo_advantages(torch.zeros(2), torch.full((2, 1), -1.), m, torch.tensor([True, False]), beta=0.5).tolist()
        [[-0.5], [0.0]]
    """
    a_hat, _ = _rule_inputs(seq_advantages, opd, mask)
    _check_flag("all_wrong", all_wrong, a_hat.shape[0])
    return additive_distill_advantages(seq_advantages, opd, mask, beta=beta, opd_gate=all_wrong)


@register_advantage("rlsd", paper=_PAPER)
@computes_in_float32
def rlsd_advantages(
    seq_advantages: Tensor, opd: Tensor, mask: Tensor, *, lam: float = 1.0, eps_r: float = 0.2
) -> Tensor:
    r"""RLSD rule: teacher-modulated magnitude, never a sign change.

    $$
    A_t = \Big((1-\lambda) + \lambda\,\mathrm{clip}\big(e^{\operatorname{sign}(\hat A)\,d_t},
                  1-\epsilon_R, 1+\epsilon_R\big)\Big)\,\hat A
    $$

    The multiplier lies in $[1-\lambda\epsilon_R, 1+\lambda\epsilon_R] \subset (0, \infty)$.

    Args:
        lam: $\lambda \in [0, 1]$. eps_r: $\epsilon_R \in (0, 1)$.

    Examples:
        >>> m = torch.ones(2, 1, dtype=torch.bool)
        >>> rlsd_advantages(torch.tensor([1.0, -1.0]), torch.tensor([[1.0], [1.0]]), m).tolist()
        [[1.2000000476837158], [-0.800000011920929]]
    """
    a_hat, d = _rule_inputs(seq_advantages, opd, mask)
    lam = check_in_range("lam", lam, 0.0, 1.0)
    eps_r = check_in_range("eps_r", eps_r, 0.0, 1.0, closed=False)
    factor = torch.exp(torch.sign(a_hat) * d).clamp(1.0 - eps_r, 1.0 + eps_r)
    return ((1.0 - lam) + lam * factor) * a_hat


@register_advantage("kdrl_annealing", paper=_PAPER)
@computes_in_float32
def kdrl_annealing_advantages(
    seq_advantages: Tensor,
    opd: Tensor,
    mask: Tensor,
    *,
    step: int,
    total_steps: int,
    beta_start: float = 0.2,
    beta_end: float = 0.002,
) -> Tensor:
    r"""KDRL-annealing: $A_t = \hat A + \beta(\text{step})\,d_t$ with `kdrl_annealed_beta`.

    Examples:
        >>> m = torch.ones(1, 1, dtype=torch.bool)
        >>> kdrl_annealing_advantages(torch.zeros(1), -torch.ones(1, 1), m, step=1, total_steps=10).tolist()
        [[-0.20000000298023224]]
    """
    beta = kdrl_annealed_beta(step, total_steps, beta_start=beta_start, beta_end=beta_end)
    return additive_distill_advantages(seq_advantages, opd, mask, beta=beta)


@register_advantage("opd_then_rl", paper=_PAPER)
@computes_in_float32
def opd_then_rl_advantages(
    seq_advantages: Tensor, opd: Tensor | None, mask: Tensor, *, step: int, switch_step: int
) -> Tensor:
    r"""OPD-then-RL: $A_t = d_t$ for step $\le S$, else $\hat A$ (one optimiser throughout).

    ``opd`` may be None after the switch (no teacher forward is needed then); it is required in the
    OPD phase.

    Examples:
        >>> m = torch.ones(1, 1, dtype=torch.bool)
        >>> opd_then_rl_advantages(torch.ones(1), -torch.ones(1, 1), m, step=1, switch_step=1).tolist()
        [[-1.0]]
        >>> opd_then_rl_advantages(torch.ones(1), None, m, step=2, switch_step=1).tolist()
        [[1.0]]
    """
    if opd_phase(step, switch_step):
        if opd is None:
            raise DomainError(f"opd: required in the OPD phase (step {step} <= switch_step {switch_step}), got None")
        return _rule_inputs(seq_advantages, opd, mask)[1]
    check_float("seq_advantages", seq_advantages, ndim=(1, 2))
    return broadcast_sequence_advantages(seq_advantages, mask)
