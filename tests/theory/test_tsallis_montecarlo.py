"""The Tsallis bias and variance closed forms against Monte-Carlo draws of the GARL and PAFT estimators.

Toy: a softmax bandit with A = 5 arms and binary rewards (`posttrain.simulators.bandits`), success
probability P. Each replicate draws M arms, turns them into weights ``log w = log r`` and calls
`garl_weights` (``baseline="none"``) or `paft_weights` (S = 1 resample); the bandit gradient of the
weights is $\\hat g = \\frac1M\\sum_m A_m(e_{a_m}-\\pi)$. The exact answers (`posttrain.theory.tsallis`):

- $E[\\hat g] = E[\\bar w^{1-q}]\\,\\nabla P/P$ with $M(P^{1-q}-E[\\bar w^{1-q}])$ = `gradient_scale_deficit`
  (checked on its projection on $\\nabla P/P$, and componentwise);
- $E[\\bar w^{-q}\\mid k>0]-P^{-q}$ = `amplification_bias` (GARL's ``amplification`` diagnostic);
- with one rewarded arm $\\hat g=\\bar w^{1-q}(e_c-\\pi)$, whose scale has $M\\,\\mathrm{Var}$ =
  `gradient_scale_variance`.

Tolerance: |MC - exact| <= Z standard errors, Z = 4 (two-sided 6e-5 per comparison; about 60
comparisons, so a family-wise false alarm near 0.4%). Each formula's mutants (x 1.05, x 0.95, a sign
flip, the delta-method limit used outside its range, the q = 1 deficit that forgets the k = 0 prompts)
must be rejected at the same Z by at least one cell: the test would fail with them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache

import pytest
import torch

from posttrain.estimators import garl_weights, paft_weights
from posttrain.simulators.bandits import sample_arms
from posttrain.theory import tsallis as th

Z = 4.0
N = 40_000
"""Monte-Carlo replicates (batches of M draws) per cell."""
QS = (0.0, 0.25, 0.75, 1.0)
SPLIT = (0.7, 0.3)
"""How P is shared by the two rewarded arms (unequal, so PAFT's resampling adds variance)."""

Formula = Callable[[float, float, int], float]


def _bandit(p: float, split: tuple[float, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``[A]`` with rewarded arms of probabilities ``p * split`` and 5 - len(split) equal wrong arms."""
    wrong = 5 - len(split)
    probs = torch.tensor([p * s for s in split] + [(1 - p) / wrong] * wrong, dtype=torch.float64)
    return probs.log(), torch.arange(5) < len(split)


@cache
def _draws(p: float, m: int, split: tuple[float, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(arms [N, M], log_w [N, M], uniforms [N, 1])``: N replicate batches from one seeded generator."""
    logits, correct = _bandit(p, split)
    gen = torch.Generator().manual_seed(seed)
    arms = sample_arms(logits.expand(N, -1), m, gen)
    log_w = torch.where(correct[arms], 0.0, -math.inf).to(torch.float64)
    return arms, log_w, torch.rand(N, 1, generator=gen, dtype=torch.float64)


def _gradients(estimator: str, p: float, q: float, m: int, split: tuple[float, ...]) -> torch.Tensor:
    """``[N, A]`` bandit gradients $\\frac1M\\sum_m A_m(e_{a_m}-\\pi)$ of the estimator's trace weights."""
    arms, log_w, u = _draws(p, m, split, seed=len(split))
    if estimator == "garl":
        trace = garl_weights(log_w, q=q, baseline="none").trace
    else:
        trace = paft_weights(log_w, u, q=q).trace
    pi = _bandit(p, split)[0].softmax(-1)
    summed = torch.zeros(N, pi.numel(), dtype=torch.float64).scatter_add_(1, arms, trace)
    return summed / m - trace.mean(1, keepdim=True) * pi


def _direction(p: float, split: tuple[float, ...]) -> torch.Tensor:
    """$\\nabla P/P = \\pi_C/P - \\pi$ (softmax logits), the direction of every unbiased gradient of $\\ell_q$."""
    logits, correct = _bandit(p, split)
    pi = logits.softmax(-1)
    return torch.where(correct, pi, 0.0) / p - pi


def _mean_se(x: torch.Tensor) -> tuple[float, float]:
    return float(x.mean()), float(x.std() / math.sqrt(x.numel()))


@cache
def deficit_mc(estimator: str, p: float, q: float, m: int) -> tuple[float, float]:
    """Monte-Carlo $M(P^{1-q}-E[s])$, $s = \\hat g\\cdot u/|u|^2$, and its standard error."""
    u = _direction(p, SPLIT)
    mean, se = _mean_se(_gradients(estimator, p, q, m, SPLIT) @ u / (u @ u))
    return m * (p ** (1 - q) - mean), m * se


@cache
def variance_mc(estimator: str, p: float, q: float, m: int) -> tuple[float, float]:
    """Monte-Carlo $M\\,\\mathrm{Var}[s]$ with one rewarded arm, and its standard error $\\sqrt{(\\mu_4-\\sigma^4)/N}$."""
    u = _direction(p, (1.0,))
    s = _gradients(estimator, p, q, m, (1.0,)) @ u / (u @ u)
    c = s - s.mean()
    var = float(c.pow(2).mean())
    return m * var, m * math.sqrt(float(c.pow(4).mean() - var**2) / N)


@cache
def amplification_mc(p: float, q: float, m: int) -> tuple[float, float]:
    """Monte-Carlo $E[\\bar w^{-q}\\mid k>0]-P^{-q}$ from GARL's ``amplification`` diagnostic."""
    log_w = _draws(p, m, SPLIT, seed=len(SPLIT))[1]
    out = garl_weights(log_w, q=q, baseline="none")
    mean, se = _mean_se(out.amplification[out.log_w_bar > -math.inf])
    return mean - p ** (-q), se


DEFICIT_CELLS = [(p, q, m) for p, m in ((0.2, 8), (0.05, 16)) for q in QS]
AMPLIFICATION_CELLS = [(p, q, m) for p, m in ((0.3, 16), (0.2, 8)) for q in QS[1:]]
VARIANCE_CELLS = [(p, q, m) for p, m in ((0.2, 8), (0.05, 16)) for q in QS]


def _z_scores(
    measure: Callable[[float, float, int], tuple[float, float]], formula: Formula, cells: list[tuple[float, float, int]]
) -> list[float]:
    out = []
    for p, q, m in cells:
        est, se = measure(p, q, m)
        out.append((est - formula(p, q, m)) / se if se > 0 else (0.0 if est == formula(p, q, m) else math.inf))
    return out


def _scaled(f: Formula, c: float) -> Formula:
    return lambda p, q, m: c * f(p, q, m)


def _forgets_empty_prompts(p: float, q: float, m: int) -> float:
    """The deficit computed with $0^{1-q}$ taken literally (1 at q = 1), as if a k = 0 prompt kept weight 1."""
    k = torch.arange(m + 1, dtype=torch.float64)
    pmf = torch.distributions.Binomial(m, torch.tensor(p, dtype=torch.float64)).log_prob(k).exp()
    return float(m * (p ** (1 - q) - (pmf * (k / m) ** (1 - q)).sum()))


@pytest.mark.parametrize("estimator", ["garl", "paft"])
def test_bias_of_the_gradient_is_the_scale_deficit(estimator: str) -> None:
    z = _z_scores(lambda p, q, m: deficit_mc(estimator, p, q, m), th.gradient_scale_deficit, DEFICIT_CELLS)
    assert max(map(abs, z)) <= Z, dict(zip(DEFICIT_CELLS, z, strict=True))


def test_mean_gradient_points_along_grad_p_with_the_deficit_scale() -> None:
    """Componentwise: $E[\\hat g] = (P^{1-q}-D/M)\\,\\nabla P/P$ for both estimators (not only its projection)."""
    for estimator in ("garl", "paft"):
        for p, q, m in DEFICIT_CELLS[::3]:
            g = _gradients(estimator, p, q, m, SPLIT)
            exact = (p ** (1 - q) - th.gradient_scale_deficit(p, q, m) / m) * _direction(p, SPLIT)
            se = g.std(0) / math.sqrt(N)
            assert bool(((g.mean(0) - exact).abs() <= Z * se + 1e-15).all()), (estimator, p, q, m)


def test_scale_deficit_mutants_are_rejected() -> None:
    mutants: dict[str, Formula] = {
        "x 1.05": _scaled(th.gradient_scale_deficit, 1.05),
        "x 0.95": _scaled(th.gradient_scale_deficit, 0.95),
        "k = 0 prompts kept at q = 1": _forgets_empty_prompts,
        "delta-method limit": lambda p, q, m: th.gradient_scale_deficit_limit(p, q),
    }
    for name, formula in mutants.items():
        z = _z_scores(lambda p, q, m: deficit_mc("garl", p, q, m), formula, DEFICIT_CELLS)
        assert max(map(abs, z)) > Z, name


def test_amplification_bias_matches_garl_amplification() -> None:
    z = _z_scores(amplification_mc, th.amplification_bias, AMPLIFICATION_CELLS)
    assert max(map(abs, z)) <= Z, dict(zip(AMPLIFICATION_CELLS, z, strict=True))
    mutants: dict[str, Formula] = {
        "sign flip": _scaled(th.amplification_bias, -1.0),
        "x 1.05": _scaled(th.amplification_bias, 1.05),
        "delta-method limit": th.amplification_bias_limit,
    }
    for name, formula in mutants.items():
        assert max(map(abs, _z_scores(amplification_mc, formula, AMPLIFICATION_CELLS))) > Z, name


@pytest.mark.parametrize("estimator", ["garl", "paft"])
def test_variance_of_the_gradient_scale(estimator: str) -> None:
    z = _z_scores(lambda p, q, m: variance_mc(estimator, p, q, m), th.gradient_scale_variance, VARIANCE_CELLS)
    assert max(map(abs, z)) <= Z, dict(zip(VARIANCE_CELLS, z, strict=True))
    mutants: dict[str, Formula] = {
        "x 1.05": _scaled(th.gradient_scale_variance, 1.05),
        "x 0.95": _scaled(th.gradient_scale_variance, 0.95),
        "delta-method limit": lambda p, q, m: th.gradient_scale_variance_limit(p, q),
    }
    for name, formula in mutants.items():
        z = _z_scores(lambda p, q, m: variance_mc(estimator, p, q, m), formula, VARIANCE_CELLS)
        assert max(map(abs, z)) > Z, name


def test_variance_limit_is_the_large_m_value() -> None:
    """The delta-method variance is the M -> infinity limit of the exact sum (P M >> 1)."""
    for p, q in ((0.3, 0.25), (0.1, 0.75)):
        assert math.isclose(
            th.gradient_scale_variance(p, q, 20_000), th.gradient_scale_variance_limit(p, q), rel_tol=1e-2
        )
