"""Paper check 05 (ES keeps coverage): contract and determinism on small configs; verdict on the full one (slow)."""

from __future__ import annotations

from typing import Any, ClassVar

from posttrain.paper_checks.p05_es_coverage import Config, run
from tests.paper_checks._es_contract import CheckContract


class TestP05(CheckContract):
    check_id = "05"
    config_type = Config
    run = staticmethod(run)
    tiny: ClassVar[dict[str, Any]] = {"seeds": 2, "n_train": 128, "n_test": 64, "steps": 6, "lemma_draws": 50}
