"""Paper check 15 (RACE): contract, determinism, smoke verdict; full verdict (slow)."""

from __future__ import annotations

from typing import Any, ClassVar

from posttrain.paper_checks.base import Result
from posttrain.paper_checks.p15_race import Config, run
from tests.paper_checks._es_contract import CheckContract
from tests.paper_checks._recorded import smoke_misses


class TestP15(CheckContract):
    check_id = "15"
    config_type = Config
    run = staticmethod(run)
    tiny: ClassVar[dict[str, Any]] = {"seeds": 2, "budget": 2e4}

    def test_smoke_directions(self, smoke_result: Result) -> None:
        assert smoke_misses(smoke_result) == []
