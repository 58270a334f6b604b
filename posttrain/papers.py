"""The paper index as data: each paper (ids 01-20, and ``core`` for the methods every paper builds on)
mapped to the functions that implement it.

The estimators are sorted by the kind of quantity they return (`posttrain.estimators`), never by
paper; this table is the other view. ``posttrain list paper`` prints it, the docs' method pages and
the README's method table read it, and ``tests/test_papers.py`` checks that every entry resolves
and that every public estimator function is listed under some paper or ``core``.

Entries are strings, resolved on demand (this module imports nothing heavy):

- ``Paper.estimators``: ``"family.module:function"`` under `posttrain.estimators`
  (``"losses.ppo:clipped_ratio_loss"``);
- ``Paper.elsewhere``: simulators, theory and LLM entry points under `posttrain`, a module
  (``"simulators.sde"``) or an attribute of one (``"llm.run:grpo_then_es"``).

Examples:
    >>> paper("16").title
    'Selective importance sampling'
    >>> [p.id for p in papers_of("clipped_ratio_loss")]
    ['core']
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from posttrain.errors import DomainError

__all__ = ["PAPERS", "Paper", "paper", "papers_of", "resolve"]

ESTIMATORS = "posttrain.estimators"


@dataclass(frozen=True)
class Paper:
    """One paper (or ``core``) and where it lives in the package."""

    id: str
    """``"01"`` ... ``"20"``, or ``"core"``."""
    title: str
    """Short title."""
    arxiv: tuple[str, ...]
    """arXiv ids (several for ``core``)."""
    estimators: tuple[str, ...]
    """``"family.module:function"`` under `posttrain.estimators`."""
    elsewhere: tuple[str, ...] = ()
    """Modules or ``"module:attribute"`` under `posttrain` (simulators, theory, LLM entry points)."""
    checks: tuple[str, ...] = ()
    """Ids of its paper checks (``posttrain check ID``)."""
    page: str = ""
    """Its documentation page under ``docs/``."""

    def functions(self) -> list[str]:
        """The function names of ``estimators`` (without their modules)."""
        return [entry.split(":", 1)[1] for entry in self.estimators]

    def qualified(self) -> list[str]:
        """``estimators`` as dotted paths (``posttrain.estimators.losses.ppo.clipped_ratio_loss``)."""
        return [f"{ESTIMATORS}.{entry.replace(':', '.')}" for entry in self.estimators]


def _in(module: str, *names: str) -> tuple[str, ...]:
    return tuple(f"{module}:{n}" for n in names)


PAPERS: tuple[Paper, ...] = (
    Paper(
        "core",
        "GRPO, Dr.GRPO, RLOO, REINFORCE++, PPO-clip (dual clip, clip-higher), GSPO, CISPO, KL estimators, "
        "rollout correction (TIS, MIS), pass@k",
        ("2402.03300", "2503.20783", "2402.14740", "2501.03262", "1707.06347", "1912.09729", "2503.14476",
         "2507.18071", "2506.13585", "2107.03374"),
        _in("advantages.group", "group_rewards", "group_normalized_advantages", "drgrpo_advantages",
            "rloo_advantages", "broadcast_sequence_advantages")
        + _in("advantages.returns", "reinforce_pp_advantages", "reinforce_pp_baseline_advantages")
        + _in("losses.ppo", "ppo_clip_objective", "clipped_ratio_loss", "gspo_loss")
        + _in("losses.cispo", "cispo_loss")
        + _in("losses.preference", "register_preference_loss")
        + _in("importance.ratios", "log_ratio", "sequence_log_ratio")
        + _in("importance.correction", "rollout_correction_weights", "correction_statistics")
        + _in("divergences.kl", "k1_kl", "k2_kl", "k3_kl", "straight_through")
        + _in("aggregation", "aggregate", "global_aggregate", "masked_mean", "masked_sum", "masked_whiten",
              "normaliser", "weighted_sum")
        + _in("metrics.entropy", "token_entropy")
        + _in("metrics.passk", "pass_at_k", "mean_at_k"),
        ("llm.methods.catalog", "simulators.bandits", "simulators.tabular", "simulators.loop"),
        page="concepts/index.md",
    ),
    Paper(
        "01",
        "OPD-then-RL: sequential beats joint",
        ("2609.04108",),
        _in("advantages.teacher", "eos_teacher_mask", "opd_token_advantages")
        + _in("divergences.reverse_kl", "full_reverse_kl", "topk_reverse_kl")
        + _in("advantages.rules", "correctness_flags", "additive_distill_advantages", "kdrl_advantages",
              "kdrl_mask_advantages", "srpo_advantages", "hdpo_advantages", "rlsd_advantages",
              "kdrl_annealing_advantages", "opd_then_rl_advantages")
        + _in("selection.schedules", "kdrl_annealed_beta", "opd_phase", "plateau_switch_step")
        + _in("losses.teacher", "opd_policy_loss", "trrd_loss")
        + _in("metrics.diagnostics", "topk_overlap", "sign_conflict_rate"),
        ("llm.methods.distill:opd_then_rl_algorithm", "simulators.teacher_tabular"),
        ("01",),
        "methods/opd_then_rl.md",
    ),
    Paper(
        "02",
        "Headroom-Drift Replay",
        ("2609.03941",),
        _in("selection.replay", "headroom", "policy_drift", "mixed_outcome", "replay_init", "replay_take",
            "replay_add", "replay_rule", "replay_select"),
        ("llm.rollout.replay",),
        ("02",),
        "methods/hdr.md",
    ),
    Paper(
        "03",
        "SFT-RL annotation budget allocation",
        ("2609.01573",),
        (),
        ("theory.budget_allocation",),
        ("03",),
        "methods/budget_allocation.md",
    ),
    Paper(
        "04",
        "Self-Routing: from rollouts to recipes",
        ("2609.01422",),
        _in("selection.routing", "accuracy_memberships", "rollout_confidence", "confidence_features",
            "router_scores", "router_probabilities", "self_routing_probabilities", "sample_routes",
            "random_routes", "route_masks")
        + _in("losses.routed", "routed_loss", "queue_token_weights"),
        ("llm.methods.routing",),
        ("04",),
        "methods/self_routing.md",
    ),
    Paper(
        "05",
        "ES: broader reasoning coverage",
        ("2608.27351", "2509.24372"),
        _in("es", "check_population", "population_noise", "antithetic_population", "zscore_rewards",
            "centered_rank_rewards", "raw_rewards", "shape_rewards", "es_gradient", "antithetic_gradient",
            "check_params", "perturbed_params", "member_coefficients", "es_direction", "es_step",
            "evolution_strategy", "relative_drift", "update_sparsity", "threshold_update")
        + _in("es_noise", "tensor_seed", "noise_dtype", "seeded_noise", "chunk_spans", "noise_chunks",
              "members_noise"),
        ("theory.es_coverage", "llm.es.trainer", "llm.es.params", "simulators.es_toys"),
        ("05",),
        "methods/es_coverage.md",
    ),
    Paper(
        "06",
        "Demystifying RL post-training",
        ("2608.24949",),
        _in("metrics.entropy", "entropy_lens", "domain_means"),
        ("simulators.demystify",),
        ("06",),
        "methods/demystifying.md",
    ),
    Paper(
        "07",
        "OraRL: annotations as rollouts",
        ("2608.20492",),
        _in("advantages.oracle", "orarl_policy_advantages", "orarl_oracle_advantage", "sign_balanced_selection",
            "post_selection_correction", "orarl_advantages", "naive_injection_advantages")
        + _in("metrics.diagnostics", "inversion_rate"),
        ("llm.methods.orarl", "llm.rollout.oracle"),
        ("07",),
        "methods/orarl.md",
    ),
    Paper(
        "08",
        "Open-MOPD: multi-teacher on-policy distillation",
        ("2608.19098",),
        _in("weights", "route_teacher_logprobs", "domain_token_counts", "token_share_weights",
            "domain_gap_magnitudes", "gap_factors", "mopd_domain_weights", "refreshed_reward")
        + _in("divergences.reverse_kl", "topk_reverse_kl_reward")
        + _in("losses.teacher", "topk_distill_loss")
        + _in("metrics.diagnostics", "headroom_recovery"),
        ("llm.methods.mopd", "simulators.multidomain"),
        ("08",),
        "methods/open_mopd.md",
    ),
    Paper(
        "09",
        "Diffusion RL: a unified path-space view",
        ("2608.14430",),
        _in("diffusion.girsanov", "girsanov_log_weights", "path_score", "ito_policy_gradient")
        + _in("diffusion.value_gradients", "stochastic_value_gradient", "value_gradient_policy_gradient",
              "deterministic_value_gradient", "kde_value_gradient")
        + _in("diffusion.forward_matching", "template_loss", "girsanov_template_weights", "elbo_weight",
              "bounded_weight", "scale_bounded_loss", "awm_loss", "nft_loss", "is_scale_bounded"),
        ("simulators.sde", "simulators.sde_exact"),
        ("09",),
        "methods/diffusion_path_space.md",
    ),
    Paper(
        "10",
        "ES: beyond the best guess",
        ("2608.12679",),
        _in("metrics.coverage", "accuracy_bins", "answer_entropy", "majority_vote_correct"),
        ("theory.es_coverage:regression_progression", "theory.es_coverage:zero_bin_fraction",
         "llm.run:grpo_then_es"),
        ("10",),
        "methods/es_solution_coverage.md",
    ),
    Paper(
        "11",
        "RAIL: recoverability-aware rollout intervention",
        ("2608.05080",),
        _in("selection.interventions", "recoverability_gain", "random_interventions", "plan_interventions",
            "entropy_heuristic_states")
        + _in("selection.controller", "recency_weights", "huber", "controller_init", "controller_fit",
              "controller_update", "controller_predict"),
        ("llm.rollout.branching", "simulators.branching"),
        ("11a", "11b"),
        "methods/rail.md",
    ),
    Paper(
        "12",
        "When does Muon help agentic RL?",
        ("2607.16169",),
        _in("optim", "muon_scale", "newton_schulz5", "muon_init", "muon_update", "adamw_init", "adamw_update",
            "adamw_steady_state_rms", "update_rms", "group_update_rms", "route_muon_parameters"),
        ("llm.train.muon:MuonWithAdamW",),
        ("12",),
        "methods/muon.md",
    ),
    Paper(
        "13",
        "OPD^2: on-policy delta distillation",
        ("2607.15161", "2602.12125"),
        _in("advantages.delta", "tempered_log_softmax", "topk_support", "sampled_on_support",
            "student_expectation", "centered_advantage", "opd2_advantages", "exopd_advantages"),
        ("llm.methods.distill:opd2_algorithm", "llm.methods.distill:exopd_algorithm", "llm.methods.topk"),
        ("13",),
        "methods/opd2.md",
    ),
    Paper(
        "14",
        "GFlowRL: distribution-matching RL",
        ("2607.13394", "2509.15207"),
        _in("losses.flow", "mc_log_partition", "flow_gap", "gflowrl_loss", "flowrl_loss", "flowrl_optimal_log_z"),
        ("llm.methods.flow",),
        ("14",),
        "methods/gflowrl.md",
    ),
    Paper(
        "15",
        "RACE: where RL compute goes",
        ("2607.13389",),
        (),
        ("theory.race_flops:flops_per_step", "theory.race_flops:FlopSplit", "theory.race_fit", "llm.tools.flops"),
        ("15",),
        "methods/race.md",
    ),
    Paper(
        "16",
        "Selective importance sampling",
        ("2607.04728",),
        _in("importance.acceptance", "token_in_topk", "sis_acceptance_prob", "sis_rejection_test", "sis_accept",
            "sis_logp_old", "sis_divergence")
        + _in("losses.offpolicy", "sis_loss", "sis_gspo_loss", "truncated_is_loss", "no_correction_loss"),
        ("llm.methods.sis",),
        ("16",),
        "methods/sis.md",
    ),
    Paper(
        "17",
        "SAR: spectral rewiring",
        ("2607.03065", "2306.01708", "2311.03099", "2212.04089"),
        _in("merging", "sar_rank", "low_rank_truncation", "sar_project", "random_subspace_projection",
            "sar_merge", "task_arithmetic_merge", "ties_merge", "dare_merge"),
        ("llm.tools.sar",),
        ("17",),
        "methods/sar.md",
    ),
    Paper(
        "18",
        "Which pairs to compare: DPO design",
        ("2606.19607", "2305.18290"),
        _in("losses.preference", "dpo_loss"),
        ("theory.dpo_design", "theory.dpo_design_solvers", "theory.dpo_pair_selection:select_pairs",
         "llm.methods.pairs", "llm.methods.dpo", "llm.train.dpo"),
        ("18",),
        "methods/dpo_design.md",
    ),
    Paper(
        "19",
        "Select and improve",
        ("2606.13125",),
        (),
        ("theory.select_improve:decompose", "theory.select_improve:decompose_rollouts",
         "theory.select_improve:forward_share", "simulators.strategy_routing", "simulators.ffchain"),
        ("19",),
        "methods/select_improve.md",
    ),
    Paper(
        "20",
        "Tsallis loss continuum: GARL and PAFT",
        ("2604.25907",),
        _in("advantages.trace_weights", "log_mean_weight", "garl_weights", "paft_weights", "tsallis_token_weights",
            "garl_advantages", "paft_advantages")
        + _in("losses.weighted", "weighted_logp_loss", "garl_loss", "paft_loss"),
        ("theory.tsallis", "llm.methods.tsallis"),
        ("20a", "20b", "20c"),
        "methods/tsallis.md",
    ),
)  # fmt: skip


def paper(paper_id: str) -> Paper:
    """The paper with this id (``"16"``, ``"6"`` or ``"core"``); DomainError listing the ids otherwise."""
    key = paper_id.strip().lower()
    key = key.zfill(2) if key.isdigit() else key
    for p in PAPERS:
        if p.id == key:
            return p
    raise DomainError(f"paper: unknown id {paper_id!r}; valid: {', '.join(p.id for p in PAPERS)}")


def papers_of(function: str) -> list[Paper]:
    """The papers listing ``function`` (a bare name or ``"family.module:function"``)."""
    return [p for p in PAPERS if function in p.estimators or function in p.functions()]


def resolve(entry: str, *, package: str = ESTIMATORS) -> object:
    """Import ``"module:attribute"`` (or a module) relative to ``package`` and return the object."""
    module, _, attr = entry.partition(":")
    obj = importlib.import_module(f"{package}.{module}")
    return getattr(obj, attr) if attr else obj
