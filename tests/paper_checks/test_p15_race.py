"""Paper check 15 (RACE): contract, determinism, smoke verdict; full verdict (slow)."""

from __future__ import annotations

from typing import Any, ClassVar

from posttrain.paper_checks.base import Result, Verdict, verdict_of
from posttrain.paper_checks.p15_race import Config, run
from tests.paper_checks._es_contract import CheckContract


class TestP15(CheckContract):
    check_id = "15"
    config_type = Config
    run = staticmethod(run)
    tiny: ClassVar[dict[str, Any]] = {"seeds": 2, "budget": 2e4}

    def test_smoke_reproduces(self, smoke_result: Result) -> None:
        assert verdict_of(smoke_result) is Verdict.REPRODUCED
