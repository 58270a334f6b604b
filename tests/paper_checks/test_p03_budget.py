"""Paper check 03 (near-optimal budget region): contract and determinism; full verdict (slow).

The smoke verdict is not asserted: the widths sit on grid steps, and 6 smoke seeds are too few for
the harness's tests; the full-config verdict is compared with the recorded run (slow).
"""

from __future__ import annotations

from typing import Any, ClassVar

from posttrain.paper_checks.p03_budget import Config, run
from tests.paper_checks._es_contract import CheckContract


class TestP03(CheckContract):
    check_id = "03"
    config_type = Config
    run = staticmethod(run)
    tiny: ClassVar[dict[str, Any]] = {"seeds": 2, "newton_iters": 4, "n_boot": 20, "budget": 60}
