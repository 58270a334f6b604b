"""Paper check 18 (DPO pair design): contract, determinism, smoke verdict; full verdict (slow)."""

from __future__ import annotations

from typing import Any, ClassVar

from posttrain.paper_checks.base import Result, Verdict, verdict_of
from posttrain.paper_checks.p18_dpo_design import Config, run
from tests.paper_checks._es_contract import CheckContract


class TestP18(CheckContract):
    check_id = "18"
    config_type = Config
    run = staticmethod(run)
    tiny: ClassVar[dict[str, Any]] = {"seeds": 2, "replicates": 2, "fw_iters": 50}

    def test_smoke_reproduces(self, smoke_result: Result) -> None:
        # plug-in/uniform ~0.5 against a 0.75 threshold: robust at 10 draws x 10 replicates
        assert verdict_of(smoke_result) is Verdict.REPRODUCED
