"""Paper 09: diffusion RL in path space (Xu, Zhang, Luo, Wang, He 2026, arXiv:2608.14430).

Claim (docs: methods/diffusion_path_space.md): the reverse-trajectory (Flow-GRPO, Itô-integral) and
forward-matching (AWM / DiffusionNFT, value-gradient) gradients estimate the *same* policy gradient;
their difference is variance.

Abstract sentence tested (primary): "This identifies the empirical gap between these method families
as a variance-reduction effect rather than a difference in RL principle."

Toy: p_0 = 1/2 N(-2, 0.5^2) + 1/2 N(2, 0.5^2), exact base velocity; reward sigma(3 x_0); advantage
R - b with b = E[R] from 2e5 exact draws of p_0; sampler started at t = 0.98 from the exact marginal
q_0.98, N Euler-Maruyama steps to t = 0; perturbation v_theta = v + theta h(t), h = 1{0.2 < t <= 0.8}.
The reference is **exact**: g* = dE[R]/dtheta of the discretised chain that produced the rollouts, by
propagating its law on a grid (`posttrain.simulators.sde_exact.chain_policy_gradient`, deterministic,
relative error ~1e-7; the spec's finite-difference reference had a standard error of 1.4% of |g*|),
and the continuous-time gradient by quadrature (`value_gradient_integral`, reported). Criteria:

1. Itô-full and the deterministic value-gradient estimator Det(10) are unbiased for g* (spec: 3 SE of
   the pooled estimate + 2% / 4% of |g*|);
2. at a matched budget of 10 trained time steps the Itô estimator's per-rollout variance is >= 4x
   Det's, and that ratio grows from N = 50 to N = 200 Euler steps (O(1/dr));
3. the group KDE estimator (reconstructed) cuts per-rollout-equivalent variance to <= 0.25x Det;
4. its bias shrinks with the group size (K = 64 vs K = 8) and is <= 5% at K = 64;
5. with eta_t = 0.7 (1 - t) the forward-posterior estimator is off by > 5% while Itô stays unbiased.

Simplifications (stated): torch float64 instead of numpy; in criterion 5 the deterministic estimator
is the sampler-agnostic forward-matching one (drift sensitivity -2, as AWM / NFT use it), and the
plug-in with the sampler's -(1 + eta_t) is reported beside it; the paper's headline numbers (67.5%
KDE variance reduction, 2-4x faster training on SD3.5 / Qwen-Image) are not checked, the toy has no
training. Exact expectations (`posttrain.simulators.sde_exact`): g* = -0.2047 at N = 100, the
continuous-time gradient -0.2068; Det's expectation on the chain's x_0 is -0.2031 (0.8% from g*: its
value-gradient identity holds for the exact p_0, the chain's law differs at O(dr)).

Primary endpoint: both families estimate the same gradient: in most seeds each of Itô-full and Det(10)
(80,000 rollouts per seed) lies within 2.5% of the exact g* (``P(0.025 - max |est/g* - 1| > 0) > 1/2``,
Clopper-Pearson). 2.5% sits between the discretisation gap of Det's expectation (0.8%) and the 5% bias
a wrong estimator must not hide. Criteria 1-5 are secondary (the variance ratio of criterion 2 is the
abstract's "variance-reduction effect"; it cannot see a bias).

Power plan: the per-seed standard errors at 80,000 rollouts (per-rollout variances 0.34 and 0.29 from
the pilot, seeds 10000-10009) are 1.0% and 0.94% of |g*|; with Det's exact 0.8% offset, a seed clears
the 2.5% band with probability 0.96 (Itô 0.99, Det 0.97), and 10 seeds then give 93% power (exact
binomial: 9 of 10 must clear). The pilot cleared 10/10 (largest error 2.2%, mean 1.3%). At the spec's
20,000 rollouts the share would be 0.62 and 10 seeds would have 6% power.

Mutants: ``ito-x1.05`` and ``det-x1.05`` (one family's estimates multiplied by 1.05, a 5% bias):
contradicted on the pilot seeds (0/10 seeds clear each). The variance ratio alone cannot catch them
(it is invariant to the Itô scaling and moves 9% under Det's).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import torch
from torch import Tensor

from posttrain.estimators import (
    deterministic_value_gradient,
    ito_policy_gradient,
    kde_value_gradient,
    value_gradient_policy_gradient,
)
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
from posttrain.simulators.sde import EtaSchedule, GaussianMixture, Paths, forward_noise, simulate_flow_sde
from posttrain.simulators.sde_exact import chain_policy_gradient, value_gradient_integral

_DT = torch.float64
CLT = "per-seed means of thousands of rollouts' gradient estimates: near normal (central limit), so median = mean"


class Estimator(StrEnum):
    """The gradient estimators a mutant can bias (`Config.bias`)."""

    ITO = "ito"  # Ito-full and Ito-sub (Flow-GRPO's family)
    DET = "det"  # the deterministic value-gradient Det(K_t) (AWM / DiffusionNFT's family)


@dataclass(frozen=True)
class Config:
    seeds: int = 10  # power plan (module docstring): per-seed share 0.96 at 80,000 rollouts -> 93% power
    first_seed: int = 0  # evaluation seeds first_seed .. first_seed + seeds - 1; the pilot used 10_000 ..
    rollouts: int = 80_000  # power plan: per-seed SE ~0.9% of |g|, well inside the primary's 2.5% (spec: 20,000)
    side_rollouts: int = 20_000  # spec (M = 20,000): the N sweep and the eta = 0.7(1-t) runs
    steps: int = 100  # spec (N = 100 Euler-Maruyama steps)
    steps_sweep: tuple[int, int] = (50, 200)  # spec criterion 2 (ratio grows from N = 50 to 200)
    t_start: float = 0.98  # spec (start from the exact marginal at t = 0.98)
    window: tuple[float, float] = (0.2, 0.8)  # spec (h = 1{0.2 < t <= 0.8})
    trained_steps: int = 10  # spec (K_t, the matched training-timestep budget)
    kde_groups: tuple[int, ...] = (8, 16, 64)  # spec (K = 8, 64; 16 for the variance criterion)
    kde_variance_group: int = 16  # spec criterion 3
    reward_slope: float = 3.0  # spec (R = sigmoid(3 x_0))
    baseline_samples: int = 200_000  # spec (b = E[R] from 2e5 exact draws)
    alt_eta_slope: float = 0.7  # spec criterion 5 (eta_t = 0.7 (1 - t))
    primary_tol: float = 0.025  # pre-registered: half the 5% bias a wrong estimator must not hide, above the
    #   discretisation gap between Det's expectation and the chain's gradient (0.8%, exact; docstring)
    z: float = 3.0  # spec criterion 1 (3 standard errors)
    ito_rel_tol: float = 0.02  # spec criterion 1
    det_rel_tol: float = 0.04  # spec criterion 1 (4% allows Euler-Maruyama discretisation)
    min_variance_ratio: float = 4.0  # spec criterion 2
    kde_variance_fraction: float = 0.25  # spec criterion 3
    kde_bias_tol: float = 0.05  # spec criterion 4
    caveat_rel: float = 0.05  # spec criterion 5
    plot_batches: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024)  # figure only
    margin_reason: str = (
        "docs: methods/diffusion_path_space.md pass criteria (tolerances from the paper, not tuned here)"
    )
    bias: tuple[tuple[Estimator, float], ...] = ()  # mutants: (estimator, factor) multiplies its estimates

    @classmethod
    def smoke(cls) -> Config:
        return cls(
            seeds=2, rollouts=2048, side_rollouts=2048, baseline_samples=20_000, steps_sweep=(25, 100),
            plot_batches=(16, 64, 256),
        )  # fmt: skip

    @classmethod
    def mutant_test(cls) -> Config:
        """The mutant tests' size: the full primary (its main runs and seeds), small side runs (drawn after them)."""
        return cls(side_rollouts=2048, steps_sweep=(25, 50), kde_groups=(8, 16), plot_batches=(16, 64))


def _h(t: Tensor, cfg: Config) -> Tensor:
    return ((t > cfg.window[0]) & (t <= cfg.window[1])).to(t.dtype)


def _simulate(
    gm: GaussianMixture,
    cfg: Config,
    n: int,
    steps: int,
    eta: EtaSchedule,
    gen: torch.Generator,
    theta: float = 0.0,
    x_init: Tensor | None = None,
    noise: Tensor | None = None,
) -> Paths:
    def velocity(x: Tensor, t: Tensor) -> Tensor:
        return gm.velocity(x, t) + theta * _h(t, cfg)

    x_init = gm.sample_t(n, cfg.t_start, generator=gen) if x_init is None else x_init
    return simulate_flow_sde(velocity, x_init, t_start=cfg.t_start, steps=steps, eta=eta, noise=noise, generator=gen)


def _biased(name: Estimator) -> Mutant:
    return Mutant(
        f"{name.value}-x1.05",
        f"the {name.value} estimator family with a 5% bias (its estimates multiplied by 1.05)",
        lambda c: dataclasses.replace(c, bias=((name, 1.05),)),
        test_config=Config.mutant_test,
    )


def _reward(x0: Tensor, cfg: Config) -> Tensor:
    return torch.sigmoid(cfg.reward_slope * x0[:, 0])


def _per_rollout(
    gm: GaussianMixture,
    cfg: Config,
    steps: int,
    eta: EtaSchedule,
    baseline: float,
    gen: torch.Generator,
    *,
    m: int,
    kde: bool,
) -> dict[str, Tensor]:
    """Per-rollout gradient estimates ``[M]`` (KDE: per-group estimates ``[M / K]``) on one seed, ``m`` rollouts.

    A mutant's ``cfg.bias`` multiplies the estimates of the named family (Ito-full and Ito-sub, or Det)."""
    kt = cfg.trained_steps
    paths = _simulate(gm, cfg, m, steps, eta, gen)
    t_steps = 1.0 - paths.grid[:-1]
    x0 = paths.states[:, -1]
    adv = _reward(x0, cfg) - baseline
    drift_grad = (-(1.0 + eta(t_steps)) * _h(t_steps, cfg)).expand(m, steps)[..., None]
    out = {"ito_full": ito_policy_gradient(adv, drift_grad, paths.diffusion, paths.noise, paths.dr)}
    # Itô-sub: K_t window steps drawn uniformly without replacement, rescaled by N_window / K_t.
    in_window = _h(t_steps, cfg).bool()
    n_window = int(in_window.sum())
    pick = torch.rand(m, n_window, generator=gen, dtype=_DT).argsort(-1)[:, :kt]
    sub = torch.zeros(m, n_window, dtype=_DT).scatter_(1, pick, n_window / kt)
    weights = torch.zeros(m, steps, dtype=_DT)
    weights[:, in_window] = sub
    out["ito_sub"] = ito_policy_gradient(adv, drift_grad, paths.diffusion, paths.noise, paths.dr, step_weights=weights)
    # Det: K_t stratified times in the window, fresh noise; g = -int (1+eta) h dV/dx dt.
    lo, hi = cfg.window
    width = (hi - lo) / kt
    t = lo + (torch.arange(kt, dtype=_DT) + 1.0 - torch.rand(m, kt, generator=gen, dtype=_DT)) * width
    x_t, v = forward_noise(x0, t, torch.randn(m, kt, 1, generator=gen, dtype=_DT))
    vg_weight = (-(1.0 + eta(t)))[..., None]  # d mu / d theta on the window, [M, K_t, 1]
    dt = torch.full((kt,), width, dtype=_DT)
    det_grad = deterministic_value_gradient(adv, v, gm.velocity(x_t, t), t)
    out["det"] = value_gradient_policy_gradient(vg_weight, det_grad, dt)
    # The forward-matching loss (AWM / NFT) does not know the sampler: it uses d mu / d v = -2 (eta = 1).
    out["det_fm"] = value_gradient_policy_gradient(torch.full_like(vg_weight, -2.0), det_grad, dt)
    if kde:
        for k in cfg.kde_groups:
            g = m // k
            est = kde_value_gradient(
                x_t[: g * k].reshape(g, k * kt, 1),
                t[: g * k].reshape(g, k * kt),
                x0[: g * k].reshape(g, k, 1),
                adv[: g * k].reshape(g, k),
            )
            per = value_gradient_policy_gradient(vg_weight[: g * k], est.grad.reshape(g * k, kt, 1), dt)
            out[f"kde_{k}"] = per.reshape(g, k).mean(-1)
    family = {Estimator.ITO: ("ito_full", "ito_sub"), Estimator.DET: ("det", "det_fm")}
    for name, factor in cfg.bias:
        for key in family[name]:
            out[key] = factor * out[key]
    return out


def _batch_variance(values: Tensor, batch: int) -> float:
    """Variance of the mean of ``batch`` consecutive values (empirical, across batches)."""
    n = values.numel() // batch
    return float(values[: n * batch].reshape(n, batch).mean(-1).var()) if n >= 2 else math.nan


def run(cfg: Config) -> Result:
    gm = GaussianMixture.bimodal_1d()
    eta1, eta_alt = EtaSchedule(1.0), EtaSchedule(0.0, cfg.alt_eta_slope)
    baseline = float(_reward(gm.sample(cfg.baseline_samples, generator=torch.Generator().manual_seed(99)), cfg).mean())

    def reward(x: Tensor) -> Tensor:
        return torch.sigmoid(cfg.reward_slope * x)

    g_star, g_alt = (
        chain_policy_gradient(gm, reward, window=cfg.window, t_start=cfg.t_start, steps=cfg.steps, eta=eta)
        for eta in (eta1, eta_alt)
    )
    g_cont = value_gradient_integral(gm, reward, window=cfg.window, eta=eta1)

    per_seed: list[dict[str, Tensor]] = []
    for s in range(cfg.first_seed, cfg.first_seed + cfg.seeds):
        gen = torch.Generator().manual_seed(10_000 + s)
        est = _per_rollout(gm, cfg, cfg.steps, eta1, baseline, gen, m=cfg.rollouts, kde=True)
        for n_steps in cfg.steps_sweep:
            sweep = _per_rollout(gm, cfg, n_steps, eta1, baseline, gen, m=cfg.side_rollouts, kde=False)
            est[f"ratio_{n_steps}"] = sweep["ito_sub"].var() / sweep["det"].var()
        alt = _per_rollout(gm, cfg, cfg.steps, eta_alt, baseline, gen, m=cfg.side_rollouts, kde=False)
        est["alt_ito"], est["alt_det"], est["alt_det_plugin"] = alt["ito_full"], alt["det_fm"], alt["det"]
        per_seed.append(est)

    def seeds_of(fn: Any) -> tuple[float, ...]:
        return tuple(float(fn(e)) for e in per_seed)

    var = {key: seeds_of(lambda e, k=key: e[k].var()) for key in ("ito_full", "ito_sub", "det")}
    kvar = cfg.kde_variance_group
    kde_var = seeds_of(lambda e: e[f"kde_{kvar}"].var() * kvar)  # per-rollout-equivalent
    ratio = tuple(a / b for a, b in zip(var["ito_sub"], var["det"], strict=True))
    lo_n, hi_n = cfg.steps_sweep
    kde_bias = {k: seeds_of(lambda e, k=k: e[f"kde_{k}"].mean() / g_star - 1.0) for k in cfg.kde_groups}

    metrics = [
        Metric("g* (exact, the chain's gradient, eta=1)", (g_star,), note="grid recursion; spec FD calibration -0.207"),
        Metric("g* (exact, eta=0.7(1-t))", (g_alt,), note="grid recursion; spec FD calibration -0.139"),
        Metric("g (continuous time, eta=1)", (g_cont,), note="quadrature: the N -> infinity limit of g*"),
        Metric("mean Ito-full", seeds_of(lambda e: e["ito_full"].mean())),
        Metric("mean Det(10)", seeds_of(lambda e: e["det"].mean())),
        Metric("var Ito-full", var["ito_full"], note="calibration ~0.33"),
        Metric("var Ito-sub(10)", var["ito_sub"], note="calibration ~2.6"),
        Metric("var Det(10)", var["det"], note="calibration ~0.29"),
        Metric("var Ito-sub/Det", ratio, note="calibration ~9"),
        Metric(f"var ratio N={lo_n}", seeds_of(lambda e: e[f"ratio_{lo_n}"])),
        Metric(f"var ratio N={hi_n}", seeds_of(lambda e: e[f"ratio_{hi_n}"])),
        Metric(f"var KDE({kvar}) per rollout", kde_var, note="calibration ~0.011"),
        *(
            Metric(f"rel bias KDE({k})", kde_bias[k], note="mean/g* - 1; calibration -13%/-6%/-1.5% for K=8/16/64")
            for k in cfg.kde_groups
        ),
        Metric("mean Ito-full, eta=0.7(1-t)", seeds_of(lambda e: e["alt_ito"].mean())),
        Metric("mean Det(10), eta=0.7(1-t)", seeds_of(lambda e: e["alt_det"].mean()), note="calibration ~-0.198"),
        Metric(
            "mean Det(10) with (1+eta_t) plug-in, eta=0.7(1-t)",
            seeds_of(lambda e: e["alt_det_plugin"].mean()),
            note="the sampler's drift sensitivity with the forward-posterior value gradient",
        ),
    ]

    def within(name: str, values: tuple[float, ...], ref: float, tol: float, reason: str) -> list[Comparison]:
        """Equivalence (two one-sided tests): the mean over seeds lies in ``ref +- tol``."""
        v = np.asarray(values)
        why = f"{cfg.margin_reason}; {reason}; two one-sided t-tests over seeds"
        return [
            mean_criterion(f"{name}: below ref + {tol:.3g}", ref + tol - v, margin=0.0, reason=why, assumption=CLT),
            mean_criterion(f"{name}: above ref - {tol:.3g}", v - (ref - tol), margin=0.0, reason=why, assumption=CLT),
        ]

    def unbiased(name: str, key: str, ref: float, rel: float) -> list[Comparison]:
        pooled = torch.cat([e[key] for e in per_seed])
        tol = cfg.z * float(pooled.std()) / math.sqrt(pooled.numel()) + rel * abs(ref)  # spec: 3 SE + rel |g*|
        why = f"|bias| <= {rel:.0%} |g*| + {cfg.z:g} SE of the pooled estimate; g* exact"
        return within(f"{name} (per-seed means)", seeds_of(lambda e: e[key].mean()), ref, tol, why)

    k_lo, k_hi = min(cfg.kde_groups), max(cfg.kde_groups)
    rel_error = {
        key: np.abs(np.asarray(seeds_of(lambda e, k=key: e[k].mean())) / g_star - 1.0) for key in ("ito_full", "det")
    }
    alt_off = {
        key: tuple(float(abs(e[key].mean() - g_alt) / abs(g_alt) - cfg.caveat_rel) for e in per_seed)
        for key in ("alt_det", "alt_det_plugin")
    }
    comparisons = [
        quantile_criterion(
            f"{cfg.primary_tol:.1%} - max |rel. error| of Ito-full, Det(10) vs exact g*",
            cfg.primary_tol - np.maximum(rel_error["ito_full"], rel_error["det"]),
            margin=0.0,
            share=MEDIAN,
            reason=(
                f"both families estimate the same gradient: in most seeds each estimate ({cfg.rollouts} rollouts) lies "
                f"within {cfg.primary_tol:.1%} of the exact g* (a 5% bias is not within)"
            ),
            role=Role.PRIMARY,
        ),
        *unbiased("Ito-full unbiased", "ito_full", g_star, cfg.ito_rel_tol),
        *unbiased("Det(10) unbiased", "det", g_star, cfg.det_rel_tol),
        quantile_criterion(
            "var Ito-sub(10) / var Det(10) - 4",
            [r - cfg.min_variance_ratio for r in ratio],
            margin=0.0,
            share=MEDIAN,
            reason=cfg.margin_reason,
        ),
        quantile_criterion(
            f"var ratio grows N={lo_n} -> {hi_n}",
            [float(e[f"ratio_{hi_n}"] - e[f"ratio_{lo_n}"]) for e in per_seed],
            margin=0.0,
            share=MEDIAN,
            reason=cfg.margin_reason,
        ),
        quantile_criterion(
            f"0.25 var Det - var KDE({kvar})",
            [cfg.kde_variance_fraction * d - k for d, k in zip(var["det"], kde_var, strict=True)],
            margin=0.0,
            share=MEDIAN,
            reason=cfg.margin_reason,
        ),
        mean_criterion(
            f"|bias KDE({k_lo})| - |bias KDE({k_hi})| (per seed)",
            np.abs(kde_bias[k_lo]) - np.abs(kde_bias[k_hi]),
            margin=0.0,
            reason=cfg.margin_reason,
            assumption=CLT,
        ),
        *within(f"rel bias KDE({k_hi})", kde_bias[k_hi], 0.0, cfg.kde_bias_tol, "|bias(K=64)| <= 5% |g*|"),
        mean_criterion(
            "eta=0.7(1-t): |Det - g*|/|g*| - 5% (per seed)",
            alt_off["alt_det"],
            margin=0.0,
            reason=cfg.margin_reason,
            assumption=CLT,
        ),
        mean_criterion(
            "eta=0.7(1-t): |Det plug-in - g*|/|g*| - 5% (per seed)",
            alt_off["alt_det_plugin"],
            margin=0.0,
            reason=cfg.margin_reason,
            assumption=CLT,
            role=Role.CONTEXT,
        ),
        *unbiased("eta=0.7(1-t): Ito-full unbiased", "alt_ito", g_alt, 0.0),
    ]
    curves = {
        name: [sum(_batch_variance(e[key], b) for e in per_seed) / cfg.seeds for b in cfg.plot_batches]
        for name, key in (("Ito-full", "ito_full"), ("Ito-sub(10)", "ito_sub"), ("Det(10)", "det"))
    }
    curves[f"KDE({kvar})"] = [
        sum(_batch_variance(e[f"kde_{kvar}"], b // kvar) for e in per_seed) / cfg.seeds for b in cfg.plot_batches
    ]
    extra = {
        "series": {
            "gradient variance vs rollouts": {
                "x": list(cfg.plot_batches),
                "lines": curves,
                "xlabel": "rollouts per gradient estimate",
                "ylabel": "variance of the estimate (across batches)",
                "logx": True,
                "logy": True,
            }
        },
        "g_star": g_star,
        "baseline": baseline,
    }
    return Result(
        metrics=tuple(metrics),
        comparisons=tuple(comparisons),
        notes="KDE per-rollout-equivalent variance = var(group estimate) x K.",
        extra=extra,
    )


CHECK = register_check(
    PaperCheck(
        id="09",
        paper="Xu et al. 2026, Designing RL for Diffusion Models: A Unified Path-Space View, arXiv:2608.14430",
        claim="Itô (Flow-GRPO) and value-gradient (AWM/NFT) estimators share one gradient; they differ in variance",
        abstract=(
            "This identifies the empirical gap between these method families as a variance-reduction effect "
            "rather than a difference in RL principle."
        ),
        config_type=Config,
        run=run,
        mutants=(_biased(Estimator.ITO), _biased(Estimator.DET)),
    )
)

if __name__ == "__main__":
    raise SystemExit(main_for(CHECK))
