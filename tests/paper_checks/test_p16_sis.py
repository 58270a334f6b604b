"""Paper check 16 (SIS): structural contract, determinism, and the N = 1 identity."""

from __future__ import annotations

import dataclasses
import math

from posttrain.paper_checks.base import compare
from posttrain.paper_checks.p16_sis import Config, run

TINY = dataclasses.replace(Config.smoke(), grad_steps=16)


def test_smoke_contract_and_on_policy_identity() -> None:
    result = run(TINY)
    assert result.metrics and result.comparisons
    assert all(math.isfinite(x) for m in result.metrics for x in m.per_seed)
    by_name = {c.name: c for c in result.comparisons}
    # at N = 1 every token is accepted and SIS is bit-identical to clipped token IS (asserted by the spec)
    assert compare(by_name["SIS == PPO bit-identical at N=1 (1 = yes)"]).passed
    assert compare(by_name["D_sis <= D_orig at every update (1 = yes)"]).passed
    accept = {m.name: m.per_seed for m in result.metrics if m.name.startswith("accept")}
    assert all(x == 1.0 for x in accept["accept sis N=1"])
    assert all(x < 1.0 for x in accept["accept sis N=16"])


def test_same_seed_same_numbers() -> None:
    a, b = run(TINY), run(TINY)
    assert [m.per_seed for m in a.metrics] == [m.per_seed for m in b.metrics]
