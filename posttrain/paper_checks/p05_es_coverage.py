"""Paper 05: ES keeps reasoning coverage where GRPO collapses (Ba et al. 2026, arXiv:2608.27351).

Claim: with matched compute (N = 4G), ES raises Pass@1 about as much as GRPO, while GRPO's entropy
collapses and its large-K Pass@K falls below both ES and the base policy; sequential
compositions land in between; thresholding away half of ES's smallest coordinate changes keeps
its gain. Secondary: Lemma 1's small-sigma expansion of the policy JS diversity (Monte-Carlo ratio
on a softmax bandit) and Lemma 2's quantities (JS_succ and P_pop - P_same of a sigma-population
around the ES and GRPO endpoints on the test pool), reported.

Toy (docs: methods/es_coverage.md, our design): the multi-path verifier bandit of
`posttrain.simulators.es_toys` (J = 8 paths, types A/B with P(A) = 0.8, q = 0.6, fixed base
logits, shared trainable bias and nuisance-feature matrix). GRPO: 200 Adam steps, B = 32, G = 8.
ES: 200 steps, N = 32, sigma = 0.5, alpha = 0.1, greedy fitness on the step's 32 prompts,
z-scored, members evaluated in one batched matmul. Metrics are exact on a 2048-prompt test pool at
T_eval = 0.6.

Simplifications: one-step "responses" (no tokens), exact softmax gradients, no KL term, no clipping
(one update per batch, ratio 1); GRPO advantages use the Bessel std (a constant rescaling that
Adam removes; the paper says population std). "Every seed" / ">= 4/5 seeds" criteria are judged as the
quantile claim "a seed clears the margin more often than not", by the Clopper-Pearson bound on the
share of seeds; the per-seed numbers are in the metrics. Not judged (unreachable in this toy,
reported): ES Pass@64 >= Base Pass@64.

Primary endpoint (the abstract: "Empirically, unlike GRPO, which exhibits entropy collapse, ES
improves Pass@1 while attaining higher Pass@K than GRPO."): both halves on each seed, with the
spec's margins (criteria 1 and 2): ES - Base Pass@1 > 0.10 and ES - GRPO Pass@64 > 0.05, i.e. the
smaller of the two excesses is positive, in most seeds (quantile, share 1/2). ES's Pass@K alone is
not the claim: the base policy also beats GRPO at K = 64 (by 0.28 here), so a method that does not
move passes it. Secondary: each half alone, the mean gap (> 0.08, bounded in [-1, 1]), GRPO below
the base at K = 64, the entropy collapse, the matched Pass@1 and the crossover at every K >= 2.

Power plan: a pilot on seeds 10000-10009 (test pools 11000-11009; disjoint from the evaluation's)
had both halves hold on 10/10 seeds (smallest joint excess 0.048, mean 0.069, SD 0.013). Planned at
a true share of 0.9 (the spec's "in every seed", one seed in ten allowed to miss): 12 seeds give
89% power (11 give 70%).

Mutants: *grpo-for-es* (the ES arm trained by GRPO: ES - GRPO is 0 on every seed) and
*es-one-member* (a population of one: its z-scored fitness is 0, so ES never moves and Pass@1
does not improve); neither is reproduced (tested at 6 seeds, where the real method is).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from posttrain.estimators import evolution_strategy, perturbed_params, threshold_update
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
from posttrain.simulators.es_toys import BanditArms, BanditParams, BanditSetup
from posttrain.theory.es_coverage import (
    categorical_entropy,
    exact_pass_at_k,
    expected_policy_js,
    policy_js_diversity,
    population_coverage,
    population_pass_gap,
    softmax_fisher_trace,
)

__all__ = ["CHECK", "Config", "arm_metrics", "lemma1_ratios", "population_diversity", "run"]
PASS = (-1.0, 1.0)  # a difference of two pass rates


@dataclass(frozen=True)
class Config(BanditSetup):
    seeds: int = 12  # power plan (docstring): a share 0.9 (spec: "in every seed") needs 12 for 80%
    t_eval: float = 0.6  # spec 7
    ks: tuple[int, ...] = (1, 2, 4, 16, 64)  # spec 7
    threshold_fraction: float = 0.5  # spec 7 criterion 7
    sequential: bool = True  # spec 7 criterion 6
    lemma_sigmas: tuple[float, ...] = (0.1, 0.03, 0.01)  # spec 7: Lemma 1 check
    lemma_populations: tuple[int, ...] = (2, 8, 32)  # spec 7: Lemma 1 check
    lemma_draws: int = 4000  # spec 7: Lemma 1 check
    margin_reason: str = "docs: methods/es_coverage.md pass criteria (calibrated effect sizes 1.5-3x the margins)"

    @classmethod
    def smoke(cls) -> Config:
        return cls(seeds=2, n_train=1024, n_test=512, steps=60, lemma_draws=500, sequential=False)


def arm_metrics(arms: BanditArms, name: str, *, t_eval: float, ks: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """Exact test-pool pass@k (``"pass@k"``) and mean policy entropy (``"entropy"``) per seed."""
    return _metrics(arms, arms.arms[name], t_eval=t_eval, ks=ks)


def _metrics(arms: BanditArms, params: BanditParams, *, t_eval: float, ks: tuple[int, ...]) -> dict[str, torch.Tensor]:
    p = arms.test.success(params, temperature=t_eval)  # [S, X]
    out = {f"pass@{k}": exact_pass_at_k(p, k=k).mean(-1) for k in ks}
    out["entropy"] = categorical_entropy(torch.softmax(arms.test.logits(params) / t_eval, dim=-1)).mean(-1)
    return out


def _thresholded(es: BanditParams, base: BanditParams, fraction: float) -> BanditParams:
    """Zero the ``fraction`` smallest-|delta| changed coordinates of each seed's ES delta."""
    out: dict[str, list[torch.Tensor]] = {n: [] for n in es}
    for s in range(es["b"].shape[0]):
        one = {n: t[s] for n, t in es.items()}
        ref = {n: t[s] for n, t in base.items()}
        delta = torch.cat([(one[n] - ref[n]).abs().reshape(-1) for n in one])
        changed = delta[delta > 0]
        tau = float(torch.quantile(changed, fraction)) if changed.numel() else 0.0  # no update: nothing to zero
        for n, t in threshold_update(one, ref, tau=tau).items():
            out[n].append(t)
    return {n: torch.stack(v) for n, v in out.items()}


def lemma1_ratios(
    *, sigmas: tuple[float, ...], populations: tuple[int, ...], draws: int, seed: int = 0, n_arms: int = 8
) -> dict[tuple[float, int], float]:
    r"""Monte-Carlo mean of $\mathrm{JS}^{pol}_N$ over ``draws`` populations / Lemma 1's leading term.

    Softmax bandit with logits $\theta\sim\mathcal N(0, I_8)$, members $\theta+\sigma\varepsilon_i$;
    $\operatorname{tr}\mathcal I = 1-\sum_j\pi_j^2$ w.r.t. the logits.
    """
    gen = torch.Generator().manual_seed(seed)
    theta = torch.randn(n_arms, generator=gen, dtype=torch.float64)
    trace = softmax_fisher_trace(torch.softmax(theta, -1))
    out = {}
    for sigma in sigmas:
        for n in populations:
            eps = torch.randn(draws, n, n_arms, generator=gen, dtype=torch.float64)
            js = policy_js_diversity(torch.softmax(theta + sigma * eps, dim=-1))  # [draws]
            out[(sigma, n)] = float(js.mean() / expected_policy_js(trace, sigma=sigma, population=n))
    return out


def population_diversity(
    arms: BanditArms, name: str, *, population: int, sigma: float, t_eval: float
) -> dict[str, torch.Tensor]:
    """Lemma 2 on the test pool: JS_succ of ``population`` members ``theta + sigma eps`` around an arm's endpoint.

    Returns per-seed ``js_success`` and the gain ``pass_population - pass_same`` (one response per member).
    """
    es = evolution_strategy(population=population, sigma=sigma, lr=0.0)
    centre = arms.arms[name]
    members = [
        perturbed_params({k: v[s] for k, v in centre.items()}, es.ask(es.init(10_000 + s)), sigma=sigma)
        for s in range(centre["b"].shape[0])
    ]
    batched = {k: torch.stack([mem[k] for mem in members]) for k in ("b", "W")}  # [S, P, ...]
    success = arms.test.success(batched, temperature=t_eval).transpose(-1, -2)  # [S, X, P]
    cov = population_coverage(success)
    return {"js_success": cov.js_success, "gain": population_pass_gap(success).mean(-1)}


def run(config: Config) -> Result:
    names = ("base", "grpo", "es", "es_expected") + (("es_then_grpo", "grpo_then_es") if config.sequential else ())
    arms = config.train_arms(names)
    m = {a: arm_metrics(arms, a, t_eval=config.t_eval, ks=config.ks) for a in names}
    thr = _metrics(
        arms, _thresholded(arms.arms["es"], arms.arms["base"], config.threshold_fraction), t_eval=config.t_eval, ks=(1,)
    )

    def vals(t: torch.Tensor) -> tuple[float, ...]:
        return tuple(float(x) for x in t)

    kmax = f"pass@{max(config.ks)}"
    metrics = [Metric(f"{a} {key}", vals(v)) for a in names for key, v in m[a].items()]
    metrics.append(
        Metric(
            "es thresholded pass@1",
            vals(thr["pass@1"]),
            note=f"{config.threshold_fraction:.0%} smallest |delta| zeroed",
        )
    )
    delta_norm = {
        a: torch.stack([(arms.arms[a][n] - arms.arms["base"][n]).flatten(1).square().sum(1) for n in ("b", "W")])
        .sum(0)
        .sqrt()
        for a in ("es", "grpo")
    }
    metrics.append(
        Metric(
            "||delta_ES|| / ||delta_GRPO||",
            vals(delta_norm["es"] / delta_norm["grpo"]),
            paper_value=40.7,
            note="paper: relative L2 drift ratio, Qwen-1.5B",
        )
    )
    for (sigma, n), r in lemma1_ratios(
        sigmas=config.lemma_sigmas, populations=config.lemma_populations, draws=config.lemma_draws
    ).items():
        metrics.append(Metric(f"Lemma 1 ratio sigma={sigma} N={n}", (r,), paper_value=1.0))

    d = {a: {k: v.numpy() for k, v in m[a].items()} for a in names}
    es, grpo, base = d["es"], d["grpo"], d["base"]
    reason = config.margin_reason

    def seeds(name: str, d: object, margin: float, **kw: object) -> Comparison:
        """ "In every seed" / "in >= 4/5 of the seeds" as the quantile claim "in most seeds" (share 1/2)."""
        return quantile_criterion(name, d, margin=margin, share=MEDIAN, reason=kw.pop("reason", reason), **kw)  # type: ignore[arg-type]

    joint = np.minimum(es["pass@1"] - base["pass@1"] - 0.10, es[kmax] - grpo[kmax] - 0.05)
    comps = [
        quantile_criterion(
            f"ES - Base Pass@1 > 0.10 and ES - GRPO {kmax} > 0.05", joint, margin=0.0, share=MEDIAN, role=Role.PRIMARY,
            reason=reason + ": criteria 1 and 2 together on each seed ('ES improves Pass@1 while attaining higher "
            "Pass@K than GRPO'), in most seeds",
        ),
        seeds("ES - Base Pass@1", es["pass@1"] - base["pass@1"], 0.10),
        seeds(f"ES - GRPO {kmax} - 0.05", es[kmax] - grpo[kmax], 0.05),
        mean_criterion(f"ES - GRPO {kmax} (mean)", m["es"][kmax] - m["grpo"][kmax], margin=0.08, reason=reason,
                       bounds=PASS),
        seeds(f"Base - GRPO {kmax}", base[kmax] - grpo[kmax], 0.10),
        seeds("0.5 H_Base - H_GRPO", 0.5 * base["entropy"] - grpo["entropy"], 0.0),
        seeds("H_ES - H_GRPO", es["entropy"] - grpo["entropy"], 0.2),
        seeds("0.05 - |ES - GRPO| Pass@1", 0.05 - abs(es["pass@1"] - grpo["pass@1"]), 0.0),
    ]  # fmt: skip
    comps += [
        seeds(f"crossover: ES - GRPO pass@{k}", es[f"pass@{k}"] - grpo[f"pass@{k}"], 0.0) for k in config.ks if k > 1
    ]
    secondary = "secondary criterion (docs: methods/es_coverage.md: 6-7), reported"
    if config.sequential:
        lo, hi = (
            [min(a, b) for a, b in zip(es[kmax], grpo[kmax], strict=True)],
            [max(a, b) for a, b in zip(es[kmax], grpo[kmax], strict=True)],
        )
        for arm in ("es_then_grpo", "grpo_then_es"):
            inside = [0.02 + min(x - a, b - x) for x, a, b in zip(d[arm][kmax], lo, hi, strict=True)]
            comps.append(seeds(f"{arm} {kmax} within [GRPO, ES] +-0.02", inside, 0.0, reason=secondary,
                               role=Role.CONTEXT))  # fmt: skip
    comps.append(seeds("0.01 - |thresholded - ES| Pass@1", 0.01 - abs(thr["pass@1"].numpy() - es["pass@1"]), 0.0,
                       reason=secondary, role=Role.CONTEXT))  # fmt: skip
    comps.append(
        mean_criterion(f"ES - Base {kmax}", m["es"][kmax] - m["base"][kmax], margin=0.0, bounds=PASS, role=Role.CONTEXT,
                       reason="paper's claim; unreachable in this toy (docs: methods/es_coverage.md), reported")
    )  # fmt: skip
    comps.append(
        mean_criterion("ES(expected fitness) - ES(greedy) Pass@1", m["es_expected"]["pass@1"] - m["es"]["pass@1"],
                       margin=0.0, bounds=PASS, role=Role.CONTEXT, reason="ablation, reported")
    )  # fmt: skip
    for arm in ("es", "grpo"):
        div = population_diversity(arms, arm, population=config.population, sigma=config.sigma, t_eval=config.t_eval)
        metrics.append(Metric(f"{arm} endpoint population JS_succ (Lemma 2)", vals(div["js_success"])))
        metrics.append(Metric(f"{arm} endpoint population P_pop - P_same (Lemma 2)", vals(div["gain"])))
    worst_lemma = max(abs(mt.per_seed[0] - 1.0) for mt in metrics if mt.name.startswith("Lemma 1"))
    return Result(
        metrics=tuple(metrics),
        comparisons=tuple(comps),
        notes=f"max |Lemma-1 ratio - 1| = {worst_lemma:.3f} (spec: within 0.05 at {config.lemma_draws} draws)",
        extra={"lemma1_max_abs_error": worst_lemma},
    )


def _mutant_test_config() -> Config:
    """The smallest size at which the real method is reproduced (6 seeds: the share bound's floor)."""
    return dataclasses.replace(Config.smoke(), seeds=6)


CHECK = register_check(
    PaperCheck(
        id="05",
        paper="Ba et al. 2026, Understanding Evolution Strategies for LLM Reasoning, arXiv:2608.27351",
        claim="ES keeps large-K Pass@K above GRPO (whose entropy collapses) at matched Pass@1",
        abstract=(
            "Empirically, unlike GRPO, which exhibits entropy collapse, ES improves Pass@1 while attaining higher "
            "Pass@K than GRPO."
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
