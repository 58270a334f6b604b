"""The harness's false-pass rate on null data, at the seed counts the checks use.

A criterion that "passes" on data where the claim is false at its boundary is a false pass; at the
harness level (one-sided ``ALPHA = 0.025``) it may happen at most 2.5% of the time, up to Monte Carlo
error. Measured for the mean rule (Student-t interval of paired differences with zero mean, and
with mean equal to the margin) and, exactly, for the fraction rule at its boundary (a seed clears
the margin with probability 1/2). The percentile bootstrap the harness used before is measured the
same way to show that this test detects an anti-conservative rule.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from posttrain.errors import DomainError
from posttrain.paper_checks.base import (
    ALPHA,
    Criterion,
    binomial_rule,
    compare,
    exact_criterion,
    fraction_criterion,
    mean_criterion,
    t_test_greater,
)

SEED_COUNTS = (3, 5, 8, 10, 16)
DRAWS = 40_000
BOUND = ALPHA + 4.0 * math.sqrt(ALPHA * (1.0 - ALPHA) / DRAWS)  # nominal + 4 Monte Carlo standard errors


def _null(kind: str, n: int, rng: np.random.Generator, draws: int = DRAWS) -> np.ndarray:
    if kind == "normal":
        return rng.standard_normal((draws, n))
    if kind == "laplace":
        return rng.laplace(size=(draws, n))
    raise AssertionError(kind)


@pytest.mark.parametrize("n", SEED_COUNTS)
@pytest.mark.parametrize("kind", ["normal", "laplace"])
@pytest.mark.parametrize("margin", [0.0, 0.1])
def test_mean_rule_false_pass_rate_is_at_most_nominal(n: int, kind: str, margin: float) -> None:
    rng = np.random.default_rng(1000 * n + len(kind))
    d = _null(kind, n, rng) + margin  # true mean exactly at the margin: the claim "mean > margin" is false
    rate = float((t_test_greater(d, margin) <= ALPHA).mean())
    assert rate <= BOUND, f"n={n} {kind}: false-pass rate {rate:.4f} > {BOUND:.4f}"
    # the harness's compare() takes the same decision on each data set (checked on the first 40)
    for row, p in zip(d[:40], t_test_greater(d[:40], margin), strict=True):
        assert compare(mean_criterion("x", row, margin=margin, reason="null")).passed == (p <= ALPHA)


def test_the_calibration_test_detects_the_old_percentile_bootstrap() -> None:
    # the rule this harness replaced: lower end of a 95% percentile bootstrap CI above 0
    rng = np.random.default_rng(7)
    n, draws, boots = 3, 2_000, 1_000
    d = rng.standard_normal((draws, n))
    idx = rng.integers(0, n, size=(boots, n))
    lower = np.quantile(d[:, idx].mean(-1), ALPHA, axis=1)  # [draws]
    assert float((lower > 0).mean()) > 0.08  # ~12%: far above BOUND, so the test above can fail


@pytest.mark.parametrize("n", SEED_COUNTS)
@pytest.mark.parametrize("fraction", [0.5, 0.75, 0.8, 7 / 8, 1.0])
def test_fraction_rule_false_pass_rate_at_its_boundary_is_at_most_nominal(n: int, fraction: float) -> None:
    need = binomial_rule(n, fraction)
    exact = float(stats.binom.sf(need - 1, n, 0.5))  # P(at least `need` of n seeds clear | rate 1/2)
    assert exact <= ALPHA
    assert need >= math.ceil(fraction * n - 1e-12)  # never weaker than the stated share
    # compare() on null data agrees with the exact rate (its decision is a function of the count)
    rng = np.random.default_rng(n)
    counts = rng.binomial(n, 0.5, size=20_000)
    verdict = {
        k: compare(fraction_criterion("x", np.r_[np.ones(k), -np.ones(n - k)], fraction=fraction, reason="")).passed
        for k in range(n + 1)
    }
    rate = float(np.mean([verdict[k] for k in counts]))
    assert rate <= BOUND
    assert rate == pytest.approx(exact, abs=4.0 * math.sqrt(ALPHA / counts.size))


def test_rules_have_power_at_ten_seeds() -> None:
    rng = np.random.default_rng(3)
    d = rng.standard_normal((4_000, 10)) + 1.0  # a one-sd effect
    assert float((t_test_greater(d, 0.0) <= ALPHA).mean()) > 0.7
    assert compare(fraction_criterion("x", np.ones(10), fraction=0.8, reason="")).passed  # 10/10
    nine = np.r_[np.ones(9), -1.0]
    assert compare(fraction_criterion("x", nine, fraction=0.8, reason="")).passed  # 9/10, p = 0.011
    eight = np.r_[np.ones(8), -1.0, -1.0]
    assert not compare(fraction_criterion("x", eight, fraction=0.8, reason="")).passed  # 8/10, p = 0.055


def test_asserted_point_estimate_is_refused_and_exact_values_are_judged_directly() -> None:
    with pytest.raises(DomainError, match="per-seed values"):
        compare(mean_criterion("mean over seeds", [0.3], margin=0.0, reason=""))
    reported = compare(mean_criterion("one number", [0.3], margin=0.0, reason="", asserted=False))
    assert not reported.passed and reported.n == 1
    ok = compare(exact_criterion("closed form", [1e-13], margin=0.0, reason="deterministic"))
    assert ok.passed and ok.p == 0.0
    assert not compare(exact_criterion("closed form", [0.0], margin=0.0, reason="deterministic")).passed
    with pytest.raises(DomainError, match="fraction"):
        fraction_criterion("x", [1.0], fraction=0.0, reason="")
    assert mean_criterion("x", [1.0, 2.0], margin=0.0, reason="").kind is Criterion.MEAN


def test_identical_seeds_pass_a_mean_rule_only_above_the_margin() -> None:
    assert compare(mean_criterion("x", [0.5] * 10, margin=0.0, reason="")).passed
    assert not compare(mean_criterion("x", [0.0] * 10, margin=0.0, reason="")).passed
