"""`plan_chunks` finds the cheapest chunking: equal to an exhaustive search over boundaries at row ends."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import DomainError
from posttrain.llm.rollout.chunks import chunk_cost, plan_chunks


def exhaustive(fed: list[int], overhead: float, max_chunks: int) -> float:
    """The least cost over every set of inner boundaries at row ends (at most ``max_chunks`` chunks)."""
    ends = sorted({f for f in fed if f > 0})
    inner = ends[:-1]
    return min(
        chunk_cost(fed, [0, *cut, ends[-1]], overhead)
        for n in range(min(len(inner), max_chunks - 1) + 1)
        for cut in itertools.combinations(inner, n)
    )


@settings(max_examples=80, deadline=None)
@given(
    fed=st.lists(st.integers(0, 12), min_size=1, max_size=10).filter(lambda f: max(f) > 0),
    overhead=st.floats(0, 30),
    max_chunks=st.integers(1, 4),
)
def test_plan_is_optimal(fed: list[int], overhead: float, max_chunks: int) -> None:
    bounds = plan_chunks(fed, overhead=overhead, max_chunks=max_chunks)
    assert bounds[0] == 0 and bounds[-1] == max(fed) and bounds == sorted(set(bounds))
    assert len(bounds) - 1 <= max_chunks
    assert chunk_cost(fed, bounds, overhead) == pytest.approx(exhaustive(fed, overhead, max_chunks))


def test_limits() -> None:
    assert plan_chunks([0, 0], overhead=1.0) == [0]  # nothing to feed
    assert plan_chunks([5, 5, 5], overhead=0.0) == [0, 5]  # equal lengths: one chunk
    assert plan_chunks([9, 1, 1, 1, 1], overhead=0.0) == [0, 1, 9]  # no padding at all
    many = list(range(1, 200))
    bounds = plan_chunks(many, overhead=0.0, max_chunks=8)  # boundaries among 32 of the 199 ends
    assert len(bounds) == 9 and bounds[-1] == 199
    with pytest.raises(DomainError, match="plan_chunks"):
        plan_chunks([-1], overhead=0.0)
