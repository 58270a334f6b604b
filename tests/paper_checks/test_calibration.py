"""The harness's false-"holds" rate on null data, at every seed count the checks use.

A comparison that *holds* on data where its claim is false at the boundary is a false pass; at the
harness level (one-sided ``ALPHA = 0.025``) it may happen at most 2.5% of the time, up to Monte Carlo
error (here 3 standard errors). Measured through the harness's own decision rule (`compare`, which
calls `posttrain.paper_checks.bounds`) on the nulls that break naive rules:

- bounded means (declared range [-1, 1], true mean exactly at the margin): a symmetric law, left- and
  right-skewed laws and the two-point law (+0.2 with probability 5/6, -1 otherwise) that fooled the
  Student-t rule 58% of the time at n = 3;
- unbounded quantities, judged on the median: normal, right- and left-skewed and heavy-tailed (t with
  3 degrees of freedom) laws with the median at the margin; a skewed law whose *mean* sits at the
  margin shows the assumption the comparison must state (symmetry) is needed;
- quantile criteria: the exact false-holds rate at the boundary ``P(d > margin) = share``.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from posttrain.paper_checks import bounds, load_all
from posttrain.paper_checks.model import ALPHA, Role, exact_criterion, mean_criterion, quantile_criterion
from posttrain.paper_checks.stats import Outcome, compare


def _seed_counts() -> list[int]:
    """Every seed count a registered check uses (full and smoke configs, and any ``*_seeds`` count of theirs)."""
    from posttrain.paper_checks import CHECKS

    load_all()
    counts = set()
    for name in CHECKS.names():
        check = CHECKS.get(name)
        for cfg in (check.config(), check.config(smoke=True)):
            for f in dataclasses.fields(cfg):
                value = getattr(cfg, f.name)
                if f.name.endswith("seeds") and isinstance(value, int) and value >= 2:
                    counts.add(value)
    return sorted(counts)


SEED_COUNTS = _seed_counts()
DRAWS = 3000
BOUND = ALPHA + 3.0 * math.sqrt(ALPHA * (1.0 - ALPHA) / DRAWS)  # nominal + 3 Monte Carlo standard errors


def _bounded_null(kind: str, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Mean exactly 0, values in [-1, 1]."""
    if kind == "uniform":
        return rng.uniform(-1.0, 1.0, shape)
    if kind == "left-skewed":
        return 1.0 / 6.0 - rng.beta(1.0, 5.0, shape)
    if kind == "right-skewed":
        return rng.beta(1.0, 5.0, shape) - 1.0 / 6.0
    if kind == "two-point":
        return np.where(rng.random(shape) < 5.0 / 6.0, 0.2, -1.0)
    raise AssertionError(kind)


def _median_null(kind: str, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Median exactly 0."""
    if kind == "normal":
        return rng.standard_normal(shape)
    if kind == "right-skewed":
        return rng.exponential(1.0, shape) - math.log(2.0)
    if kind == "left-skewed":
        return math.log(2.0) - rng.exponential(1.0, shape)
    if kind == "heavy-tailed":
        return rng.standard_t(3.0, shape)
    raise AssertionError(kind)


def _holds_rate_bounded(kind: str, n: int, margin: float) -> float:
    rng = np.random.default_rng(1000 * n + len(kind))
    d = np.clip(_bounded_null(kind, (DRAWS, n), rng) * (1.0 - abs(margin)) + margin, -1.0, 1.0)  # mean at margin
    lower = np.asarray(bounds.mean_lower_bound(d, lo=-1.0, hi=1.0, alpha=ALPHA))
    for row, low in zip(d[:3], lower[:3], strict=True):  # the harness takes the same decision
        c = mean_criterion("x", row, margin=margin, reason="null", bounds=(-1.0, 1.0))
        assert (compare(c).outcome is Outcome.HOLDS) == bool(low > margin)
    return float((lower > margin).mean())


@pytest.mark.parametrize("kind", ["uniform", "left-skewed", "right-skewed", "two-point"])
@pytest.mark.parametrize("n", [3, 10])
def test_bounded_mean_false_holds_rate(kind: str, n: int) -> None:
    rate = _holds_rate_bounded(kind, n, 0.0)
    assert rate <= BOUND, f"n={n} {kind}: false-holds rate {rate:.4f} > {BOUND:.4f}"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["uniform", "left-skewed", "right-skewed", "two-point"])
@pytest.mark.parametrize("n", SEED_COUNTS)
@pytest.mark.parametrize("margin", [0.0, 0.2])
def test_bounded_mean_false_holds_rate_at_every_seed_count(kind: str, n: int, margin: float) -> None:
    rate = _holds_rate_bounded(kind, n, margin)
    assert rate <= BOUND, f"n={n} {kind} margin {margin}: false-holds rate {rate:.4f} > {BOUND:.4f}"


@pytest.mark.parametrize("kind", ["normal", "right-skewed", "left-skewed", "heavy-tailed"])
@pytest.mark.parametrize("n", SEED_COUNTS)
def test_unbounded_median_false_holds_rate(kind: str, n: int) -> None:
    rng = np.random.default_rng(7 * n + len(kind))
    d = _median_null(kind, (4 * DRAWS, n), rng)
    rate = float((np.asarray(bounds.location_lower_bound(d, alpha=ALPHA)) > 0.0).mean())
    assert rate <= ALPHA + 3.0 * math.sqrt(ALPHA * (1.0 - ALPHA) / d.shape[0]), f"n={n} {kind}: {rate:.4f}"
    c = mean_criterion("x", d[0], margin=0.0, reason="null", assumption="symmetric differences")
    assert (compare(c).outcome is Outcome.HOLDS) == bool(bounds.location_lower_bound(d[0], alpha=ALPHA) > 0.0)


def test_the_median_speaks_for_the_mean_only_under_the_stated_symmetry() -> None:
    # a left-skewed law with its *mean* at the margin: its median lies above, so the median rule
    # "holds" the false mean claim far more often than ALPHA (the assumption a comparison must state)
    rng = np.random.default_rng(3)
    d = 1.0 - rng.exponential(1.0, (4000, 40))  # mean 0, median 1 - ln 2 > 0
    assert float((np.asarray(bounds.location_lower_bound(d, alpha=ALPHA)) > 0.0).mean()) > 4 * ALPHA


@pytest.mark.parametrize("n", SEED_COUNTS)
@pytest.mark.parametrize("share", [0.5, 0.8])
def test_quantile_false_holds_rate_at_its_boundary_is_exact(n: int, share: float) -> None:
    # P(d > margin) = share exactly: the count of seeds clearing the margin is Binomial(n, share)
    holds = {
        k: compare(
            quantile_criterion("x", np.r_[np.ones(k), -np.ones(n - k)], margin=0.0, share=share, reason="")
        ).outcome
        is Outcome.HOLDS
        for k in range(n + 1)
    }
    rate = sum(stats.binom.pmf(k, n, share) for k, ok in holds.items() if ok)
    assert rate <= ALPHA + 1e-12
    excluded = sum(
        stats.binom.pmf(k, n, share)
        for k in range(n + 1)
        if compare(quantile_criterion("x", np.r_[np.ones(k), -np.ones(n - k)], margin=0.0, share=share,
                                      reason="")).outcome is Outcome.EXCLUDED
    )  # fmt: skip
    assert excluded <= ALPHA + 1e-12  # the claim is true at the boundary's other side: contradicted as rarely


def test_power_of_the_rules_at_ten_seeds() -> None:
    rng = np.random.default_rng(5)
    d = np.clip(0.6 + 0.1 * rng.standard_normal((2000, 10)), -1.0, 1.0)  # a large, tight effect in [-1, 1]
    assert float((np.asarray(bounds.mean_lower_bound(d, lo=-1.0, hi=1.0, alpha=ALPHA)) > 0.0).mean()) > 0.8
    ten = compare(quantile_criterion("x", np.ones(10), margin=0.0, share=0.5, reason=""))
    assert ten.outcome is Outcome.HOLDS and ten.lower == pytest.approx(0.025**0.1)  # 10/10: CP lower 0.69
    eight = compare(quantile_criterion("x", np.r_[np.ones(8), -np.ones(2)], margin=0.0, share=0.5, reason=""))
    assert eight.outcome is Outcome.UNDECIDED  # 8/10: P(X >= 8 | 1/2) = 0.055 > ALPHA


def test_single_values_and_exact_values() -> None:
    with pytest.raises(ValueError, match="per-seed values"):
        compare(mean_criterion("mean over seeds", [0.3], margin=0.0, reason="", bounds=(-1.0, 1.0)))
    shown = compare(mean_criterion("one number", [0.3], margin=0.0, reason="", bounds=(-1.0, 1.0), role=Role.CONTEXT))
    assert shown.outcome is Outcome.UNDECIDED and shown.n == 1
    assert compare(exact_criterion("closed form", [1e-13], margin=0.0, reason="deterministic")).outcome is Outcome.HOLDS
    assert compare(exact_criterion("closed form", [0.0], margin=0.0, reason="")).outcome is Outcome.EXCLUDED


def test_declarations_are_checked() -> None:
    with pytest.raises(ValueError, match="bounds/assumption"):
        mean_criterion("x", [0.1, 0.2], margin=0.0, reason="")  # neither
    with pytest.raises(ValueError, match="bounds/assumption"):
        mean_criterion("x", [0.1, 0.2], margin=0.0, reason="", bounds=(-1, 1), assumption="both")
    with pytest.raises(ValueError, match="outside the declared bounds"):
        mean_criterion("x", [0.1, 1.5], margin=0.0, reason="", bounds=(-1.0, 1.0))
    with pytest.raises(ValueError, match="margin"):
        mean_criterion("x", [0.1, 0.5], margin=1.0, reason="", bounds=(-1.0, 1.0))
    with pytest.raises(ValueError, match="share"):
        quantile_criterion("x", [0.1], margin=0.0, share=1.0, reason="")
