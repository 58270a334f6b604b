"""Paper check 07 (OraRL): contract, determinism, pilot seeds, the binary-reward criterion."""

from __future__ import annotations

import dataclasses

import pytest

from posttrain.paper_checks.model import Role
from posttrain.paper_checks.p07_orarl import Config, Method, run
from tests.paper_checks._distill_contract import assert_contract, assert_first_seed_moves
from tests.paper_checks._recorded import assert_matches_recorded

TINY = dataclasses.replace(Config.smoke(), prompts=8, steps=6, binary_methods=(Method.GRPO, Method.NAIVE, Method.ORARL))


def test_contract_and_determinism() -> None:
    result = assert_contract(run, TINY)
    rates = {m.name: m.per_seed for m in result.metrics}
    assert all(0.0 <= x <= 1.0 for x in rates["naive inversion rate"] + rates["OraRL selected-row flip rate"])
    assert rates["binary: naive inversion rate"] == (0.0,) * TINY.seeds  # binary rewards never invert
    binary = [c for c in result.comparisons if c.name.startswith("binary:")]
    assert len(binary) == 1 and binary[0].role is Role.SECONDARY  # judged and reported, never deciding


def test_pilot_seeds_are_other_seeds() -> None:
    assert_first_seed_moves(run, dataclasses.replace(TINY, binary_methods=()))


@pytest.mark.slow
def test_full_verdict_matches_the_recorded_run() -> None:
    assert_matches_recorded("07", run(Config()))
