"""Paper check 19 (select and improve): contract and determinism on small configs; verdict on the full one (slow)."""

from __future__ import annotations

from typing import Any, ClassVar

from posttrain.paper_checks.p19_select_improve import Config, run
from tests.paper_checks._es_contract import CheckContract


class TestP19(CheckContract):
    check_id = "19"
    config_type = Config
    run = staticmethod(run)
    tiny: ClassVar[dict[str, Any]] = {"seeds": 2, "sft_steps": 10, "rl_steps": 10, "rollouts_per_type": 50}
