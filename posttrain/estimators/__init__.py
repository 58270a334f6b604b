"""Pure torch estimators: advantages, ratios, policy losses, aggregation, KL, entropy, pass@k.

Token tensors are ``[B, T]`` with a boolean response ``mask [B, T]``; sequence rewards ``[B]``;
grouped rewards ``[G, K]`` (see `posttrain.shapes`). Every function here is pure: no hidden
state, no global RNG, no config objects.
"""

from posttrain.estimators._numerics import zero_off_mask
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
    "zero_off_mask",
]

# --- distillation and mixed-signal methods (issue 5: docs: methods/opd_then_rl.md, methods/self_routing.md, methods/orarl.md, methods/open_mopd.md, methods/opd2.md) ---
from posttrain.estimators import delta_distill, distill, distill_losses, distill_rules, mopd, orarl, routing
from posttrain.estimators.delta_distill import exopd_advantages, opd2_advantages
from posttrain.estimators.distill import (
    eos_teacher_mask,
    full_reverse_kl,
    opd_token_advantages,
    topk_reverse_kl,
    topk_reverse_kl_reward,
)
from posttrain.estimators.distill_losses import opd_policy_loss, trrd_loss
from posttrain.estimators.distill_rules import (
    kdrl_advantages,
    opd_then_rl_advantages,
    rlsd_advantages,
)
from posttrain.estimators.orarl import naive_injection_advantages, orarl_advantages
from posttrain.estimators.routing import self_routing_probabilities

__all__ += [
    "delta_distill",
    "distill",
    "distill_losses",
    "distill_rules",
    "eos_teacher_mask",
    "exopd_advantages",
    "full_reverse_kl",
    "kdrl_advantages",
    "mopd",
    "naive_injection_advantages",
    "opd2_advantages",
    "opd_policy_loss",
    "opd_then_rl_advantages",
    "opd_token_advantages",
    "orarl",
    "orarl_advantages",
    "rlsd_advantages",
    "routing",
    "self_routing_probabilities",
    "topk_reverse_kl",
    "topk_reverse_kl_reward",
    "trrd_loss",
]

# --- off-policy, replay, distribution matching, rollout allocation (issue 6: docs: methods/hdr.md, methods/rail.md, methods/gflowrl.md, methods/sis.md) ---
from posttrain.estimators import gflowrl, rail, replay, sis  # noqa: E402
from posttrain.estimators.gflowrl import (  # noqa: E402
    flow_gap,
    flowrl_loss,
    flowrl_optimal_log_z,
    gflowrl_loss,
    mc_log_partition,
)
from posttrain.estimators.rail import (  # noqa: E402
    controller_init,
    controller_predict,
    controller_update,
    plan_interventions,
    recoverability_gain,
)
from posttrain.estimators.replay import headroom, policy_drift, replay_add, replay_init, replay_select  # noqa: E402
from posttrain.estimators.sis import (  # noqa: E402
    no_correction_loss,
    sis_accept,
    sis_acceptance_prob,
    sis_logp_old,
    sis_loss,
    truncated_is_loss,
)

__all__ += [
    "controller_init",
    "controller_predict",
    "controller_update",
    "flow_gap",
    "flowrl_loss",
    "flowrl_optimal_log_z",
    "gflowrl",
    "gflowrl_loss",
    "headroom",
    "mc_log_partition",
    "no_correction_loss",
    "plan_interventions",
    "policy_drift",
    "rail",
    "recoverability_gain",
    "replay",
    "replay_add",
    "replay_init",
    "replay_select",
    "sis",
    "sis_accept",
    "sis_acceptance_prob",
    "sis_logp_old",
    "sis_loss",
    "truncated_is_loss",
]

# --- Tsallis loss continuum: GARL / PAFT (paper 20) ---
from posttrain.estimators.tsallis import (  # noqa: E402
    TsallisWeights,
    garl_advantages,
    garl_loss,
    garl_weights,
    log_mean_weight,
    paft_advantages,
    paft_loss,
    paft_weights,
)

__all__ += [
    "TsallisWeights",
    "garl_advantages",
    "garl_loss",
    "garl_weights",
    "log_mean_weight",
    "paft_advantages",
    "paft_loss",
    "paft_weights",
]

# evolution strategies and sample-based coverage metrics (papers 05, 10)
from posttrain.estimators.coverage import accuracy_bins, answer_entropy, majority_vote_correct  # noqa: E402
from posttrain.estimators.es import (  # noqa: E402
    REWARD_SHAPINGS,
    EsPopulation,
    EsState,
    EvolutionStrategy,
    antithetic_gradient,
    antithetic_population,
    centered_rank_rewards,
    es_direction,
    es_gradient,
    es_step,
    evolution_strategy,
    noise_chunks,
    perturbed_params,
    population_noise,
    relative_drift,
    seeded_noise,
    shape_rewards,
    tensor_seed,
    threshold_update,
    update_sparsity,
    zscore_rewards,
)

__all__ += [
    "REWARD_SHAPINGS",
    "EsPopulation",
    "EsState",
    "EvolutionStrategy",
    "accuracy_bins",
    "answer_entropy",
    "antithetic_gradient",
    "antithetic_population",
    "centered_rank_rewards",
    "es_direction",
    "es_gradient",
    "es_step",
    "evolution_strategy",
    "majority_vote_correct",
    "noise_chunks",
    "perturbed_params",
    "population_noise",
    "relative_drift",
    "seeded_noise",
    "shape_rewards",
    "tensor_seed",
    "threshold_update",
    "update_sparsity",
    "zscore_rewards",
]

# Paper 09: path-space estimators for diffusion / flow models; paper 06: the entropy lens.
from posttrain.estimators.entropy_lens import EntropyLens, domain_means, entropy_lens  # noqa: E402
from posttrain.estimators.path_space import (  # noqa: E402
    VALUE_GRADIENTS,
    Curvature,
    KDEValueGradient,
    awm_loss,
    bounded_weight,
    deterministic_value_gradient,
    elbo_weight,
    girsanov_log_weights,
    girsanov_template_weights,
    is_scale_bounded,
    ito_policy_gradient,
    kde_value_gradient,
    nft_loss,
    path_score,
    scale_bounded_loss,
    stochastic_value_gradient,
    template_loss,
    value_gradient_policy_gradient,
)

__all__ += [
    "VALUE_GRADIENTS",
    "Curvature",
    "EntropyLens",
    "KDEValueGradient",
    "awm_loss",
    "bounded_weight",
    "deterministic_value_gradient",
    "domain_means",
    "elbo_weight",
    "entropy_lens",
    "girsanov_log_weights",
    "girsanov_template_weights",
    "is_scale_bounded",
    "ito_policy_gradient",
    "kde_value_gradient",
    "nft_loss",
    "path_score",
    "scale_bounded_loss",
    "stochastic_value_gradient",
    "template_loss",
    "value_gradient_policy_gradient",
]

# --- paper 18: DPO per-pair loss (preference_loss registry) ---
from posttrain.estimators.dpo import PREFERENCE_LOSSES, DPODiagnostics, dpo_loss, register_preference_loss  # noqa: E402

__all__ += ["PREFERENCE_LOSSES", "DPODiagnostics", "dpo_loss", "register_preference_loss"]

# --- CISPO (MiniMax-M1, arXiv:2506.13585), a base loss for SIS (docs: methods/sis.md) ---
from posttrain.estimators.losses import CISPO_CLIP_MODES, cispo_loss  # noqa: E402

__all__ += ["CISPO_CLIP_MODES", "cispo_loss"]
