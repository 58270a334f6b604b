"""``_seeds.seedwise``: "in at least a fraction f of the seeds", counted and binomial-tested."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from posttrain.paper_checks._seeds import order_statistic, seedwise
from posttrain.paper_checks.base import ALPHA, Criterion, compare


@given(
    d=st.lists(st.floats(-1, 1), min_size=1, max_size=16),
    margin=st.floats(-0.5, 0.5),
    fraction=st.sampled_from([0.5, 0.8, 1.0]),
)
def test_seedwise_counts_seeds_and_tests_the_count(d: list[float], margin: float, fraction: float) -> None:
    c = seedwise("x", d, margin=margin, margin_reason="test", fraction=fraction)
    n, count = len(d), sum(x > margin for x in d)
    share_ok = count >= math.ceil(fraction * n - 1e-12)
    assert share_ok == (order_statistic(d, fraction=fraction) > margin)
    test_ok = stats.binomtest(count, n, 0.5, alternative="greater").pvalue <= ALPHA if count else False
    st_ = compare(c)
    assert st_.passed == (share_ok and test_ok)
    assert st_.count == count and c.kind is Criterion.FRACTION and c.differences == tuple(d)
