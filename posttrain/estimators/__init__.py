"""Pure torch estimators: advantages, ratios, policy losses, aggregation, KL, entropy, pass@k.

Token tensors are ``[B, T]`` with a boolean response ``mask [B, T]``; sequence rewards ``[B]``;
grouped rewards ``[G, K]`` (see :mod:`posttrain.shapes`). Every function here is pure: no hidden
state, no global RNG, no config objects.
"""

from posttrain.estimators._registry import (
    ADVANTAGES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    get_advantage,
    get_kl,
    get_policy_loss,
    register_advantage,
    register_kl,
    register_policy_loss,
)
from posttrain.estimators.advantages import (
    broadcast_sequence_advantages,
    drgrpo_advantages,
    group_normalized_advantages,
    group_rewards,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from posttrain.estimators.aggregate import (
    AggregationMode,
    aggregate,
    masked_mean,
    masked_sum,
    masked_whiten,
)
from posttrain.estimators.entropy import token_entropy
from posttrain.estimators.kl import k1_kl, k2_kl, k3_kl, straight_through
from posttrain.estimators.losses import ClipDiagnostics, clipped_ratio_loss, gspo_loss, ppo_clip_objective
from posttrain.estimators.passk import mean_at_k, pass_at_k
from posttrain.estimators.ratios import log_ratio, sequence_log_ratio

__all__ = [
    "ADVANTAGES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "AggregationMode",
    "ClipDiagnostics",
    "aggregate",
    "broadcast_sequence_advantages",
    "clipped_ratio_loss",
    "drgrpo_advantages",
    "get_advantage",
    "get_kl",
    "get_policy_loss",
    "group_normalized_advantages",
    "group_rewards",
    "gspo_loss",
    "k1_kl",
    "k2_kl",
    "k3_kl",
    "log_ratio",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "mean_at_k",
    "pass_at_k",
    "ppo_clip_objective",
    "register_advantage",
    "register_kl",
    "register_policy_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "sequence_log_ratio",
    "straight_through",
    "token_entropy",
]
