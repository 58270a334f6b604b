"""Per-token policy losses ``(loss [B, T], diagnostics)``, reduced by `posttrain.estimators.aggregate`.

| module | |
| --- | --- |
| `ppo` | the PPO clip objective, the token-ratio loss and GSPO's sequence-ratio loss |
| `cispo` | CISPO: REINFORCE weighted by the clipped, stop-gradient ratio |
| `offpolicy` | off-policy corrected losses: SIS (GRPO and GSPO), truncated IS, no correction |
| `teacher` | losses with the teacher inside: OPD / KDRL, TRRD, per-candidate top-K distillation |
| `routed` | queue-weighted losses over per-prompt routes |
| `flow` | flow-balance losses: GFlowRL and FlowRL, with their partition estimates |
| `preference` | preference (pairwise) losses: DPO |
| `weighted` | weighted log-likelihood surrogates (REINFORCE / SFT weights, GARL, PAFT) |
"""

from __future__ import annotations

from posttrain.estimators.losses.cispo import CISPO_CLIP_MODES, cispo_loss
from posttrain.estimators.losses.flow import (
    FlowGap,
    GFlowRLDiagnostics,
    LengthNorm,
    flow_gap,
    flowrl_loss,
    flowrl_optimal_log_z,
    gflowrl_loss,
    mc_log_partition,
)
from posttrain.estimators.losses.offpolicy import (
    SISDiagnostics,
    no_correction_loss,
    sis_gspo_loss,
    sis_loss,
    truncated_is_loss,
)
from posttrain.estimators.losses.ppo import GSPO_LOG_RATIO_MAX, clipped_ratio_loss, gspo_loss, ppo_clip_objective
from posttrain.estimators.losses.preference import PREFERENCE_LOSSES, DPODiagnostics, dpo_loss, register_preference_loss
from posttrain.estimators.losses.routed import queue_token_weights, routed_loss
from posttrain.estimators.losses.teacher import opd_policy_loss, topk_distill_loss, trrd_loss
from posttrain.estimators.losses.weighted import garl_loss, paft_loss, weighted_logp_loss

__all__ = [
    "CISPO_CLIP_MODES",
    "GSPO_LOG_RATIO_MAX",
    "PREFERENCE_LOSSES",
    "DPODiagnostics",
    "FlowGap",
    "GFlowRLDiagnostics",
    "LengthNorm",
    "SISDiagnostics",
    "cispo_loss",
    "clipped_ratio_loss",
    "dpo_loss",
    "flow_gap",
    "flowrl_loss",
    "flowrl_optimal_log_z",
    "garl_loss",
    "gflowrl_loss",
    "gspo_loss",
    "mc_log_partition",
    "no_correction_loss",
    "opd_policy_loss",
    "paft_loss",
    "ppo_clip_objective",
    "queue_token_weights",
    "register_preference_loss",
    "routed_loss",
    "sis_gspo_loss",
    "sis_loss",
    "topk_distill_loss",
    "trrd_loss",
    "truncated_is_loss",
    "weighted_logp_loss",
]
