"""``_seeds.seedwise``: "in at least a fraction f of the seeds" equals an order-statistic rule."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from posttrain.paper_checks._seeds import order_statistic, seedwise
from posttrain.paper_checks.base import compare


@given(
    d=st.lists(st.floats(-1, 1), min_size=1, max_size=12),
    margin=st.floats(-0.5, 0.5),
    fraction=st.sampled_from([0.5, 0.8, 1.0]),
)
def test_seedwise_counts_seeds(d: list[float], margin: float, fraction: float) -> None:
    c = seedwise("x", d, margin=margin, margin_reason="test", fraction=fraction)
    need = math.ceil(fraction * len(d) - 1e-12)
    expected = sum(x > margin for x in d) >= need
    assert compare(c).passed == expected == (order_statistic(d, fraction=fraction) > margin)
    assert c.differences == tuple(d)
