"""Properties of the near-optimal region, widths, transfer and the budget split (spec 03, section 8)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from posttrain.theory.budget_allocation import (
    budget_split,
    near_optimal_region,
    proxy_ratio,
    transferability,
    width_count,
    width_range,
)

seeds = st.integers(0, 2**31 - 1)
G11 = np.linspace(0, 1, 11)


def _curve(seed: int, n: int = 11) -> np.ndarray:
    return np.random.default_rng(seed).random(n) + 0.01


@given(seed=seeds, e1=st.floats(0, 1), e2=st.floats(0, 1))
def test_region_monotone_in_eps(seed: int, e1: float, e2: float) -> None:
    p = _curve(seed)
    lo, hi = sorted((e1, e2))
    small, large = near_optimal_region(p, lo), near_optimal_region(p, hi)
    assert np.all(~small | large)
    assert np.array_equal(near_optimal_region(p, 0.0), p == p.max())
    assert near_optimal_region(p, min(1.0, 1 - p.min() / p.max() + 1e-12)).all()  # float slack


@given(seed=seeds, eps=st.floats(0, 1))
def test_width_bounds(seed: int, eps: float) -> None:
    region = near_optimal_region(_curve(seed), eps)
    wc, wr = float(width_count(region)), float(width_range(region, G11))
    assert 1 / 11 <= wc <= 1 and 0 <= wr <= 1
    assert wr >= (region.sum() - 1) * 0.1 - 1e-12


@given(seed=seeds, eps=st.floats(0, 1), c=st.floats(1e-3, 1e3))
def test_scale_invariance(seed: int, eps: float, c: float) -> None:
    p, q = _curve(seed), _curve(seed + 1)
    assert np.array_equal(near_optimal_region(p, eps), near_optimal_region(c * p, eps))
    t = transferability(near_optimal_region(p, eps), near_optimal_region(q, eps))
    assert t == transferability(near_optimal_region(c * p, eps), near_optimal_region(c * q, eps))


def test_adding_a_constant_changes_the_multiplicative_region() -> None:
    p = np.array([0.5, 0.9, 1.0])
    assert not np.array_equal(near_optimal_region(p, 0.1), near_optimal_region(p + 10, 0.1))


@given(seed=seeds, eps=st.floats(0, 1), e_t=st.floats(0, 1))
def test_transfer(seed: int, eps: float, e_t: float) -> None:
    p, q = _curve(seed), _curve(seed + 7)
    src = near_optimal_region(p, eps)
    assert float(transferability(src, src)) == 1.0
    t = float(transferability(src, near_optimal_region(q, e_t)))
    assert 0 <= t <= 1
    superset = src | near_optimal_region(q, e_t)
    assert float(transferability(src, superset)) == 1.0


@given(seed=seeds, eps=st.floats(0, 1))
def test_proxy_midpoint_is_a_member(seed: int, eps: float) -> None:
    region = near_optimal_region(_curve(seed), eps)
    r_hat = float(proxy_ratio(region, G11))
    assert region[np.argmin(np.abs(G11 - r_hat))] and np.isclose(G11, r_hat).any()


def test_batched_regions_match_rowwise() -> None:
    p = np.random.default_rng(0).random((5, 11))
    batched = near_optimal_region(p, 0.1)
    assert all(np.array_equal(batched[i], near_optimal_region(p[i], 0.1)) for i in range(5))
    assert np.allclose(width_count(batched), [float(width_count(b)) for b in batched])


@given(budget=st.integers(0, 20000), rho=st.floats(0.5, 10), r=st.lists(st.floats(0, 1), min_size=2, max_size=8))
def test_budget_split(budget: int, rho: float, r: list[float]) -> None:
    rr = np.sort(np.asarray(r))
    n_sft, n_rl = budget_split(rr, budget, rho=rho)
    assert np.all(rho * n_sft + n_rl <= budget + 1e-6)
    assert np.all(np.diff(n_sft) >= 0) and np.all(np.diff(n_rl) <= 0)
    ends_sft, ends_rl = budget_split([0.0, 1.0], budget, rho=rho)
    assert ends_sft[0] == 0 and ends_rl[1] == 0
    assert ends_rl[0] == budget and ends_sft[1] == pytest.approx(np.floor(budget / rho + 1e-9))
