"""Seed plans for quantile criteria: how many seeds show "P(d > margin) > share" with power `POWER`.

`bounds.seeds_for_power` plans a bounded-mean criterion; a quantile criterion is judged by the exact
Clopper-Pearson bound on the count of seeds clearing the margin, whose power at a true per-seed
share ``p`` is an exact binomial tail (`stats.share_detectable` inverts it). That power is a sawtooth
in the seed count (one more seed can raise the count a claim needs), so a plan is the first count
from which every larger count keeps the power.
"""

from __future__ import annotations

from posttrain.paper_checks.model import MEDIAN
from posttrain.paper_checks.stats import POWER, share_detectable

__all__ = ["seeds_for_share"]


def seeds_for_share(share: float, *, claimed: float = MEDIAN, max_seeds: int = 200) -> int:
    """Fewest seeds ``n`` such that at every count in ``[n, max_seeds]`` a true per-seed share ``share``
    shows "P(d > margin) > claimed" with probability at least `POWER` (exact binomial).

    Raises:
        ValueError: ``share`` is not above ``claimed``, or ``max_seeds`` seeds do not reach the power.

    Examples:
        >>> seeds_for_share(0.8), seeds_for_share(0.9)
        (23, 12)
    """
    if not claimed < share <= 1.0:
        raise ValueError(f"share: expected a per-seed share in ({claimed}, 1], got {share!r}")
    ok = [share_detectable(n, claimed) <= share - claimed for n in range(1, max_seeds + 1)]
    if not ok[-1]:
        raise ValueError(f"share {share}: {max_seeds} seeds do not reach power {POWER}")
    last_bad = max((n for n, good in enumerate(ok, start=1) if not good), default=0)
    return last_bad + 1
