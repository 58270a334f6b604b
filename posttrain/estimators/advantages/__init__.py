"""Advantages: what each sampled token or sequence is credited with.

| module | |
| --- | --- |
| `group` | group baselines: GRPO, Dr.GRPO, RLOO, and their spread over tokens |
| `returns` | REINFORCE++ token returns with batch whitening |
| `oracle` | one oracle (annotation) row per group without advantage inversion, and the naive injection baseline |
| `teacher` | on-policy distillation token advantages from teacher log-probs |
| `delta` | delta-distillation advantages (teacher minus reference, on the student's top-K support) |
| `rules` | the distillation combination rules (KDRL, SRPO, HDPO, RLSD, OPD-then-RL) |
| `trace_weights` | trace weights of the Tsallis loss continuum (GARL, PAFT) |
"""

from __future__ import annotations

from posttrain.estimators.advantages.delta import (
    centered_advantage,
    exopd_advantages,
    opd2_advantages,
    sampled_on_support,
    student_expectation,
    tempered_log_softmax,
    topk_support,
)
from posttrain.estimators.advantages.group import (
    broadcast_sequence_advantages,
    drgrpo_advantages,
    group_normalized_advantages,
    group_rewards,
    rloo_advantages,
)
from posttrain.estimators.advantages.oracle import (
    OracleMode,
    OraRLAdvantages,
    naive_injection_advantages,
    orarl_advantages,
    orarl_oracle_advantage,
    orarl_policy_advantages,
    post_selection_correction,
    sign_balanced_selection,
)
from posttrain.estimators.advantages.returns import reinforce_pp_advantages, reinforce_pp_baseline_advantages
from posttrain.estimators.advantages.rules import (
    additive_distill_advantages,
    correctness_flags,
    hdpo_advantages,
    kdrl_advantages,
    kdrl_annealing_advantages,
    kdrl_mask_advantages,
    opd_then_rl_advantages,
    rlsd_advantages,
    srpo_advantages,
)
from posttrain.estimators.advantages.teacher import eos_teacher_mask, opd_token_advantages
from posttrain.estimators.advantages.trace_weights import (
    TsallisWeights,
    garl_advantages,
    garl_weights,
    log_mean_weight,
    paft_advantages,
    paft_weights,
    tsallis_token_weights,
)

__all__ = [
    "OraRLAdvantages",
    "OracleMode",
    "TsallisWeights",
    "additive_distill_advantages",
    "broadcast_sequence_advantages",
    "centered_advantage",
    "correctness_flags",
    "drgrpo_advantages",
    "eos_teacher_mask",
    "exopd_advantages",
    "garl_advantages",
    "garl_weights",
    "group_normalized_advantages",
    "group_rewards",
    "hdpo_advantages",
    "kdrl_advantages",
    "kdrl_annealing_advantages",
    "kdrl_mask_advantages",
    "log_mean_weight",
    "naive_injection_advantages",
    "opd2_advantages",
    "opd_then_rl_advantages",
    "opd_token_advantages",
    "orarl_advantages",
    "orarl_oracle_advantage",
    "orarl_policy_advantages",
    "paft_advantages",
    "paft_weights",
    "post_selection_correction",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "rlsd_advantages",
    "sampled_on_support",
    "sign_balanced_selection",
    "srpo_advantages",
    "student_expectation",
    "tempered_log_softmax",
    "topk_support",
    "tsallis_token_weights",
]
