"""Paper check 15 (RACE): contract, determinism, smoke directions, the mutants' accounting, the power plan; full
verdict (slow)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from posttrain.paper_checks import bounds
from posttrain.paper_checks.model import ALPHA, Result
from posttrain.paper_checks.p15_race import RULE, Config, Cost, _step_split, run
from tests.paper_checks._es_contract import CheckContract
from tests.paper_checks._recorded import smoke_misses


class TestP15(CheckContract):
    check_id = "15"
    config_type = Config
    run = staticmethod(run)
    tiny: ClassVar[dict[str, Any]] = {"seeds": 2, "grid_seeds": 2, "budget": 2e4}

    def test_smoke_directions(self, smoke_result: Result) -> None:
        assert smoke_misses(smoke_result) == []


def test_the_mutants_charge_steps_differently() -> None:
    """Size-blind: L costs what S costs; search-only: the step costs its rollouts alone (cheaper)."""
    cfg = Config()
    blind = dataclasses.replace(cfg, substitute=((Cost.FLOPS, Cost.SIZE_BLIND),))
    search = dataclasses.replace(cfg, substitute=((Cost.FLOPS, Cost.SEARCH_ONLY),))
    for g in cfg.grid:
        full_s, full_l = _step_split(cfg, "S", g, RULE)[0], _step_split(cfg, "L", g, RULE)[0]
        assert full_l == 14.0 * full_s
        assert _step_split(blind, "L", g, RULE)[0] == full_s
        assert _step_split(search, "L", g, RULE)[0] == full_l * g / (g + 6)  # 2NG of 2NG + 6Nk, k = 2


def test_seed_count_has_the_planned_power() -> None:
    """Pilot (stream 10_000): the primary's d has SD 0.025; the spec's calibrated effect 0.048 (L's half)."""
    assert bounds.power(0.048, Config().seeds, lo=-1.0, hi=1.0, margin=0.0, alpha=ALPHA, sd=0.025) >= 0.8
