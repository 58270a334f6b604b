"""Pure torch estimators, sorted by the kind of quantity they return.

| package / module | what it returns or does |
| --- | --- |
| `advantages` | advantages: group baselines (GRPO, Dr.GRPO, RLOO), REINFORCE++ returns, the oracle-row advantages, teacher (OPD) token advantages, delta-distillation advantages, the distillation combination rules, trace weights of the Tsallis continuum |
| `losses` | per-token policy losses: PPO clip, GSPO, CISPO, off-policy corrected (SIS, truncated IS), teacher-in-the-loss, routed queues, flow balance (GFlowRL, FlowRL), DPO, weighted log-likelihood |
| `importance` | importance corrections: log-ratios, the SIS acceptance test and its effective behaviour log-probs |
| `divergences` | KL estimators (k1, k2, k3) and full / top-K reverse KL between distributions |
| `aggregation` | reduction of a per-token matrix to a scalar; masked statistics |
| `selection` | what to train on and when: replay rules, rollout interventions and their controller, per-prompt routes, phase schedules |
| `weights` | per-domain and per-row weights of multi-teacher distillation |
| `optim`, `es` | optimiser updates (Muon, AdamW) and evolution strategies, as (init, update) pairs |
| `diffusion` | path-space estimators of diffusion / flow policies |
| `merging` | weight-space edits: spectral projection, TIES, DARE, task arithmetic |
| `metrics` | pass@k, entropies, answer coverage, diagnostics of the methods |

Token tensors are ``[B, T]`` with a boolean response ``mask [B, T]``; sequence rewards ``[B]``;
grouped rewards ``[G, K]`` (the letters are `posttrain.shapes`). Every function here is pure: no
hidden state, no global RNG, no config objects. The names below are the ones with a contract test
(``tests/estimators/test_every_estimator.py``); every other public function is imported from its
package (``from posttrain.estimators.selection import router_scores``). Which paper each function
implements is the table `posttrain.papers.PAPERS`.
"""

# imported for their registries (optimisers, projections, advantage weights, schedules)
from posttrain.estimators import merging, optim, weights  # noqa: F401
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
from posttrain.estimators.advantages.delta import exopd_advantages, opd2_advantages
from posttrain.estimators.advantages.group import (
    broadcast_sequence_advantages,
    drgrpo_advantages,
    group_normalized_advantages,
    group_rewards,
    rloo_advantages,
)
from posttrain.estimators.advantages.oracle import naive_injection_advantages, orarl_advantages
from posttrain.estimators.advantages.returns import reinforce_pp_advantages, reinforce_pp_baseline_advantages
from posttrain.estimators.advantages.rules import kdrl_advantages, opd_then_rl_advantages, rlsd_advantages
from posttrain.estimators.advantages.teacher import eos_teacher_mask, opd_token_advantages
from posttrain.estimators.advantages.trace_weights import (
    TsallisWeights,
    garl_advantages,
    garl_weights,
    log_mean_weight,
    paft_advantages,
    paft_weights,
)
from posttrain.estimators.aggregation import AggregationMode, aggregate, masked_mean, masked_sum, masked_whiten
from posttrain.estimators.diffusion.forward_matching import (
    Curvature,
    awm_loss,
    bounded_weight,
    elbo_weight,
    girsanov_template_weights,
    is_scale_bounded,
    nft_loss,
    scale_bounded_loss,
    template_loss,
)
from posttrain.estimators.diffusion.girsanov import girsanov_log_weights, ito_policy_gradient, path_score
from posttrain.estimators.diffusion.value_gradients import (
    VALUE_GRADIENTS,
    KDEValueGradient,
    deterministic_value_gradient,
    kde_value_gradient,
    stochastic_value_gradient,
    value_gradient_policy_gradient,
)
from posttrain.estimators.divergences.kl import k1_kl, k2_kl, k3_kl, straight_through
from posttrain.estimators.divergences.reverse_kl import full_reverse_kl, topk_reverse_kl, topk_reverse_kl_reward
from posttrain.estimators.es import (
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
    perturbed_params,
    population_noise,
    relative_drift,
    shape_rewards,
    threshold_update,
    update_sparsity,
    zscore_rewards,
)
from posttrain.estimators.es_noise import noise_chunks, seeded_noise, tensor_seed
from posttrain.estimators.importance.acceptance import sis_accept, sis_acceptance_prob, sis_logp_old
from posttrain.estimators.importance.ratios import log_ratio, sequence_log_ratio
from posttrain.estimators.losses._common import ClipDiagnostics
from posttrain.estimators.losses.cispo import CISPO_CLIP_MODES, cispo_loss
from posttrain.estimators.losses.flow import flow_gap, flowrl_loss, flowrl_optimal_log_z, gflowrl_loss, mc_log_partition
from posttrain.estimators.losses.offpolicy import no_correction_loss, sis_loss, truncated_is_loss
from posttrain.estimators.losses.ppo import clipped_ratio_loss, gspo_loss, ppo_clip_objective
from posttrain.estimators.losses.preference import PREFERENCE_LOSSES, DPODiagnostics, dpo_loss, register_preference_loss
from posttrain.estimators.losses.teacher import opd_policy_loss, trrd_loss
from posttrain.estimators.losses.weighted import garl_loss, paft_loss
from posttrain.estimators.metrics.coverage import accuracy_bins, answer_entropy, majority_vote_correct
from posttrain.estimators.metrics.entropy import EntropyLens, domain_means, entropy_lens, token_entropy
from posttrain.estimators.metrics.passk import mean_at_k, pass_at_k
from posttrain.estimators.selection import schedules  # noqa: F401
from posttrain.estimators.selection.controller import controller_init, controller_predict, controller_update
from posttrain.estimators.selection.interventions import plan_interventions, recoverability_gain
from posttrain.estimators.selection.replay import headroom, policy_drift, replay_add, replay_init, replay_select
from posttrain.estimators.selection.routing import self_routing_probabilities

__all__ = [
    "ADVANTAGES",
    "CISPO_CLIP_MODES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "PREFERENCE_LOSSES",
    "REWARD_SHAPINGS",
    "VALUE_GRADIENTS",
    "AggregationMode",
    "ClipDiagnostics",
    "Curvature",
    "DPODiagnostics",
    "EntropyLens",
    "EsPopulation",
    "EsState",
    "EvolutionStrategy",
    "KDEValueGradient",
    "TsallisWeights",
    "accuracy_bins",
    "aggregate",
    "answer_entropy",
    "antithetic_gradient",
    "antithetic_population",
    "awm_loss",
    "bounded_weight",
    "broadcast_sequence_advantages",
    "centered_rank_rewards",
    "cispo_loss",
    "clipped_ratio_loss",
    "controller_init",
    "controller_predict",
    "controller_update",
    "deterministic_value_gradient",
    "domain_means",
    "dpo_loss",
    "drgrpo_advantages",
    "elbo_weight",
    "entropy_lens",
    "eos_teacher_mask",
    "es_direction",
    "es_gradient",
    "es_step",
    "evolution_strategy",
    "exopd_advantages",
    "flow_gap",
    "flowrl_loss",
    "flowrl_optimal_log_z",
    "full_reverse_kl",
    "garl_advantages",
    "garl_loss",
    "garl_weights",
    "get_advantage",
    "get_kl",
    "get_policy_loss",
    "gflowrl_loss",
    "girsanov_log_weights",
    "girsanov_template_weights",
    "group_normalized_advantages",
    "group_rewards",
    "gspo_loss",
    "headroom",
    "is_scale_bounded",
    "ito_policy_gradient",
    "k1_kl",
    "k2_kl",
    "k3_kl",
    "kde_value_gradient",
    "kdrl_advantages",
    "log_mean_weight",
    "log_ratio",
    "majority_vote_correct",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "mc_log_partition",
    "mean_at_k",
    "naive_injection_advantages",
    "nft_loss",
    "no_correction_loss",
    "noise_chunks",
    "opd2_advantages",
    "opd_policy_loss",
    "opd_then_rl_advantages",
    "opd_token_advantages",
    "orarl_advantages",
    "paft_advantages",
    "paft_loss",
    "paft_weights",
    "pass_at_k",
    "path_score",
    "perturbed_params",
    "plan_interventions",
    "policy_drift",
    "population_noise",
    "ppo_clip_objective",
    "recoverability_gain",
    "register_advantage",
    "register_kl",
    "register_policy_loss",
    "register_preference_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "relative_drift",
    "replay_add",
    "replay_init",
    "replay_select",
    "rloo_advantages",
    "rlsd_advantages",
    "scale_bounded_loss",
    "seeded_noise",
    "self_routing_probabilities",
    "sequence_log_ratio",
    "shape_rewards",
    "sis_accept",
    "sis_acceptance_prob",
    "sis_logp_old",
    "sis_loss",
    "stochastic_value_gradient",
    "straight_through",
    "template_loss",
    "tensor_seed",
    "threshold_update",
    "token_entropy",
    "topk_reverse_kl",
    "topk_reverse_kl_reward",
    "trrd_loss",
    "truncated_is_loss",
    "update_sparsity",
    "value_gradient_policy_gradient",
    "zero_off_mask",
    "zscore_rewards",
]
