"""Paper 09: diffusion RL in path space (Xu, Zhang, Luo, Wang, He 2026, arXiv:2608.14430).

Claim (toy version of the paper (docs: methods/diffusion_path_space.md)): the reverse-trajectory (Flow-GRPO, Itô-integral) and
forward-matching (AWM / DiffusionNFT, value-gradient) gradients estimate the *same* policy
gradient; their difference is variance. Checked on a 1-D flow with an exact velocity field:

1. Itô-full and the deterministic value-gradient estimator Det(10) are unbiased for the
   finite-difference gradient of the discretised chain (eta = 1 sampler);
2. at a matched budget of 10 trained time steps the Itô estimator's per-rollout variance is >= 4x
   Det's on every seed, and that ratio grows from N = 50 to N = 200 Euler steps (O(1/dr));
3. the group KDE estimator (reconstructed) cuts per-rollout-equivalent variance to <= 0.25x Det;
4. its bias shrinks with the group size (K = 64 vs K = 8) and is <= 5% at K = 64;
5. with eta_t = 0.7 (1 - t) the forward-posterior estimator is off by > 5% while Itô stays unbiased.

Environment: p_0 = 1/2 N(-2, 0.5^2) + 1/2 N(2, 0.5^2), exact base velocity; reward sigma(3 x_0);
advantage R - b with b = E[R] from 2e5 exact draws of p_0; sampler started at t = 0.98 from the
exact marginal q_0.98, N Euler-Maruyama steps to t = 0; perturbation v_theta = v + theta h(t),
h = 1{0.2 < t <= 0.8}; reference g* by a common-random-number central difference (theta = +-0.05).

Simplifications (stated): torch float64 instead of numpy; the reference's standard error is added in
quadrature to the estimator's in criteria 1 and 5 (our "3 SE" names only the estimator's; the
reference is itself a Monte Carlo estimate); in criterion 5 the deterministic estimator is the sampler-agnostic
forward-matching one (drift sensitivity -2, as AWM / NFT use it; our toy), and the plug-in with the
sampler's -(1 + eta_t) is reported beside it; our headline numbers (67.5% KDE variance
reduction, 2-4x faster training on SD3.5 / Qwen-Image) are not checked, the toy has no training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from posttrain.estimators.path_space import (
    deterministic_value_gradient,
    ito_policy_gradient,
    kde_value_gradient,
    value_gradient_policy_gradient,
)
from posttrain.paper_checks import register_check
from posttrain.paper_checks._seeds import seedwise
from posttrain.paper_checks.base import Comparison, Metric, PaperCheck, Result, mean_criterion
from posttrain.simulators.sde import EtaSchedule, GaussianMixture, Paths, forward_noise, simulate_flow_sde

_DT = torch.float64


@dataclass(frozen=True)
class Config:
    seeds: int = 10
    rollouts: int = 20_000
    steps: int = 100
    steps_sweep: tuple[int, int] = (50, 200)
    t_start: float = 0.98
    window: tuple[float, float] = (0.2, 0.8)
    trained_steps: int = 10  # K_t
    kde_groups: tuple[int, ...] = (8, 16, 64)
    kde_variance_group: int = 16
    reward_slope: float = 3.0
    baseline_samples: int = 200_000
    fd_paths: int = 100_000
    fd_seeds: int = 2
    fd_delta: float = 0.05
    alt_eta_slope: float = 0.7  # eta_t = 0.7 (1 - t)
    z: float = 3.0
    ito_rel_tol: float = 0.02
    det_rel_tol: float = 0.04
    min_variance_ratio: float = 4.0
    kde_variance_fraction: float = 0.25
    kde_bias_tol: float = 0.05
    caveat_rel: float = 0.05
    plot_batches: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024)
    margin_reason: str = (
        "docs: methods/diffusion_path_space.md pass criteria (tolerances from the paper, not tuned here)"
    )

    @classmethod
    def smoke(cls) -> Config:
        return cls(
            seeds=2,
            rollouts=2048,
            fd_paths=20_000,
            fd_seeds=1,
            baseline_samples=20_000,
            steps_sweep=(25, 100),
            plot_batches=(16, 64, 256),
        )


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


def _reward(x0: Tensor, cfg: Config) -> Tensor:
    return torch.sigmoid(cfg.reward_slope * x0[:, 0])


def _finite_difference(gm: GaussianMixture, cfg: Config, eta: EtaSchedule, seed: int) -> tuple[float, float]:
    """Common-random-number central difference of E[R] at theta = 0: (estimate, standard error)."""
    diffs = []
    for s in range(cfg.fd_seeds):
        gen = torch.Generator().manual_seed(seed + s)
        x_init = gm.sample_t(cfg.fd_paths, cfg.t_start, generator=gen)
        noise = torch.randn(cfg.fd_paths, cfg.steps, 1, generator=gen, dtype=_DT)
        ends = [
            _simulate(gm, cfg, cfg.fd_paths, cfg.steps, eta, gen, th, x_init, noise).states[:, -1]
            for th in (cfg.fd_delta, -cfg.fd_delta)
        ]
        diffs.append((_reward(ends[0], cfg) - _reward(ends[1], cfg)) / (2 * cfg.fd_delta))
    d = torch.cat(diffs)
    return float(d.mean()), float(d.std() / math.sqrt(d.numel()))


def _per_rollout(
    gm: GaussianMixture, cfg: Config, steps: int, eta: EtaSchedule, baseline: float, gen: torch.Generator, *, kde: bool
) -> dict[str, Tensor]:
    """Per-rollout gradient estimates ``[M]`` (KDE: per-group estimates ``[M / K]``) on one seed."""
    m, kt = cfg.rollouts, cfg.trained_steps
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
    return out


def _batch_variance(values: Tensor, batch: int) -> float:
    """Variance of the mean of ``batch`` consecutive values (empirical, across batches)."""
    n = values.numel() // batch
    return float(values[: n * batch].reshape(n, batch).mean(-1).var()) if n >= 2 else math.nan


def run(cfg: Config) -> Result:
    gm = GaussianMixture.bimodal_1d()
    eta1, eta_alt = EtaSchedule(1.0), EtaSchedule(0.0, cfg.alt_eta_slope)
    baseline = float(_reward(gm.sample(cfg.baseline_samples, generator=torch.Generator().manual_seed(99)), cfg).mean())
    g_star, g_se = _finite_difference(gm, cfg, eta1, 1_000)
    g_alt, g_alt_se = _finite_difference(gm, cfg, eta_alt, 2_000)

    per_seed: list[dict[str, Tensor]] = []
    for s in range(cfg.seeds):
        gen = torch.Generator().manual_seed(10_000 + s)
        est = _per_rollout(gm, cfg, cfg.steps, eta1, baseline, gen, kde=True)
        for n_steps in cfg.steps_sweep:
            sweep = _per_rollout(gm, cfg, n_steps, eta1, baseline, gen, kde=False)
            est[f"ratio_{n_steps}"] = sweep["ito_sub"].var() / sweep["det"].var()
        alt = _per_rollout(gm, cfg, cfg.steps, eta_alt, baseline, gen, kde=False)
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
        Metric("g* (finite difference, eta=1)", (g_star,), note=f"SE {g_se:.2g}; calibration -0.207"),
        Metric("g* (finite difference, eta=0.7(1-t))", (g_alt,), note=f"SE {g_alt_se:.2g}; calibration -0.139"),
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
            mean_criterion(f"{name}: below ref + {tol:.3g}", ref + tol - v, margin=0.0, reason=why),
            mean_criterion(f"{name}: above ref - {tol:.3g}", v - (ref - tol), margin=0.0, reason=why),
        ]

    def unbiased(name: str, key: str, ref: float, ref_se: float, rel: float) -> list[Comparison]:
        tol = cfg.z * ref_se + rel * abs(ref)  # the estimator's noise is in the t interval; the reference's here
        why = f"|bias| <= {rel:.0%} |g*| + {cfg.z:g} SE of the finite-difference g*"
        return within(f"{name} (per-seed means)", seeds_of(lambda e: e[key].mean()), ref, tol, why)

    k_lo, k_hi = min(cfg.kde_groups), max(cfg.kde_groups)
    alt_off = {
        key: tuple(float(abs(e[key].mean() - g_alt) / abs(g_alt) - cfg.caveat_rel) for e in per_seed)
        for key in ("alt_det", "alt_det_plugin")
    }
    comparisons = [
        *unbiased("Ito-full unbiased", "ito_full", g_star, g_se, cfg.ito_rel_tol),
        *unbiased("Det(10) unbiased", "det", g_star, g_se, cfg.det_rel_tol),
        seedwise(
            "var Ito-sub(10) / var Det(10) - 4",
            [r - cfg.min_variance_ratio for r in ratio],
            margin=0.0,
            margin_reason=cfg.margin_reason,
        ),
        seedwise(
            f"var ratio grows N={lo_n} -> {hi_n}",
            [float(e[f"ratio_{hi_n}"] - e[f"ratio_{lo_n}"]) for e in per_seed],
            margin=0.0,
            margin_reason=cfg.margin_reason,
        ),
        seedwise(
            f"0.25 var Det - var KDE({kvar})",
            [cfg.kde_variance_fraction * d - k for d, k in zip(var["det"], kde_var, strict=True)],
            margin=0.0,
            margin_reason=cfg.margin_reason,
        ),
        mean_criterion(
            f"|bias KDE({k_lo})| - |bias KDE({k_hi})| (per seed)",
            np.abs(kde_bias[k_lo]) - np.abs(kde_bias[k_hi]),
            margin=0.0,
            reason=cfg.margin_reason,
        ),
        *within(f"rel bias KDE({k_hi})", kde_bias[k_hi], 0.0, cfg.kde_bias_tol, "|bias(K=64)| <= 5% |g*|"),
        mean_criterion(
            "eta=0.7(1-t): |Det - g*|/|g*| - 5% (per seed)", alt_off["alt_det"], margin=0.0, reason=cfg.margin_reason
        ),
        mean_criterion(
            "eta=0.7(1-t): |Det plug-in - g*|/|g*| - 5% (per seed)",
            alt_off["alt_det_plugin"],
            margin=0.0,
            reason=cfg.margin_reason,
            asserted=False,
        ),
        *unbiased("eta=0.7(1-t): Ito-full unbiased", "alt_ito", g_alt, g_alt_se, 0.0),
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


register_check(
    PaperCheck(
        id="09",
        paper="Xu et al. 2026, Designing RL for Diffusion Models: A Unified Path-Space View, arXiv:2608.14430",
        claim="Itô (Flow-GRPO) and value-gradient (AWM/NFT) estimators share one gradient; they differ in variance",
        config_type=Config,
        run=run,
    )
)
