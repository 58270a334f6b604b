"""Paper check 10 (ES solution coverage): contract and determinism on small configs; verdict on the full one (slow)."""

from __future__ import annotations

from typing import Any, ClassVar

from posttrain.paper_checks.p10_es_solution_coverage import Config, run
from tests.paper_checks._es_contract import CheckContract


class TestP10(CheckContract):
    check_id = "10"
    config_type = Config
    run = staticmethod(run)
    tiny: ClassVar[dict[str, Any]] = {"seeds": 2, "n_train": 128, "n_test": 64, "steps": 6}
