"""Paper check 08 (Open-MOPD): contract and determinism."""

from __future__ import annotations

import dataclasses

import pytest

from posttrain.paper_checks.p08_open_mopd import Config, run
from tests.paper_checks._distill_contract import assert_contract
from tests.paper_checks._recorded import assert_matches_recorded

TINY = dataclasses.replace(Config.smoke(), rollout_batches=3)


def test_contract_and_determinism() -> None:
    assert_contract(run, TINY)


@pytest.mark.slow
def test_full_verdict_matches_the_recorded_run() -> None:
    assert_matches_recorded("08", run(Config()))
