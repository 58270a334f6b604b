"""Paper check 08 (Open-MOPD): contract and determinism."""

from __future__ import annotations

import dataclasses

from posttrain.paper_checks.p08_open_mopd import Config, run
from tests.paper_checks._distill_contract import assert_contract

TINY = dataclasses.replace(Config.smoke(), rollout_batches=3)


def test_contract_and_determinism() -> None:
    assert_contract(run, TINY)
