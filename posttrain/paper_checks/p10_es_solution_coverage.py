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
criteria are asserted as shares of seeds with the harness's binomial test (10/10 and 9/10 of 10 seeds). Not asserted (the paper's claim is not
reachable in this toy, docs: methods/es_solution_coverage.md): ES >= base at every k and bin0_ES <= bin0_base; reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posttrain.paper_checks import register_check
from posttrain.paper_checks._seeds import seedwise
from posttrain.paper_checks.base import Comparison, Metric, PaperCheck, Result
from posttrain.paper_checks.p05_es_coverage import arm_metrics
from posttrain.simulators.es_toys import BanditArms, BanditSetup
from posttrain.theory.es_coverage import categorical_entropy, regression_progression, zero_bin_fraction

__all__ = ["Config", "run"]


@dataclass(frozen=True)
class Config(BanditSetup):
    t_eval: float = 0.6
    n_eval: int = 32
    ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
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
    comps = [
        seedwise(
            f"ES - GRPO pass@{k}", es[f"pass@{k}"] - grpo[f"pass@{k}"], margin=0.0, margin_reason=reason, fraction=0.8
        )
        for k in config.ks
        if k > 1
    ]
    comps += [
        seedwise("ES - GRPO pass@1 + 0.05", es["pass@1"] - grpo["pass@1"] + 0.05, margin=0.0, margin_reason=reason),
        seedwise(
            "0.75 reg_GRPO - reg_ES", 0.75 * grpo["regressions"] - es["regressions"], margin=0.0, margin_reason=reason
        ),
        seedwise(
            "prog_ES - prog_GRPO",
            es["progressions"] - grpo["progressions"],
            margin=0.0,
            margin_reason=reason,
            fraction=0.8,
        ),
        seedwise("bin0_GRPO - bin0_ES", grpo["bin0"] - es["bin0"], margin=0.08, margin_reason=reason),
        seedwise(
            "H_ES - H_GRPO (regression-weighted)",
            es["regression-weighted entropy"] - grpo["regression-weighted entropy"],
            margin=0.2,
            margin_reason=reason,
        ),
    ]
    not_reachable = "paper's claim; not reachable in this toy (docs: methods/es_solution_coverage.md), reported"
    comps += [
        Comparison(
            f"ES - Base pass@{k}",
            tuple(float(x) for x in es[f"pass@{k}"] - base[f"pass@{k}"]),
            margin_reason=not_reachable,
            asserted=False,
        )
        for k in config.ks
    ]
    comps.append(
        Comparison(
            "bin0_Base - bin0_ES",
            tuple(float(x) for x in base["bin0"] - es["bin0"]),
            margin_reason=not_reachable,
            asserted=False,
        )
    )
    comps.append(
        Comparison(
            "maj@inf ES - GRPO",
            tuple(float(x) for x in es["maj@inf"] - grpo["maj@inf"]),
            margin_reason="reported only",
            asserted=False,
        )
    )
    return Result(
        metrics=metrics, comparisons=tuple(comps), notes=f"n_eval = {config.n_eval}, T_eval = {config.t_eval}"
    )


register_check(
    PaperCheck(
        id="10",
        paper="Hayes et al. 2026, Beyond the Best Guess: Improving LLM Solution Coverage with ES, arXiv:2608.12679",
        claim="ES beats GRPO at pass@k for k >= 2 with fewer regressions and less collapse to zero coverage",
        config_type=Config,
        run=run,
    )
)
