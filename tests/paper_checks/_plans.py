"""Power of the quantile and median criteria at a check's planned seed count (the tests of its power plan).

`bounds.power` covers the bounded-mean bound; these cover the two exact methods: the Clopper-Pearson
share (`quantile_power`, exact binomial) and the median's order-statistic bound (`location_power`,
Monte Carlo under a normal alternative with a pilot's standard deviation).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from posttrain.paper_checks import bounds
from posttrain.paper_checks.model import ALPHA


def quantile_power(n: int, p_true: float, share: float) -> float:
    """P(the Clopper-Pearson lower bound on the share of ``n`` seeds clears ``share``) when each clears w.p. ``p_true``."""
    ks = np.arange(n + 1)
    lower = np.asarray(bounds.proportion_bounds(ks, n, alpha=ALPHA)[0])
    clear = ks[lower > share]
    return 0.0 if clear.size == 0 else float(stats.binom.sf(clear[0] - 1, n, p_true))


def location_power(n: int, *, median: float, sd: float, margin: float, reps: int = 4000, seed: int = 0) -> float:
    """P(the median's lower bound from ``n`` normal draws (``median``, ``sd``) clears ``margin``), Monte Carlo."""
    x = np.random.default_rng(seed).normal(median, sd, (reps, n))
    return float((np.asarray(bounds.location_lower_bound(x, alpha=ALPHA)) > margin).mean())
