"""Spec 05 §8: population JS diversity, its verifier projection, Lemmas 1-3, Proposition 1, entropy relation."""

from __future__ import annotations

import math

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from posttrain.paper_checks.p05_es_coverage import lemma1_ratios
from posttrain.theory.es_coverage import (
    bernoulli_kl,
    categorical_entropy,
    exact_pass_at_k,
    first_order_entropy_change,
    pass_at_k_lower_bound,
    policy_js_diversity,
    population_coverage,
    population_pass,
    population_pass_gap,
    reward_weighted_success,
    success_js_diversity,
)

seeds = st.integers(0, 2**31 - 1)
F64 = torch.float64


def _members(seed: int, n: int, v: int, spread: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(spread * torch.randn(n, v, generator=g, dtype=F64), dim=-1)


@given(seed=seeds, n=st.integers(1, 10), v=st.integers(2, 12), spread=st.floats(0.0, 6.0))
def test_policy_js_bounds_and_entropy_identity(seed: int, n: int, v: int, spread: float) -> None:
    probs = _members(seed, n, v, spread)
    js = float(policy_js_diversity(probs))
    assert -1e-12 <= js <= math.log(n) + 1e-12
    mix = categorical_entropy(probs.mean(0))
    assert abs(float(mix - categorical_entropy(probs).mean()) - js) < 1e-10
    assert abs(float(policy_js_diversity(probs[:1].expand(n, v)))) < 1e-14  # the mixture mean rounds


@given(seed=seeds, n=st.integers(1, 10), v=st.integers(2, 12), spread=st.floats(0.0, 6.0))
def test_success_js_is_a_data_processing_contraction(seed: int, n: int, v: int, spread: float) -> None:
    probs = _members(seed, n, v, spread)
    mask = torch.rand(v, generator=torch.Generator().manual_seed(seed + 1)) < 0.5
    success = (probs * mask).sum(-1).clamp(0, 1)
    js_s = float(success_js_diversity(success))
    assert -1e-12 <= js_s <= float(policy_js_diversity(probs)) + 1e-10


@given(p=st.lists(st.floats(0, 1), min_size=1, max_size=20))
def test_population_pass_dominates_same_policy(p: list[float]) -> None:
    pop, same = population_pass(torch.tensor(p, dtype=F64))
    assert float(pop) >= float(same) - 1e-12
    assert abs(float(population_pass_gap(torch.tensor(p, dtype=F64))) - float(pop - same)) < 1e-12
    if max(p) - min(p) < 1e-12:
        assert abs(float(pop) - float(same)) < 1e-12


@given(seed=seeds, n=st.integers(2, 16), pbar=st.floats(0.1, 0.9), size=st.floats(1e-4, 1e-3))
def test_lemma2_local_relation(seed: int, n: int, pbar: float, size: float) -> None:
    """(P_pop - P_same) / (N pbar (1 - pbar)^(N-1) JS_succ) -> 1 for small, centred perturbations."""
    xi = torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=F64)
    xi = xi - xi.mean()
    assume(float(xi.abs().max()) > 1e-6)
    xi = xi / xi.abs().max() * size
    p = pbar + xi
    js = success_js_diversity(p)
    ratio = float(population_pass_gap(p) / (n * pbar * (1 - pbar) ** (n - 1) * js))
    assert 0.99 <= ratio <= 1.01


@given(seed=seeds, n=st.integers(1, 12))
def test_lemma3_weighted_success_identity(seed: int, n: int) -> None:
    g = torch.Generator().manual_seed(seed)
    w = torch.softmax(torch.randn(n, generator=g, dtype=F64) * 3, 0)  # random simplex weights
    p = torch.rand(n, generator=g, dtype=F64)
    cov = ((w - w.mean()) * (p - p.mean())).mean()
    assert abs(float(reward_weighted_success(w, p) - p.mean() - n * cov)) < 1e-12


@given(pw=st.floats(1e-6, 1 - 1e-6), pp=st.floats(1e-6, 1 - 1e-6), k=st.integers(1, 64))
def test_proposition1_bound(pw: float, pp: float, k: int) -> None:
    a, b = torch.tensor(pw, dtype=F64), torch.tensor(pp, dtype=F64)
    assert float(exact_pass_at_k(b, k=k)) >= float(pass_at_k_lower_bound(a, b, k=k)) - 1e-12
    assert float(bernoulli_kl(a, a)) == 0.0


@settings(max_examples=30)
@given(seed=seeds, v=st.integers(2, 10))
def test_first_order_entropy_change(seed: int, v: int) -> None:
    """Finite-difference entropy change under dz = eta pi A over -eta Cov(log pi, pi A) is 1 within 1e-2."""
    g = torch.Generator().manual_seed(seed)
    z, adv = torch.randn(v, generator=g, dtype=F64), torch.randn(v, generator=g, dtype=F64)
    eta = 1e-5
    pi = torch.softmax(z, 0)
    predicted = first_order_entropy_change(pi, adv, eta=eta)
    assume(abs(float(predicted)) > 1e-3 * eta)
    actual = categorical_entropy(torch.softmax(z + eta * pi * adv, 0)) - categorical_entropy(pi)
    assert abs(float(actual / predicted) - 1) < 1e-2


def test_population_coverage_averages_prompts() -> None:
    success = torch.tensor([[0.0, 1.0], [0.5, 0.5]], dtype=F64)  # [X=2, P=2]
    cov = population_coverage(success)
    assert abs(float(cov.js_success) - math.log(2) / 2) < 1e-12
    assert abs(float(cov.pass_population) - (1.0 + 0.75) / 2) < 1e-12
    assert abs(float(cov.pass_same) - (0.75 + 0.75) / 2) < 1e-12


def test_lemma1_small_sigma_expansion() -> None:
    """Spec 05 §7 regression test: MC mean of JS_pol over 4000 populations / Lemma 1 term in [0.95, 1.05]."""
    ratios = lemma1_ratios(sigmas=(0.1, 0.03, 0.01), populations=(2, 8, 32), draws=4000)
    assert all(0.95 <= r <= 1.05 for r in ratios.values()), ratios
