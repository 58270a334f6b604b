"""The verdict bounds (`posttrain.paper_checks.bounds`) against hand-computable cases, a slow loop
reference, their monotonicity and invariances, the degenerate inputs and the power tools.

Calibration on null data is in ``test_bounds_calibration.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import optimize, stats

from posttrain.errors import DomainError, ShapeError
from posttrain.paper_checks import bounds as b

ALPHA = 0.025
LOG_T = math.log(1.0 / ALPHA)
C = b.BET_CAP


def _reference_lower(x: np.ndarray, lo: float, hi: float, alpha: float) -> float:
    """The betting lower bound by an explicit loop over orders and seeds, and Brent's root."""
    y = (np.asarray(x, dtype=np.float64) - lo) / (hi - lo)
    n = y.size

    def log_capital(m: float) -> float:
        caps = []
        for order in b._orders(n):
            mu, var, log_k, sq = 0.5, 0.25, 0.0, 0.0
            for t, v in enumerate(y[order], start=1):
                lam = min(math.sqrt(2.0 * math.log(1.0 / alpha) / (n * var)), C / m if m > 0 else math.inf)
                log_k += math.log1p(lam * (v - m))
                sq += (v - mu) ** 2
                mu = (0.5 + y[order][:t].sum()) / (t + 1)
                var = (0.25 + sq) / (t + 1)
            caps.append(log_k)
        return float(np.logaddexp.reduce(caps) - math.log(len(caps)))

    g = lambda m: log_capital(m) - math.log(1.0 / alpha)  # noqa: E731
    if g(0.0) < 0:
        return lo
    top = float(y.max())
    return lo + (hi - lo) * optimize.brentq(g, 0.0, top, xtol=1e-14) if g(top) < 0 else lo + (hi - lo) * top


def _constant_lower(v: float, n: int, lo: float, hi: float) -> float:
    """Closed form for ``n`` copies of ``v`` while every bet sits at its cap ``c / m``: ``(1 - c + c y/m)^n = 1/alpha``."""
    y = (v - lo) / (hi - lo)
    m = C * y / (ALPHA ** (-1.0 / n) - 1.0 + C)
    assert math.sqrt(8.0 * LOG_T / n) >= C / m, "precondition: the uncapped bets (sigma2 <= 1/4) exceed the cap"
    return lo + (hi - lo) * m


# --- hand-computable cases ---------------------------------------------------------------------------


@pytest.mark.parametrize(("v", "n"), [(1.0, 6), (1.0, 10), (1.0, 20), (0.6, 10), (0.8, 6)])
def test_constant_data_matches_the_closed_form(v: float, n: int) -> None:
    expected = _constant_lower(v, n, -1.0, 1.0)
    assert b.mean_lower_bound([v] * n, lo=-1.0, hi=1.0, alpha=ALPHA) == pytest.approx(expected, abs=1e-11)
    # the upper bound of the mirrored data is the mirrored lower bound
    assert b.mean_upper_bound([-v] * n, lo=-1.0, hi=1.0, alpha=ALPHA) == pytest.approx(-expected, abs=1e-11)


def test_fewest_seeds_that_can_clear_the_margin_is_the_floor_of_any_valid_bound() -> None:
    """All values at ``hi``: nothing valid clears margin 0 on [-1, 1] before ``log 40 / log 2 = 5.3`` seeds."""
    floor = math.ceil(math.log(1.0 / ALPHA) / math.log(2.0))
    cleared = [b.mean_lower_bound([1.0] * n, lo=-1.0, hi=1.0, alpha=ALPHA) > 0.0 for n in range(1, 9)]
    assert cleared.index(True) + 1 == floor == 6


@pytest.mark.parametrize("v", [-1.0, -0.3, 0.0, 0.7, 1.0])
def test_one_seed_bounds_are_the_range(v: float) -> None:
    assert b.mean_lower_bound([v], lo=-1.0, hi=1.0, alpha=ALPHA) == -1.0
    assert b.mean_upper_bound([v], lo=-1.0, hi=1.0, alpha=ALPHA) == 1.0


def test_values_at_the_ends_of_the_range() -> None:
    assert b.mean_lower_bound([0.0] * 12, lo=0.0, hi=1.0, alpha=ALPHA) == 0.0
    assert b.mean_upper_bound([1.0] * 12, lo=0.0, hi=1.0, alpha=ALPHA) == 1.0
    mixed = [0.0, 1.0] * 10
    low, high = (
        b.mean_lower_bound(mixed, lo=0.0, hi=1.0, alpha=ALPHA),
        b.mean_upper_bound(mixed, lo=0.0, hi=1.0, alpha=ALPHA),
    )
    assert 0.0 < low < 0.5 < high < 1.0
    assert abs(low - (1.0 - high)) <= 0.05 * (0.5 - low)  # the mirror image is a relabelling of the seeds


@pytest.mark.parametrize("seed", range(4))
def test_vectorised_bound_matches_the_loop_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = [3, 7, 16, 25][seed]
    x = np.clip(0.2 + 0.4 * rng.standard_normal(n), -1.0, 1.0)
    assert b.mean_lower_bound(x, lo=-1.0, hi=1.0, alpha=ALPHA) == pytest.approx(
        _reference_lower(x, -1.0, 1.0, ALPHA), abs=1e-9
    )
    assert b.mean_upper_bound(x, lo=-1.0, hi=1.0, alpha=ALPHA) == pytest.approx(
        -_reference_lower(-x, -1.0, 1.0, ALPHA), abs=1e-9
    )


def test_batch_equals_row_by_row() -> None:
    x = np.random.default_rng(5).uniform(0.0, 1.0, size=(2, 3, 9))
    got = b.mean_lower_bound(x, lo=0.0, hi=1.0, alpha=ALPHA)
    assert got.shape == (2, 3)
    rows = [b.mean_lower_bound(r, lo=0.0, hi=1.0, alpha=ALPHA) for r in x.reshape(6, 9)]
    np.testing.assert_allclose(got.ravel(), rows, atol=1e-12)
    ev = b.mean_log_evalue(x, np.full((2, 3), 0.4), lo=0.0, hi=1.0, alpha=ALPHA)
    assert ev.shape == (2, 3)


# --- monotonicity and the bound / e-value duality ----------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_capital_is_non_increasing_in_the_candidate_mean_and_the_bound_is_its_crossing(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = np.clip(0.3 + 0.3 * rng.standard_normal(30), -1.0, 1.0)
    grid = np.linspace(-1.0, 1.0, 401)
    for alternative, bound in (("greater", b.mean_lower_bound), ("less", b.mean_upper_bound)):
        ev = b.mean_log_evalue(
            np.broadcast_to(x, (grid.size, x.size)), grid, lo=-1.0, hi=1.0, alpha=ALPHA, alternative=alternative
        )
        steps = np.diff(ev) if alternative == "greater" else -np.diff(ev)
        assert np.all(steps <= 1e-12)
        edge = bound(x, lo=-1.0, hi=1.0, alpha=ALPHA)
        far = np.abs(grid - edge) > 1e-9
        rejected = ev >= LOG_T
        beyond = grid < edge if alternative == "greater" else grid > edge
        np.testing.assert_array_equal(rejected[far], beyond[far])


def test_bound_of_constant_data_grows_with_the_value() -> None:
    values = np.linspace(-1.0, 1.0, 21)
    lows = np.array([b.mean_lower_bound([v] * 10, lo=-1.0, hi=1.0, alpha=ALPHA) for v in values])
    steps = np.diff(lows)
    assert np.all(steps[lows[1:] > -1.0] > 0) and np.all(steps >= 0)


def test_raising_values_never_lowers_the_bound_by_more_than_a_rounding() -> None:
    """The plug-in bets depend on the past spread, so monotonicity in the data is approximate (documented)."""
    rng = np.random.default_rng(11)
    x = np.clip(0.1 + 0.5 * rng.standard_normal((200, 12)), -1.0, 1.0)
    raised = x.copy()
    raised[np.arange(200), rng.integers(0, 12, 200)] += 0.3 * rng.random(200)
    raised = np.minimum(raised, 1.0)
    drop = b.mean_lower_bound(x, lo=-1.0, hi=1.0, alpha=ALPHA) - b.mean_lower_bound(
        raised, lo=-1.0, hi=1.0, alpha=ALPHA
    )
    assert drop.max() <= 1e-3


def test_proportion_and_quantile_bounds_are_monotone() -> None:
    low, high = b.proportion_bounds(np.arange(11), 10, alpha=ALPHA)
    assert np.all(np.diff(low) > 0) and np.all(np.diff(high) > 0)
    x = np.random.default_rng(2).standard_normal((50, 15))
    assert np.all(b.location_lower_bound(x + 0.1, alpha=ALPHA) >= b.location_lower_bound(x, alpha=ALPHA))
    assert np.all(b.location_upper_bound(x + 0.1, alpha=ALPHA) >= b.location_upper_bound(x, alpha=ALPHA))


# --- invariances --------------------------------------------------------------------------------------


@given(
    x=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=25),
    shift=st.floats(-5.0, 5.0),
    scale=st.floats(0.1, 10.0),
    flip=st.booleans(),
)
def test_affine_relabelling_of_the_range(x: list[float], shift: float, scale: float, flip: bool) -> None:
    """Bounds follow an affine map of the values and the range; a decreasing map swaps lower and upper."""
    a = np.asarray(x)
    s = -scale if flip else scale
    lo2, hi2 = sorted((shift, shift + s))
    mapped = np.clip(shift + s * a, lo2, hi2)
    low, high = b.mean_lower_bound(a, lo=0.0, hi=1.0, alpha=ALPHA), b.mean_upper_bound(a, lo=0.0, hi=1.0, alpha=ALPHA)
    expect = (shift + s * high, shift + s * low) if flip else (shift + s * low, shift + s * high)
    got = (
        b.mean_lower_bound(mapped, lo=lo2, hi=hi2, alpha=ALPHA),
        b.mean_upper_bound(mapped, lo=lo2, hi=hi2, alpha=ALPHA),
    )
    np.testing.assert_allclose(got, expect, atol=1e-8 * scale)
    assert 0.0 <= low <= a.max() and a.min() <= high <= 1.0


def test_relabelling_the_seeds() -> None:
    """Exact for N! <= ORDERS (every order is averaged); otherwise within a few % of the bound's width."""
    rng = np.random.default_rng(3)
    small = np.array([0.9, -0.2, 0.5])
    base = b.mean_lower_bound(small, lo=-1.0, hi=1.0, alpha=ALPHA)
    for perm in ([1, 2, 0], [2, 1, 0]):
        assert b.mean_lower_bound(small[perm], lo=-1.0, hi=1.0, alpha=ALPHA) == pytest.approx(base, abs=1e-12)
    x = np.clip(0.3 + 0.3 * rng.standard_normal(20), -1.0, 1.0)
    low = b.mean_lower_bound(x, lo=-1.0, hi=1.0, alpha=ALPHA)
    relabelled = b.mean_lower_bound(np.stack([rng.permutation(x) for _ in range(20)]), lo=-1.0, hi=1.0, alpha=ALPHA)
    assert np.max(np.abs(relabelled - low)) <= 0.05 * (x.mean() - low)
    for fn in (b.location_lower_bound, b.location_upper_bound):
        assert np.all(fn(np.stack([rng.permutation(x) for _ in range(5)]), alpha=ALPHA) == fn(x, alpha=ALPHA))


# --- degenerate and bad input -------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 5, 6, 30])
def test_all_values_equal(n: int) -> None:
    low = b.mean_lower_bound([0.25] * n, lo=-1.0, hi=1.0, alpha=ALPHA)
    high = b.mean_upper_bound([0.25] * n, lo=-1.0, hi=1.0, alpha=ALPHA)
    assert -1.0 <= low < 0.25 < high <= 1.0
    assert b.location_lower_bound([0.25] * n, alpha=ALPHA) in (0.25, -math.inf)


@pytest.mark.parametrize("fn", [b.mean_lower_bound, b.mean_upper_bound])
def test_bad_input_raises_naming_the_argument(fn: object) -> None:
    call = lambda x, **kw: fn(x, **{"lo": -1.0, "hi": 1.0, "alpha": ALPHA, **kw})  # type: ignore[operator]  # noqa: E731
    with pytest.raises(DomainError, match="x"):
        call([0.1, float("nan"), 0.2])
    with pytest.raises(DomainError, match="x"):
        call([0.1, float("inf")])
    with pytest.raises(DomainError, match=r"x: values must lie in \[lo, hi\]"):
        call([0.1, 1.5])
    with pytest.raises(DomainError, match="lo/hi"):
        call([0.1], lo=1.0, hi=1.0)
    with pytest.raises(DomainError, match="alpha"):
        call([0.1], alpha=0.0)
    with pytest.raises(ShapeError, match="x"):
        call([])
    with pytest.raises(ShapeError, match="x"):
        call(0.5)


def test_other_bad_input() -> None:
    with pytest.raises(DomainError, match="x"):
        b.location_lower_bound([1.0, float("nan")], alpha=ALPHA)
    with pytest.raises(DomainError, match="k/n"):
        b.proportion_bounds(11, 10, alpha=ALPHA)
    with pytest.raises(DomainError, match="share"):
        b.quantile_lower_bound([1.0, 2.0], share=1.0, alpha=ALPHA)
    with pytest.raises(DomainError, match="null"):
        b.mean_log_evalue([0.1, 0.2], 2.0, lo=-1.0, hi=1.0, alpha=ALPHA)
    with pytest.raises(DomainError, match="sd/sampler"):
        b.power(0.1, 10, lo=-1.0, hi=1.0, margin=0.0, alpha=ALPHA)
    with pytest.raises(DomainError, match="sd"):
        b.power(0.1, 10, lo=-1.0, hi=1.0, margin=0.0, alpha=ALPHA, sd=1.5)
    with pytest.raises(DomainError, match="margin"):
        b.min_detectable_effect(10, lo=0.0, hi=1.0, margin=1.0, alpha=ALPHA, sd=0.1)


# --- exact binomial bounds ----------------------------------------------------------------------------


def test_clopper_pearson_hand_cases() -> None:
    low, high = b.proportion_bounds([0, 10], 10, alpha=ALPHA)
    np.testing.assert_allclose(low, [0.0, ALPHA**0.1])
    np.testing.assert_allclose(high, [1.0 - ALPHA**0.1, 1.0])
    low, high = b.proportion_bounds(3, 10, alpha=ALPHA)
    assert stats.binom.sf(2, 10, low) == pytest.approx(ALPHA) and stats.binom.cdf(3, 10, high) == pytest.approx(ALPHA)


def test_share_bounds_and_order_statistics_agree() -> None:
    """``L_share > margin`` exactly when the Clopper-Pearson lower bound on ``P(d > margin)`` exceeds ``share``."""
    rng = np.random.default_rng(4)
    for n, share in [(10, 0.5), (16, 0.8), (40, 0.3)]:
        x = rng.standard_normal((300, n)) + 0.8
        for margin in (-0.5, 0.0, 0.5):
            by_order = b.quantile_lower_bound(x, share=share, alpha=ALPHA) > margin
            by_share = b.share_bounds(x, margin=margin, alpha=ALPHA)[0] > share
            np.testing.assert_array_equal(by_order, by_share)


def test_median_bound_needs_six_seeds() -> None:
    assert b.location_lower_bound(np.arange(5.0), alpha=ALPHA) == -math.inf
    assert b.location_upper_bound(np.arange(5.0), alpha=ALPHA) == math.inf
    assert (
        b.location_lower_bound(np.arange(6.0), alpha=ALPHA),
        b.location_upper_bound(np.arange(6.0), alpha=ALPHA),
    ) == (0.0, 5.0)


# --- power tools --------------------------------------------------------------------------------------


def test_beta_alternative_has_the_requested_mean_and_sd() -> None:
    draws = b.beta_sampler(lo=-1.0, hi=1.0, sd=0.3)(np.random.default_rng(0), (200_000,), 0.4)
    assert draws.min() >= -1.0 and draws.max() <= 1.0
    assert abs(draws.mean() - 0.4) < 4 * 0.3 / math.sqrt(draws.size)
    assert draws.std() == pytest.approx(0.3, rel=0.01)


def test_power_at_zero_effect_is_at_most_the_level() -> None:
    reps = 4000
    p = b.power(0.0, 20, lo=-1.0, hi=1.0, margin=0.0, alpha=ALPHA, sd=0.2, reps=reps)
    assert p <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / reps)


def test_seeds_for_power_is_the_smallest_count_reaching_the_target() -> None:
    kw = {"lo": -1.0, "hi": 1.0, "margin": 0.0, "alpha": ALPHA, "sd": 0.2, "reps": 1000}
    n = b.seeds_for_power(0.2, **kw)
    assert b.power(0.2, n, **kw) >= 0.8 > b.power(0.2, n - 1, **kw)


def test_min_detectable_effect_brackets_the_target_power() -> None:
    kw = {"lo": -1.0, "hi": 1.0, "margin": 0.0, "alpha": ALPHA, "sd": 0.1, "reps": 1000}
    mde = b.min_detectable_effect(16, rtol=0.01, **kw)
    assert b.power(mde, 16, **kw) >= 0.8 > b.power(0.9 * mde, 16, **kw)


def test_min_detectable_effect_without_noise_is_the_floor() -> None:
    """``sd = 0`` at 6 seeds: constant data clear 0 once ``c y / (40^(1/6) - 1 + c) > 1/2`` (closed form)."""
    y = 0.5 * (ALPHA ** (-1.0 / 6.0) - 1.0 + C) / C
    mde = b.min_detectable_effect(6, lo=-1.0, hi=1.0, margin=0.0, alpha=ALPHA, sd=0.0, rtol=1e-6)
    assert mde == pytest.approx(2.0 * y - 1.0, rel=1e-5)
    assert b.min_detectable_effect(5, lo=-1.0, hi=1.0, margin=0.0, alpha=ALPHA, sd=0.0) == math.inf


def test_power_with_a_sampler() -> None:
    def coin(rng: np.random.Generator, shape: tuple[int, ...], mean: float) -> np.ndarray:
        return np.where(rng.random(shape) < (mean + 1.0) / 2.0, 1.0, -1.0)

    kw = {"lo": -1.0, "hi": 1.0, "margin": 0.0, "alpha": ALPHA, "sampler": coin, "reps": 1000}
    assert b.power(0.5, 60, **kw) > b.power(0.2, 60, **kw)
