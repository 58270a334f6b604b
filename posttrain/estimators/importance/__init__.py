"""Importance corrections between the current and the behaviour policy.

| module | |
| --- | --- |
| `ratios` | token and sequence log-ratios |
| `acceptance` | the token-level rejection test of selective importance sampling and its effective behaviour log-probs |
| `correction` | rollout correction: truncated or masked token / sequence importance weights between the trainer's and the engine's log-probs |
"""

from __future__ import annotations

from posttrain.estimators.importance.acceptance import (
    sis_accept,
    sis_acceptance_prob,
    sis_divergence,
    sis_logp_old,
    sis_rejection_test,
    token_in_topk,
)
from posttrain.estimators.importance.correction import (
    CorrectionMode,
    RolloutCorrection,
    correction_statistics,
    rollout_correction_weights,
)
from posttrain.estimators.importance.ratios import LOG_RATIO_CLAMP, log_ratio, sequence_log_ratio

__all__ = [
    "LOG_RATIO_CLAMP",
    "CorrectionMode",
    "RolloutCorrection",
    "correction_statistics",
    "log_ratio",
    "rollout_correction_weights",
    "sequence_log_ratio",
    "sis_accept",
    "sis_acceptance_prob",
    "sis_divergence",
    "sis_logp_old",
    "sis_rejection_test",
    "token_in_topk",
]
