"""Shared structural contract of the distillation paper checks (01, 04, 07, 08, 13)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from posttrain.paper_checks.model import Result


def assert_contract(run: Callable[[Any], Result], config: Any) -> Result:
    """Finite per-seed numbers, exactly one primary comparison, reasons stated, same seed => same numbers."""
    a, b = run(config), run(config)
    assert a.metrics and a.primary.differences  # `primary` raises unless exactly one comparison is primary
    for m in a.metrics:
        assert all(math.isfinite(x) for x in m.per_seed), m.name
    for c in a.comparisons:
        assert c.differences and all(math.isfinite(x) for x in c.differences), c.name
        assert c.margin_reason, c.name
    assert [m.per_seed for m in a.metrics] == [m.per_seed for m in b.metrics]
    assert [c.differences for c in a.comparisons] == [c.differences for c in b.comparisons]
    return a


def assert_first_seed_moves(run: Callable[[Any], Result], config: Any) -> None:
    """``first_seed`` moves the environments and sampling streams: a pilot never sees the evaluation seeds.

    Seed ``first_seed + i`` of a run equals (to rounding) seed ``i`` of a run started ``first_seed`` earlier
    (each seed is its own environment), and seed 10_000 is not seed 0 (metrics that vary over seeds move;
    discrete shares may coincide, so most, not all, must move).
    """
    two = dataclasses.replace(config, seeds=2)
    base = {m.name: m.per_seed for m in run(two).metrics}
    shifted = {m.name: m.per_seed for m in run(dataclasses.replace(two, seeds=1, first_seed=1)).metrics}
    same = {k: v[1:] for k, v in base.items() if len(v) == 2}
    assert same.keys() <= shifted.keys()
    for k, v in same.items():  # equal up to rounding: batched reductions may sum in another order
        assert all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12) for x, y in zip(v, shifted[k], strict=True)), k
    moved = {m.name: m.per_seed for m in run(dataclasses.replace(two, seeds=1, first_seed=10_000)).metrics}
    varying = [k for k, v in base.items() if len(v) == 2 and v[0] != v[1]]
    assert varying and 2 * sum(moved[k][0] != base[k][0] for k in varying) > len(varying)
