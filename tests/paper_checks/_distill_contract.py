"""Shared structural contract of the distillation paper checks (01, 04, 07, 08, 13)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from posttrain.paper_checks.base import Result


def assert_contract(run: Callable[[Any], Result], config: Any) -> Result:
    """Finite per-seed numbers of the right length, asserted comparisons present, same seed => same numbers."""
    a, b = run(config), run(config)
    assert a.metrics and any(c.asserted for c in a.comparisons)
    for m in a.metrics:
        assert all(math.isfinite(x) for x in m.per_seed), m.name
    for c in a.comparisons:
        assert c.differences and all(math.isfinite(x) for x in c.differences), c.name
        assert c.margin_reason, c.name
    assert [m.per_seed for m in a.metrics] == [m.per_seed for m in b.metrics]
    assert [c.differences for c in a.comparisons] == [c.differences for c in b.comparisons]
    return a
