r"""Phase and coefficient schedules of the distillation rules (Li et al. 2026, arXiv:2609.04108).

KDRL's annealed $\beta$ (`kdrl_annealed_beta`), the OPD-then-RL phase (`opd_phase`) and the
plateau rule that picks the switch step from validation scores (`plateau_switch_step`);
registered in ``SCHEDULES``. The rules themselves are `posttrain.estimators.advantages.rules`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.registry import Registry, registry
from posttrain.shapes import Float
from posttrain.validate import (
    check_float,
)

__all__ = ["SCHEDULES", "kdrl_annealed_beta", "opd_phase", "plateau_switch_step"]


_PAPER = "Li et al. 2026, Sequential Beats Joint, arXiv:2609.04108"

SCHEDULES: Registry[Any] = registry("schedule")


@SCHEDULES.register("kdrl_annealing_beta", paper=_PAPER)
def kdrl_annealed_beta(step: int, total_steps: int, *, beta_start: float = 0.2, beta_end: float = 0.002) -> float:
    r"""Linear KDRL-annealing weight: $\beta(1)=\beta_{start}$, $\beta(N)=\beta_{end}$, clamped outside.

    $$
    \beta(s) = (1-f)\,\beta_{start} + f\,\beta_{end},\qquad f = \frac{\mathrm{clip}(s,1,N)-1}{\max(N-1,1)}
    $$

    Examples:
        >>> kdrl_annealed_beta(1, 3), kdrl_annealed_beta(3, 3)
        (0.2, 0.002)
    """
    if int(total_steps) < 1:
        raise DomainError(f"total_steps: expected an integer >= 1, got {total_steps!r}")
    frac = (min(max(int(step), 1), int(total_steps)) - 1) / max(int(total_steps) - 1, 1)
    return float(beta_start) * (1.0 - frac) + float(beta_end) * frac


@SCHEDULES.register("opd_then_rl_phase", paper=_PAPER)
def opd_phase(step: int, switch_step: int) -> bool:
    """True while OPD-then-RL is in its OPD phase (``step <= switch_step``; steps count from 1).

    ``switch_step = 0`` is pure GRPO, ``switch_step >= N_total`` pure OPD. The trainer asks this
    before the teacher forward, so no teacher pass runs after the switch.

    Examples:
        >>> opd_phase(60, 60), opd_phase(61, 60)
        (True, False)
    """
    if int(switch_step) < 0:
        raise DomainError(f"switch_step: expected an integer >= 0, got {switch_step!r}")
    return int(step) <= int(switch_step)


@SCHEDULES.register("plateau_switch", paper=_PAPER)
def plateau_switch_step(val_scores: Float[Tensor, " N"], *, window: int = 10, min_gain: float = 0.005) -> int | None:
    r"""The switch rule driven by the validation score: the end of the fast-improvement phase.

    ``val_scores[i]`` is the OPD validation score after step ``i`` (index 0 may be the initial
    policy). With window gains $\Delta_i = v_i - v_{i-w}$, the rule returns the first index
    $i$ with $\Delta_i <$ ``min_gain`` *after* some earlier $\Delta_{i'} \ge$
    ``min_gain`` (a plateau that follows a rise, not the flat start of a curve), or None while the
    curve is still rising (keep OPD). Switch after step ``i`` when index 0 is the initial policy. A pure function of the score history. *Reconstructed*: the
    paper picks S by inspecting curves; docs: methods/opd_then_rl.md suggests ``window=10, min_gain=0.5pp``.

    Examples:
        >>> plateau_switch_step(torch.tensor([0.1, 0.1, 0.3, 0.5, 0.51, 0.512]), window=1, min_gain=0.05)
        4
    """
    check_float("val_scores", val_scores, ndim=1)
    w = int(window)
    if w < 1:
        raise DomainError(f"window: expected an integer >= 1, got {window!r}")
    if val_scores.shape[0] <= w:
        return None
    gains = val_scores[w:] - val_scores[:-w]
    rising = (gains >= float(min_gain)).cumsum(0) > 0
    hit = torch.nonzero(
        (gains < float(min_gain)) & torch.roll(rising, 1) & (torch.arange(gains.shape[0]) > 0)
    ).flatten()
    return None if hit.numel() == 0 else int(hit[0]) + w
