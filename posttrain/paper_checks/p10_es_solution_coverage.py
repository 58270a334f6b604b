"""Paper 10: ES improves solution coverage over GRPO (Hayes et al. 2026, arXiv:2608.12679).

Claim: ES matches GRPO at pass@1 and beats it for k >= 2, has far fewer regressions (problems the
base solves that the tuned model does not), more progressions, fewer "unsolvable under sampling"
prompts (bin 0), and keeps higher entropy where it fails.

Toy (docs: methods/es_solution_coverage.md): the same multi-path verifier bandit, arms and budget as paper 05's check
(`posttrain.simulators.es_toys.run_bandit_arms`: GRPO Adam lr 0.1, B = 32, G = 8, 200 steps;
ES N = 32, sigma = 0.5, alpha = 0.1, greedy fitness, 200 steps). Metrics are exact expectations on
the 2048-prompt test pool at T_eval = 0.6 with n = 32 evaluation samples: pass@k, bin-0 fraction
$\\mathrm{mean}_x(1-p)^{32}$, expected regression/progression counts against the base
(any-correct criterion), the regression-weighted policy entropy, and maj@inf (reported).

Simplifications: one-step responses, the answer entropy is the policy entropy (each path is its own
answer), maj@inf treats every wrong path as a distinct wrong answer. "Every seed" and ">= 4/5 seeds"
criteria are judged as the quantile claim "in most seeds" (share 1/2, Clopper-Pearson). Not judged
(the paper's claim is not reachable in this toy, docs: methods/es_solution_coverage.md): ES >= base
at every k and bin0_ES <= bin0_base; reported.

Primary endpoint (the abstract: "As this paper shows, ES achieves consistently higher pass@k than RL
and produces a broader output distribution with greater solution coverage."): criterion 1 on each
seed, the smallest ES - GRPO gap over k in {2, ..., 64}, with pass@1 allowed 0.05 below GRPO (the
spec's "at k = 1, ES >= GRPO - 0.05"), is positive, in most seeds (quantile, share 1/2). A gap at
large k alone is not the claim: the base policy beats GRPO at k = 64 too, but not at k = 1, 2.
Secondary: each k alone, regressions, progressions, the bin-0 share and the failure entropy.

Power plan: a pilot on seeds 10000-10019 (test pools 11000-11019; disjoint from the evaluation's)
had the primary hold on 19/20 seeds (smallest gap at k = 2, mean 0.032, SD 0.015). Planned at the
spec's claimed share of 0.8 ("in >= 4/5 seeds"): 20 seeds give 80% power (19 give 67%).

Mutants: *grpo-for-es* (the ES arm trained by GRPO: every gap is 0) and *es-one-member* (a population
of one: ES never moves, the base's pass@1 is far below GRPO's); neither is reproduced (tested at 6
seeds and 200 steps, where the real method is).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from posttrain.paper_checks import register_check
from posttrain.paper_checks.cli import main_for
from posttrain.paper_checks.model import (
    MEDIAN,
    Comparison,
    Metric,
    Mutant,
    PaperCheck,
    Result,
    Role,
    mean_criterion,
    quantile_criterion,
)
from posttrain.paper_checks.p05_es_coverage import arm_metrics
from posttrain.simulators.es_toys import BanditArms, BanditSetup
from posttrain.theory.es_coverage import categorical_entropy, regression_progression, zero_bin_fraction

__all__ = ["Config", "run"]


@dataclass(frozen=True)
class Config(BanditSetup):
    seeds: int = 20  # power plan (docstring): a share 0.8 (spec: >= 4/5 seeds) needs 20 for 80%
    t_eval: float = 0.6  # spec 7
    n_eval: int = 32  # spec 7: evaluation samples per prompt
    ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)  # spec 7
    pass1_tolerance: float = 0.05  # spec 7 criterion 1: at k = 1, ES >= GRPO - 0.05
    margin_reason: str = "docs: methods/es_solution_coverage.md pass criteria (calibrated effects exceed the margins)"

    @classmethod
    def smoke(cls) -> Config:
        return cls(seeds=2, n_train=1024, n_test=512, steps=60)


def _coverage(arms: BanditArms, name: str, *, t_eval: float, n: int) -> dict[str, torch.Tensor]:
    params = arms.arms[name]
    p0 = arms.test.success(arms.arms["base"], temperature=t_eval)
    p = arms.test.success(params, temperature=t_eval)
    reg, prog, w = regression_progression(p0, p, n=n)
    probs = torch.softmax(arms.test.logits(params) / t_eval, dim=-1)
    h = categorical_entropy(probs)
    wrong_max = probs.masked_fill(arms.test.correct, 0.0).amax(-1)
    return {
        "bin0": zero_bin_fraction(p, n=n),
        "regressions": reg,
        "progressions": prog,
        "regression-weighted entropy": (w * h).sum(-1) / w.sum(-1).clamp_min(1e-300),
        "maj@inf": (p > wrong_max).double().mean(-1),
    }


def run(config: Config) -> Result:
    names = ("base", "grpo", "es")
    arms = config.train_arms(names)
    m = {
        a: {
            **arm_metrics(arms, a, t_eval=config.t_eval, ks=config.ks),
            **_coverage(arms, a, t_eval=config.t_eval, n=config.n_eval),
        }
        for a in names
    }
    metrics = tuple(Metric(f"{a} {key}", tuple(float(x) for x in v)) for a in names for key, v in m[a].items())
    base, grpo, es = ({k: v.numpy() for k, v in m[a].items()} for a in names)
    reason = config.margin_reason

    def seeds(name: str, d: object, margin: float) -> Comparison:
        """ "In every seed" / "in >= 4/5 of the seeds" as the quantile claim "in most seeds" (share 1/2)."""
        return quantile_criterion(name, d, margin=margin, share=MEDIAN, reason=reason)  # type: ignore[arg-type]

    gaps = [es[f"pass@{k}"] - grpo[f"pass@{k}"] for k in config.ks if k > 1]
    at_one = es["pass@1"] - grpo["pass@1"] + config.pass1_tolerance
    comps = [
        quantile_criterion(
            "ES - GRPO at every k (pass@1 + 0.05)", np.minimum(np.min(gaps, axis=0), at_one), margin=0.0,
            share=MEDIAN, role=Role.PRIMARY,
            reason=reason + ": criterion 1 on each seed, the smallest gap over k ('consistently higher pass@k "
            "than RL'; at k = 1 within 0.05), in most seeds",
        )
    ]  # fmt: skip
    comps += [seeds(f"ES - GRPO pass@{k}", es[f"pass@{k}"] - grpo[f"pass@{k}"], 0.0) for k in config.ks if k > 1]
    comps += [
        seeds("ES - GRPO pass@1 + 0.05", at_one, 0.0),
        seeds("0.75 reg_GRPO - reg_ES", 0.75 * grpo["regressions"] - es["regressions"], 0.0),
        seeds("prog_ES - prog_GRPO", es["progressions"] - grpo["progressions"], 0.0),
        seeds("bin0_GRPO - bin0_ES", grpo["bin0"] - es["bin0"], 0.08),
        seeds("H_ES - H_GRPO (regression-weighted)",
              es["regression-weighted entropy"] - grpo["regression-weighted entropy"], 0.2),
    ]  # fmt: skip
    not_reachable = "paper's claim; not reachable in this toy (docs: methods/es_solution_coverage.md), reported"

    def context(name: str, d: object, reason: str) -> Comparison:  # differences of two rates in [0, 1]
        return mean_criterion(name, d, margin=0.0, reason=reason, bounds=(-1.0, 1.0), role=Role.CONTEXT)  # type: ignore[arg-type]

    comps += [context(f"ES - Base pass@{k}", es[f"pass@{k}"] - base[f"pass@{k}"], not_reachable) for k in config.ks]
    comps.append(context("bin0_Base - bin0_ES", base["bin0"] - es["bin0"], not_reachable))
    comps.append(context("maj@inf ES - GRPO", es["maj@inf"] - grpo["maj@inf"], "reported only"))
    return Result(
        metrics=metrics, comparisons=tuple(comps), notes=f"n_eval = {config.n_eval}, T_eval = {config.t_eval}"
    )


def _mutant_test_config() -> Config:
    """The smallest size at which the real method is reproduced (6 seeds: the share bound's floor)."""
    return dataclasses.replace(Config.smoke(), seeds=6, steps=200)


CHECK = register_check(
    PaperCheck(
        id="10",
        paper="Hayes et al. 2026, Beyond the Best Guess: Improving LLM Solution Coverage with ES, arXiv:2608.12679",
        claim="ES beats GRPO at pass@k for k >= 2 with fewer regressions and less collapse to zero coverage",
        abstract=(
            "As this paper shows, ES achieves consistently higher pass@k than RL and produces a broader output "
            "distribution with greater solution coverage."
        ),
        config_type=Config,
        run=run,
        mutants=(
            Mutant(
                "grpo-for-es",
                "the ES arm trained by GRPO (the baseline in ES's place)",
                lambda c: dataclasses.replace(c, substitute=(("es", "grpo"),)),
                test_config=_mutant_test_config,
            ),
            Mutant(
                "es-one-member",
                "ES with a population of one: no population, z-scored fitness 0, no update",
                lambda c: dataclasses.replace(c, population=1),
                test_config=_mutant_test_config,
            ),
        ),
    )
)

if __name__ == "__main__":
    raise SystemExit(main_for(CHECK))
