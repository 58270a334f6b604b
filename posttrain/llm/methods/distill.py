r"""Distillation methods as `Algorithm` bundles (docs: methods/opd_then_rl.md, methods/opd2.md, LLM lift).

**OPD-then-RL** (`opd_then_rl_algorithm`, ``algorithm.method: opd_then_rl``). The bundle at step $s$ (counted from 1) is a pure function of $s$
and of the validation scores logged so far: while the OPD phase holds it declares ``logp_teacher``
and its advantage is `opd_then_rl_advantages` with the OPD
signal $d_t = \ell^T_t - \ell^{old}_t$; after the switch it declares no teacher (the trainer runs
no teacher forward) and the same estimator returns GRPO's group-normalised advantage. One optimiser
and one PPO-clip loss throughout, as in the paper. The switch is either a fixed step
(``switch_step``: OPD for steps $1..S$, `opd_phase`) or
the validation-score rule ``switch_rule: plateau``: the step after the first evaluation at which
`plateau_switch_step` (``window``, ``min_gain``) finds a
plateau in the scores the trainer passes (``logging.eval_metric`` every ``logging.eval_every`` steps).
The rule only reads a prefix of the score history and its answer never changes once given, so the
switch is permanent. Every step logs ``opd_then_rl/teacher_phase`` (1 in the OPD phase, 0 after).
Reference: Li, Chen, Yang, Nie, Zhao, Ye 2026, Sequential Beats Joint (arXiv:2609.04108).

**ExOPD** (`exopd_algorithm`, ``algorithm.method: exopd``): PPO-clip on the per-token reward
`exopd_advantages`
$s[\lambda(\ell^*-\ell^{ref})-(\ell^{old}-\ell^{ref})]$ with the rollout-time student
log-prob $\ell^{old}$. It declares ``logp_teacher`` (``model.teacher``) and ``logp_ref``;
the paper's (docs: methods/opd2.md) reference is the teacher-base, set with ``model.reference`` (default: the initial
policy). Token-mean aggregation as in the paper (docs: methods/opd2.md) toy.

**OPD²** (`opd2_algorithm`, ``algorithm.method: opd2``): PPO-clip on
`opd2_advantages` (centred delta teacher-minus-teacher-base,
sign-gated by the centred OPD advantage, scale 0.1). It declares the student's top-K support
``topk_ids`` (K = ``algorithm.topk``, the sampled id forced in) and the ``[B, T, K]`` log-probs of
student, teacher (``model.teacher``) and teacher-base (``model.reference``) on it, filled by
`posttrain.llm.methods.topk` with one batched no-grad forward per model. The sampled-token
log-probs of the three models are the support column holding the sampled id
(`sampled_on_support`), so no further forward runs; the
student's values come from the trainer-side forward at fill time (the PPO ratio keeps the engine's
``logp_old``). Token-mean aggregation. Simplification: the teacher and teacher-base score the
student's prompt ids (one tokenizer and no per-model chat template, unlike docs: methods/opd2.md).
Reference: Heo, Hwang, Yun, Han 2026, On-Policy Delta Distillation (arXiv:2607.15161).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import (
    AggregationMode,
    eos_teacher_mask,
    exopd_advantages,
    group_normalized_advantages,
    opd2_advantages,
    opd_then_rl_advantages,
    opd_token_advantages,
)
from posttrain.estimators.advantages import sampled_on_support
from posttrain.estimators.selection import opd_phase, plateau_switch_step
from posttrain.llm.methods.algorithm import GRPO, Algorithm, ClipOptions, UpdateContext, preset_algorithm
from posttrain.llm.methods.needs import Need
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.typed import Range

__all__ = [
    "OPD2_NEEDS",
    "ExOpdOptions",
    "Opd2Options",
    "OpdThenRlOptions",
    "exopd_algorithm",
    "opd2_algorithm",
    "opd_then_rl_algorithm",
]

OPD2_NEEDS = frozenset({Need.TOPK_IDS, Need.TOPK_LOGP_OLD, Need.TOPK_LOGP_TEACHER, Need.TOPK_LOGP_REF})
"""The batch fields OPD² declares besides ``logp_old``."""


def _ppo_clip(horizon: int, aggregation: AggregationMode, o: ClipOptions) -> Algorithm:
    """The GRPO preset with the given aggregation and clip range: the loss every bundle here shares."""
    return preset_algorithm(
        GRPO,
        horizon=horizon,
        aggregation=AggregationMode(aggregation).value,
        loss_options={"clip_low": o.clip_low, "clip_high": o.clip_high},
    )


@dataclass(frozen=True)
class OpdThenRlOptions(ClipOptions):
    """``algorithm.options`` of ``opd_then_rl``: exactly one of ``switch_step`` (OPD for steps ``1..switch_step``)
    and ``switch_rule: plateau`` (OPD until `plateau_switch_step` with ``window`` and ``min_gain`` finds a plateau
    in the validation scores); ``mask_final_token``: no teacher signal on the final ``<eos>``."""

    switch_step: Annotated[int, Range(0, 10**8)] | None = None
    switch_rule: Literal["plateau"] | None = None
    window: Annotated[int, Range(1, 10**6)] = 10
    min_gain: float = 0.005
    aggregation: AggregationMode = AggregationMode.SEQ_MEAN_TOKEN_MEAN
    mask_final_token: bool = False

    def check(self) -> None:
        if (self.switch_step is None) == (self.switch_rule is None):
            raise DomainError(
                f"switch_step: give exactly one of switch_step and switch_rule ('plateau'), got "
                f"{self.switch_step!r}, {self.switch_rule!r}"
            )


@dataclass(frozen=True)
class ExOpdOptions(ClipOptions):
    """``algorithm.options`` of ``exopd``: the reward extrapolation ``lam`` (1: OPD for any reference) and ``scale``."""

    lam: float = 1.25
    scale: Annotated[float, Range(0.0, None, low_open=True)] = 0.1
    aggregation: AggregationMode = AggregationMode.TOKEN_MEAN


@dataclass(frozen=True)
class Opd2Options(ClipOptions):
    """``algorithm.options`` of ``opd2`` (docs: methods/opd2.md defaults; ``use_delta``/``center``/``condition``
    are the paper's ablations)."""

    scale: Annotated[float, Range(0.0, None, low_open=True)] = 0.1
    bias: float = 0.0
    use_delta: bool = True
    center: bool = True
    condition: bool = True
    aggregation: AggregationMode = AggregationMode.TOKEN_MEAN


Hook = Callable[[RolloutBatch, Any, UpdateContext], tuple[RolloutBatch, Any, dict[str, Tensor]]]


def _phase_metric(teacher: bool) -> Hook:
    """A ``before_update`` hook that leaves the batch alone and logs ``opd_then_rl/teacher_phase``."""
    value = torch.tensor(1.0 if teacher else 0.0)

    def hook(batch: RolloutBatch, state: Any, ctx: UpdateContext) -> tuple[RolloutBatch, Any, dict[str, Tensor]]:
        return batch, state, {"opd_then_rl/teacher_phase": value}

    return hook


def opd_then_rl_algorithm(horizon: int, options: OpdThenRlOptions) -> Algorithm:
    """The OPD-then-RL bundle: OPD, then GRPO from the switch on (options: `OpdThenRlOptions`).

    Examples:
        >>> alg = opd_then_rl_algorithm(8, OpdThenRlOptions(switch_step=2))
        >>> sorted(map(str, alg.at(2).needs)), sorted(map(str, alg.at(3).needs))
        (['logp_old', 'logp_teacher'], ['logp_old'])
        >>> rule = opd_then_rl_algorithm(8, OpdThenRlOptions(switch_rule="plateau", window=1, min_gain=0.05))
        >>> [sorted(map(str, rule.at(9, scores).needs)) for scores in ((0.1, 0.3), (0.1, 0.3, 0.31))]
        [['logp_old', 'logp_teacher'], ['logp_old']]
    """
    switch_step, window, min_gain, mask_final_token = (
        options.switch_step, options.window, options.min_gain, options.mask_final_token
    )  # fmt: skip
    grpo = _ppo_clip(horizon, options.aggregation, options)

    def last_opd_step(step: int, scores: tuple[float, ...]) -> int:
        """``switch_step``, or for the rule ``step`` (still OPD) / ``step - 1`` (switched): the phase is all that matters."""
        if switch_step is not None:
            return int(switch_step)
        plateau = plateau_switch_step(torch.tensor(scores, dtype=torch.float64), window=window, min_gain=min_gain)
        return step if plateau is None else step - 1

    def at(step: int, scores: tuple[float, ...] = ()) -> Algorithm:
        switch = last_opd_step(step, scores)
        teacher = opd_phase(step, switch)

        def advantage(batch: RolloutBatch) -> Tensor:
            opd = None
            if teacher:
                assert batch.logp_teacher is not None and batch.logp_old is not None  # declared in `needs`
                tm = eos_teacher_mask(batch.mask) if mask_final_token else None
                opd = opd_token_advantages(batch.logp_teacher, batch.logp_old, batch.mask, teacher_mask=tm)
            return opd_then_rl_advantages(
                group_normalized_advantages(batch.grouped_rewards()).reshape(-1),
                opd,
                batch.mask,
                step=step,
                switch_step=switch,
            )

        needs = grpo.needs | ({Need.LOGP_TEACHER} if teacher else set())
        return dataclasses.replace(grpo, advantage=advantage, needs=needs, before_update=_phase_metric(teacher))

    union = grpo.needs | ({Need.LOGP_TEACHER} if switch_step is None or switch_step > 0 else set())
    return dataclasses.replace(at(1), needs=union, schedule=at)


def exopd_algorithm(horizon: int, options: ExOpdOptions | None = None) -> Algorithm:
    """The ExOPD bundle (``lam`` = 1.25 and ``scale`` = 0.1 as in the paper (docs: methods/opd2.md); options:
    `ExOpdOptions`).

    Examples:
        >>> sorted(map(str, exopd_algorithm(8).needs))
        ['logp_old', 'logp_ref', 'logp_teacher']
    """
    o = options or ExOpdOptions()
    lam, scale = o.lam, o.scale
    base = _ppo_clip(horizon, o.aggregation, o)

    def advantage(batch: RolloutBatch) -> Tensor:
        assert batch.logp_old is not None and batch.logp_teacher is not None and batch.logp_ref is not None
        return exopd_advantages(batch.logp_old, batch.logp_teacher, batch.logp_ref, batch.mask, lam=lam, scale=scale)

    return dataclasses.replace(base, advantage=advantage, needs=base.needs | {Need.LOGP_TEACHER, Need.LOGP_REF})


def opd2_algorithm(horizon: int, options: Opd2Options | None = None) -> Algorithm:
    """The OPD² bundle (options: `Opd2Options`).

    Examples:
        >>> sorted(map(str, opd2_algorithm(8).needs))
        ['logp_old', 'topk_ids', 'topk_logp_old', 'topk_logp_ref', 'topk_logp_teacher']
    """
    o = options or Opd2Options()
    base = _ppo_clip(horizon, o.aggregation, o)
    advantage_options: dict[str, Any] = {
        "scale": o.scale, "bias": o.bias, "use_delta": o.use_delta, "center": o.center, "condition": o.condition
    }  # fmt: skip

    def advantage(batch: RolloutBatch) -> Tensor:
        ids, ls_k, lt_k, lb_k = batch.topk_ids, batch.topk_logp_old, batch.topk_logp_teacher, batch.topk_logp_ref
        assert ids is not None and ls_k is not None and lt_k is not None and lb_k is not None  # declared in `needs`
        ls, lt, lb = (sampled_on_support(x, ids, batch.response_ids, batch.mask) for x in (ls_k, lt_k, lb_k))
        return opd2_advantages(ls, lt, lb, ls_k, lt_k, lb_k, batch.mask, **advantage_options)

    return dataclasses.replace(base, advantage=advantage, needs=base.needs | OPD2_NEEDS)
