"""The statistics behind every verdict: one-sided bounds per comparison, its outcome, the check's verdict.

Each `Comparison` gets a lower and an upper one-sided confidence bound at level `ALPHA` (together a
`LEVEL` two-sided interval) from the method its kind and declaration call for, all in
`posttrain.paper_checks.bounds`:

- a **mean** with declared ``bounds=(lo, hi)``: `mean_lower_bound` / `mean_upper_bound`, valid in
  finite samples for every distribution on ``[lo, hi]``;
- a **mean** of an unbounded quantity: `location_lower_bound` / `location_upper_bound`, exact
  order-statistic bounds on the median (`LOCATION_ASSUMPTION`); the comparison states the
  assumption under which the median speaks for its claim (typically: symmetric differences);
- a **quantile** (``P(d > margin) > share``): the exact Clopper-Pearson bounds on the share of seeds
  whose difference clears the margin (`proportion_bounds`);
- an **exact** value: the value itself (no sampling noise).

The claim *holds* when the lower bound clears the margin (the share, for a quantile), is *excluded*
when the upper bound lies at or below it, and is *undecided* otherwise. The primary comparison's
outcome is the check's `Verdict`; for an undecided primary the minimum detectable effect at this
seed count says what the data could have shown: for a bounded mean, the effect over the margin
that `min_detectable_effect` finds at the observed spread with probability `POWER`; for a quantile,
the true share over the claimed one that clears it with probability `POWER` (exact binomial).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from scipy import optimize, stats

from posttrain.errors import DomainError
from posttrain.paper_checks import bounds
from posttrain.paper_checks.model import ALPHA, Comparison, Criterion, Result, Role, Verdict

__all__ = ["POWER", "ComparisonStats", "Outcome", "compare", "share_detectable", "verdict_of"]

POWER = 0.8
"""The power at which the minimum detectable effect is quoted."""


class Outcome(StrEnum):
    """A comparison's outcome at level `ALPHA`."""

    HOLDS = "holds"
    EXCLUDED = "excluded"
    UNDECIDED = "undecided"


_VERDICT = {
    Outcome.HOLDS: Verdict.REPRODUCED,
    Outcome.EXCLUDED: Verdict.CONTRADICTED,
    Outcome.UNDECIDED: Verdict.INCONCLUSIVE,
}


@dataclass(frozen=True)
class ComparisonStats:
    """Statistics of one comparison.

    ``estimate``: the mean difference (mean, exact) or the share of seeds clearing the margin
    (quantile); ``lower``/``upper``: its one-sided bounds at `ALPHA`, compared with ``threshold``
    (the margin, or the claimed share); ``mean``: the mean difference, whatever the kind;
    ``count``: seeds whose difference clears the margin; ``method``: how the bounds were computed;
    ``mde``: the smallest true effect beyond the threshold detected with probability `POWER` at
    this seed count (nan where not defined).
    """

    estimate: float
    lower: float
    upper: float
    threshold: float
    mean: float
    n: int
    count: int
    outcome: Outcome
    method: str
    mde: float = math.nan


def _outcome(lower: float, upper: float, threshold: float) -> Outcome:
    if lower > threshold:
        return Outcome.HOLDS
    if upper <= threshold:
        return Outcome.EXCLUDED
    return Outcome.UNDECIDED


def share_detectable(n: int, share: float, *, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest true ``P(d > margin) - share`` that ``n`` seeds show (Clopper-Pearson lower bound above ``share``)
    with probability ``power``; ``inf`` when even every seed clearing cannot (exact binomial).

    Examples:
        >>> round(share_detectable(10, 0.5), 3), share_detectable(5, 0.5)
        (0.417, inf)
    """
    ks = np.arange(n + 1)
    lower = np.asarray(bounds.proportion_bounds(ks, n, alpha=alpha)[0])
    clear = ks[lower > share]
    if clear.size == 0:
        return math.inf
    need = int(clear[0])  # the fewest seeds that must clear the margin

    def gap(p: float) -> float:
        return float(stats.binom.sf(need - 1, n, p)) - power

    if gap(1.0) < 0:
        return math.inf
    return float(optimize.brentq(gap, share, 1.0, xtol=1e-6)) - share


def _mean_stats(c: Comparison, d: np.ndarray, count: int) -> ComparisonStats:
    n, mean = d.size, float(d.mean())
    if c.bounds is None:
        lower = float(bounds.location_lower_bound(d, alpha=ALPHA))
        upper = float(bounds.location_upper_bound(d, alpha=ALPHA))
        median = float(np.median(d))  # the location method bounds the median
        outcome = _outcome(lower, upper, c.margin)
        return ComparisonStats(median, lower, upper, c.margin, mean, n, count, outcome, "median (order statistics)")
    lo, hi = c.bounds
    x = np.clip(d, lo, hi)  # rounding at the ends of the range
    lower = float(bounds.mean_lower_bound(x, lo=lo, hi=hi, alpha=ALPHA))
    upper = float(bounds.mean_upper_bound(x, lo=lo, hi=hi, alpha=ALPHA))
    outcome, mde = _outcome(lower, upper, c.margin), math.nan
    if outcome is Outcome.UNDECIDED and c.role is Role.PRIMARY:  # what these seeds could have shown
        sd = float(x.std(ddof=1))
        mde = float(bounds.min_detectable_effect(n, lo=lo, hi=hi, margin=c.margin, alpha=ALPHA, sd=sd, power=POWER))
    return ComparisonStats(mean, lower, upper, c.margin, mean, n, count, outcome, "bounded mean (betting)", mde)


def compare(c: Comparison) -> ComparisonStats:
    """Bounds, outcome and minimum detectable effect of a comparison at level `ALPHA`.

    Raises:
        DomainError: a judged (primary or secondary) mean criterion with fewer than two values.
    """
    d = np.asarray(c.differences, dtype=np.float64)
    n = int(d.size)
    if c.kind is Criterion.MEAN and c.role is not Role.CONTEXT and n < 2:
        raise DomainError(
            f"comparison {c.name!r}: a judged mean criterion needs per-seed values (got {n}); "
            "use exact_criterion for a deterministic number"
        )
    if n == 0 or not np.all(np.isfinite(d)):
        nan = math.nan
        return ComparisonStats(nan, nan, nan, c.margin, nan, n, 0, Outcome.UNDECIDED, "non-finite values")
    count, mean = int((d > c.margin).sum()), float(d.mean())
    if c.kind is Criterion.EXACT:
        low, high = float(d.min()), float(d.max())
        holds = bool(np.all(d > c.margin))
        return ComparisonStats(
            mean, low, high, c.margin, mean, n, count, Outcome.HOLDS if holds else Outcome.EXCLUDED, "exact"
        )
    if c.kind is Criterion.QUANTILE:
        assert c.share is not None
        low, high = (float(x) for x in bounds.proportion_bounds(count, n, alpha=ALPHA))
        outcome = _outcome(low, high, c.share)
        mde = share_detectable(n, c.share) if outcome is Outcome.UNDECIDED and c.role is Role.PRIMARY else math.nan
        return ComparisonStats(count / n, low, high, c.share, mean, n, count, outcome, "Clopper-Pearson share", mde)
    if n < 2:  # a context row with one number: shown, never judged
        return ComparisonStats(mean, mean, mean, c.margin, mean, n, count, Outcome.UNDECIDED, "single value")
    return _mean_stats(c, d, count)


def verdict_of(result: Result) -> Verdict:
    """The primary comparison's outcome as the check's verdict.

    Raises:
        DomainError: the result has no single primary comparison, or its primary has non-finite values.
    """
    primary = result.primary
    st = compare(primary)
    if not math.isfinite(st.estimate):
        raise DomainError(f"primary comparison {primary.name!r}: non-finite differences {primary.differences!r}")
    return _VERDICT[st.outcome]
