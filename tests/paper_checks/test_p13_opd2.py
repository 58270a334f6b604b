"""Paper check 13 (OPD²): contract, determinism and the smoke verdict."""

from __future__ import annotations

import dataclasses

from posttrain.paper_checks.base import verdict_of
from posttrain.paper_checks.p13_opd2 import Config, run
from tests.paper_checks._distill_contract import assert_contract

TINY = dataclasses.replace(Config.smoke(), num_prompts=4, steps=5)


def test_contract_and_determinism() -> None:
    result = assert_contract(run, TINY)
    assert any(m.name.startswith("strong student") for m in result.metrics)


def test_smoke_verdict() -> None:
    # the spec's criteria hold with wide margins already at the smoke size (40 steps)
    assert verdict_of(run(Config.smoke())).value == "reproduced"
