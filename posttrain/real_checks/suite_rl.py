"""Real-model experiments on the RL family: coverage (05, 10, 14), off-policy (02, 16), budgets (11), optimisers (12),
cold start (20).

Each experiment's docstring is its transfer card in words; the card object holds the same, with the toy's
primary read from the registered check. All arms start from SmolLM2-135M-Instruct and train 16 steps of
4 prompts x 8 samples (`posttrain.real_checks.arm_table`); held-out: 200 prompts x 4 samples per seed
(x 16 for the pass@k experiments).
"""

from __future__ import annotations

import dataclasses

from posttrain.paper_checks.model import Role
from posttrain.real_checks.card import Mediator, Source, TransferCard, declared, toy_metric_range
from posttrain.real_checks.experiment import Contrast, RealExperiment, diff, log_ratio

__all__ = ["EXPERIMENTS"]


def _staleness_missing() -> str:
    from posttrain.llm.config import RolloutConfig

    names = {f.name for f in dataclasses.fields(RolloutConfig)}
    return "" if "staleness" in names else "the trainer has no rollout.staleness (controlled off-policy lag)"


_COVERAGE_GAP = Mediator(
    "pass@8 - pass@1 of the base", "add:coverage_gap",
    "sampling headroom over one answer: what a method that keeps diversity can convert into pass@k",
    toy_metric_range("10", "base pass@8", "base pass@1", combine=lambda a, b: a - b),
)  # fmt: skip
_PASS = "pass@16 at matched samples (512 answers of training each), held-out 200 prompts x 16 samples"

E05 = RealExperiment(
    "05", "ES keeps pass@k above GRPO",
    TransferCard(("05",), f"paired difference ES - GRPO of {_PASS}", (_COVERAGE_GAP,),
                 {"reward": "binary (exact sum)", "p0": "~0.2 (two-digit + one-digit addition)",
                  "budget": "512 sampled (GRPO) vs 512 greedy (ES) answers"}),
    (Contrast("ES - GRPO pass@16", diff("pass@16", "es", "grpo"), Role.PRIMARY),
     Contrast("ES - GRPO answer entropy", diff("answer_entropy", "es", "grpo"))),
    context=(("es", "accuracy"), ("grpo", "accuracy"), ("es", "entropy"), ("grpo", "entropy")),
    coverage=True,
)  # fmt: skip
"""05: the toy's pass@64 gap becomes pass@16 at matched training samples; mediator: the base's sampling headroom."""

E10 = RealExperiment(
    "10", "ES beats GRPO at pass@k for k >= 2, fewer prompts lose all coverage",
    TransferCard(("10",), f"paired difference ES - GRPO of {_PASS}", (_COVERAGE_GAP,), E05.card.regime),
    (Contrast("ES - GRPO pass@16", diff("pass@16", "es", "grpo"), Role.PRIMARY),
     Contrast("GRPO - ES share of prompts with no correct sample", diff("zero_coverage", "grpo", "es")),
     Contrast("ES - GRPO pass@4", diff("pass@4", "es", "grpo"))),
    context=(("es", "zero_coverage"), ("grpo", "zero_coverage")),
    coverage=True,
)  # fmt: skip
"""10: same arms as 05 (run once); its secondary endpoints are coverage losses (prompts with no correct sample)."""

E14 = RealExperiment(
    "14", "GFlowRL keeps rewarded modes that GRPO collapses",
    TransferCard(("14",), f"paired difference GFlowRL - GRPO of {_PASS}; answer entropy beside it", (
        Mediator("base accuracy p0", "add:p0", "the reference's mass on rewarded answers (the target p* reweights it)",
                 declared(0.25, 0.75, "toy 14: reference mass 0.49 on the 4 rewarded of 16 arms "
                          "(ref_logits_rewarded, unrewarded logits 0), +-0.25")),
    ), {"reward": "binary", "p0": "~0.2", "modes": "one correct number, several phrasings"}),
    (Contrast("GFlowRL - GRPO pass@16", diff("pass@16", "gflowrl", "grpo"), Role.PRIMARY),
     Contrast("GFlowRL - GRPO answer entropy", diff("answer_entropy", "gflowrl", "grpo"))),
    context=(("gflowrl", "accuracy"), ("grpo", "accuracy")),
    coverage=True,
)  # fmt: skip
"""14: the toy's distance to p* is not measurable on a language model; pass@16 and answer entropy carry it."""

E16 = RealExperiment(
    "16", "SIS beats clipped token IS on stale rollouts",
    TransferCard(("16",), "paired difference SIS - GRPO (clipped token IS, no other correction) of held-out "
                 "accuracy, every step trained on rollouts 4 steps stale", (
        Mediator("SIS accept rate at the lag", "lagged_mean:sis_stale:sis/accept_rate",
                 "share of tokens SIS keeps: near 1 means the rollouts are effectively on-policy",
                 toy_metric_range("16", "accept sis N=8", "accept sis N=16"), Source.RUN),
    ), {"lag": "rollout.staleness = 4 of 16 steps", "reward": "binary", "p0": "~0.2"}),
    (Contrast("SIS - GRPO at staleness 4", diff("accuracy", "sis_stale", "grpo_stale"), Role.PRIMARY),
     Contrast("SIS - TIS at staleness 4", diff("accuracy", "sis_stale", "tis_stale")),
     Contrast("what the lag costs: GRPO at staleness 4 - on-policy GRPO", diff("accuracy", "grpo_stale", "grpo"))),
    context=(("sis_stale", "accuracy"), ("grpo_stale", "accuracy"), ("tis_stale", "accuracy")),
    needs=_staleness_missing,
)  # fmt: skip
"""16: toy mutants (no correction, PPO in SIS's place) are the controls here; the lag is the trainer's staleness."""

E02 = RealExperiment(
    "02", "Headroom-drift replay beats naive replay",
    TransferCard(("02",), "paired difference HDR - naive recency replay of held-out accuracy at equal fresh "
                 "rollouts (2 replayed groups a step, buffer 8)", (
        Mediator("replay acceptance", "replay_acceptance:hdr", "share of scanned stored groups the drift gate lets in",
                 toy_metric_range("02", "acceptance hdr"), Source.RUN),
    ), {"lag": "replayed groups are up to 8 steps stale", "reward": "binary", "p0": "~0.2"}),
    (Contrast("HDR - naive replay", diff("accuracy", "hdr", "naive_replay"), Role.PRIMARY),
     Contrast("HDR - on-policy GRPO", diff("accuracy", "hdr", "grpo"))),
    context=(("hdr", "accuracy"), ("naive_replay", "accuracy")),
)  # fmt: skip
"""02: the replay stage stores groups and re-scores them under the current policy; acceptance is the mediator."""

E11 = RealExperiment(
    "11", "RAIL beats GRPO at an equal rollout budget",
    TransferCard(("11b",), "paired difference RAIL (4 fresh + 4 branched) - GRPO (8 fresh) of held-out accuracy "
                 "at equal rollouts per prompt", (
        Mediator("share of zero-variance groups", "add:zero_variance_groups",
                 "groups with no signal, which branching from informative prefixes can rescue",
                 toy_metric_range("11b", "zero-variance groups GRPO-8")),
    ), {"budget": "8 rollouts per prompt in both arms", "reward": "binary", "p0": "~0.2"}),
    (Contrast("RAIL - GRPO-8", diff("accuracy", "rail", "grpo"), Role.PRIMARY),),
    context=(("rail", "accuracy"), ("grpo", "accuracy"), ("rail", "flops_step"), ("grpo", "flops_step")),
)  # fmt: skip
"""11: the toy's 11b (matched budgets); 11a (the controller's online MAE) has no real-model counterpart here."""

E12 = RealExperiment(
    "12", "Fan-in Muon at a higher rate beats AdamW at a low rate",
    TransferCard(("12",), "paired difference Muon (3e-5, fan-in) - AdamW (1e-6) of held-out accuracy, the paper's "
                 "rates; an RMS-matched Muon as the negative control", (
        Mediator("update RMS ratio Muon / AdamW (first step)", "rms_ratio:muon_hi:adamw_lo",
                 "the paper's mechanism: Muon's larger effective step",
                 toy_metric_range("12", "rho = RMS(Muon)/RMS(AdamW)"), Source.RUN),
    ), {"rates": "Muon 3e-5 vs AdamW 1e-6 (paper)", "reward": "binary", "p0": "~0.2"}),
    (Contrast("Muon hi - AdamW lo", diff("accuracy", "muon_hi", "adamw_lo"), Role.PRIMARY),
     Contrast("negative control: RMS-matched Muon - AdamW lo", diff("accuracy", "muon_matched", "adamw_lo"))),
    context=(("muon_hi", "accuracy"), ("adamw_lo", "accuracy"), ("muon_matched", "accuracy")),
)  # fmt: skip
"""12: the mediator is measured on the first optimizer step of each arm (update RMS of the hidden matrices)."""

E20 = RealExperiment(
    "20", "GARL (q = 0.75) escapes a cold start faster than GRPO",
    TransferCard(("20b",), "log of GRPO's over GARL's steps until the training batch's mean reward first reaches "
                 "0.25 (right-censored at the run's steps + 1), paired by seed", (
        Mediator("base accuracy p0 (cold task)", "cold:p0", "the cold-start probability the escape time scales with",
                 declared(0.0, 0.05, "toy 20a: p0 grid 1e-5..1e-2 (closed form for any p0 << 1); 20b: 1/1024..1/256; "
                          "widened to the 5% a cold start names")),
    ), {"reward": "binary", "p0": "< 0.05 (two-digit x two-digit products)", "budget": "16 steps of 4 x 8"}),
    (Contrast("log(T_GRPO / T_GARL), threshold 0.25", log_ratio("escape@0.25", "grpo_cold", "garl_cold"),
              Role.PRIMARY, reason="GARL escapes first on most seeds"),
     Contrast("GARL - GRPO held-out accuracy (cold task)", diff("accuracy", "garl_cold", "grpo_cold"))),
    context=(("garl_cold", "escape@0.25"), ("grpo_cold", "escape@0.25"), ("base_cold", "accuracy")),
    probe_tasks=("cold",),
)  # fmt: skip
"""20: the toy's escape-time ratio, measured on the training curve of a task the base rarely solves."""

EXPERIMENTS = (E02, E05, E10, E11, E12, E14, E16, E20)
