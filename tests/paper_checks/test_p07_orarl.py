"""Paper check 07 (OraRL): contract and determinism."""

from __future__ import annotations

import dataclasses

from posttrain.paper_checks.p07_orarl import Config, run
from tests.paper_checks._distill_contract import assert_contract

TINY = dataclasses.replace(Config.smoke(), prompts=8, steps=6, binary_methods=("grpo", "naive", "orarl"))


def test_contract_and_determinism() -> None:
    result = assert_contract(run, TINY)
    rates = {m.name: m.per_seed for m in result.metrics}
    assert all(0.0 <= x <= 1.0 for x in rates["naive inversion rate"] + rates["OraRL selected-row flip rate"])
    assert rates["binary: naive inversion rate"] == (0.0,) * TINY.seeds  # binary rewards never invert
