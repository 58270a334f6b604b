r"""Distillation methods as :class:`~posttrain.llm.algorithm.Algorithm` bundles (specs 01 and 13, LLM lift).

**OPD-then-RL** (:func:`opd_then_rl_algorithm`, ``algorithm.method: opd_then_rl``). The bundle at step :math:`s` (counted from 1) is a pure function of :math:`s`: while
:func:`~posttrain.estimators.distill_rules.opd_phase` holds (:math:`s \le S`) it declares
``logp_teacher`` and its advantage is :func:`~posttrain.estimators.distill_rules.opd_then_rl_advantages`
with the OPD signal :math:`d_t = \ell^T_t - \ell^{old}_t`; after the switch it declares no teacher
(the trainer runs no teacher forward) and the same estimator returns GRPO's group-normalised
advantage. One optimiser and one PPO-clip loss throughout, as in the paper.

Simplification: the switch is a fixed step (``switch_step``); the validation-score rule
(:func:`~posttrain.estimators.distill_rules.plateau_switch_step`) is not wired into the trainer.
Reference: Li, Chen, Yang, Nie, Zhao, Ye 2026, Sequential Beats Joint (arXiv:2609.04108).

**ExOPD** (:func:`exopd_algorithm`, ``algorithm.method: exopd``): PPO-clip on the per-token reward
:func:`~posttrain.estimators.delta_distill.exopd_advantages`
:math:`s[\lambda(\ell^*-\ell^{ref})-(\ell^{old}-\ell^{ref})]` with the rollout-time student
log-prob :math:`\ell^{old}`. It declares ``logp_teacher`` (``model.teacher``) and ``logp_ref``;
spec 13's reference is the teacher-base, set with ``model.reference`` (default: the initial
policy). Token-mean aggregation as in spec 13's toy. OPD² itself needs the student's top-K ids and
``[B, T, K]`` log-probs of three models, which :class:`~posttrain.llm.batch.RolloutBatch` has no
fields for yet: not lifted.
"""

from __future__ import annotations

import dataclasses

from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import group_normalized_advantages
from posttrain.estimators.delta_distill import exopd_advantages
from posttrain.estimators.distill import eos_teacher_mask, opd_token_advantages
from posttrain.estimators.distill_rules import opd_phase, opd_then_rl_advantages
from posttrain.llm.algorithm import Algorithm, build_algorithm
from posttrain.llm.batch import RolloutBatch

__all__ = ["exopd_algorithm", "opd_then_rl_algorithm"]


def opd_then_rl_algorithm(
    horizon: int,
    *,
    switch_step: int,
    aggregation: str = "seq-mean-token-mean",
    mask_final_token: bool = False,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> Algorithm:
    """The OPD-then-RL bundle: OPD for steps ``1..switch_step``, GRPO after (``algorithm.options``).

    Example:
        >>> alg = opd_then_rl_algorithm(8, switch_step=2)
        >>> sorted(alg.at(2).needs), sorted(alg.at(3).needs)
        (['logp_old', 'logp_teacher'], ['logp_old'])
    """
    if int(switch_step) < 0:
        raise DomainError(f"switch_step: expected an integer >= 0, got {switch_step!r}")
    grpo = build_algorithm(
        method="grpo",
        horizon=horizon,
        aggregation=aggregation,
        loss_options={"clip_low": clip_low, "clip_high": clip_high},
    )

    def at(step: int, scores: tuple[float, ...] = ()) -> Algorithm:
        teacher = opd_phase(step, switch_step)

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
                switch_step=switch_step,
            )

        needs = grpo.needs | ({"logp_teacher"} if teacher else set())
        return dataclasses.replace(grpo, advantage=advantage, needs=needs)

    union = grpo.needs | ({"logp_teacher"} if switch_step > 0 else set())
    return dataclasses.replace(at(1), needs=union, schedule=at)


def exopd_algorithm(
    horizon: int,
    *,
    lam: float = 1.25,
    scale: float = 0.1,
    aggregation: str = "token-mean",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> Algorithm:
    """The ExOPD bundle (``lam`` = 1.25 and ``scale`` = 0.1 as in spec 13; ``lam`` = 1 is OPD for any reference).

    Example:
        >>> sorted(exopd_algorithm(8).needs)
        ['logp_old', 'logp_ref', 'logp_teacher']
    """
    base = build_algorithm(
        method="grpo",
        horizon=horizon,
        aggregation=aggregation,
        loss_options={"clip_low": clip_low, "clip_high": clip_high},
    )

    def advantage(batch: RolloutBatch) -> Tensor:
        assert batch.logp_old is not None and batch.logp_teacher is not None and batch.logp_ref is not None
        return exopd_advantages(batch.logp_old, batch.logp_teacher, batch.logp_ref, batch.mask, lam=lam, scale=scale)

    return dataclasses.replace(base, advantage=advantage, needs=base.needs | {"logp_teacher", "logp_ref"})
