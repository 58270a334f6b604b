"""Paper check 14 (GFlowRL): structural contract and determinism on the smoke config."""

from __future__ import annotations

import dataclasses
import math

from posttrain.paper_checks.p14_gflowrl import Config, run

TINY = dataclasses.replace(Config.smoke(), steps=60)


def test_smoke_contract_and_determinism() -> None:
    a, b = run(TINY), run(TINY)
    assert a.metrics and a.comparisons
    assert all(math.isfinite(x) for m in a.metrics for x in m.per_seed)
    tv = {m.name: m.per_seed for m in a.metrics}
    assert all(0.0 <= x <= 1.0 for name, v in tv.items() if name.startswith("tv") for x in v)
    assert [m.per_seed for m in a.metrics] == [m.per_seed for m in b.metrics]
