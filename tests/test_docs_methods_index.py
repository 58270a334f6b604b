"""The methods index says where each method runs and where its verdict comes from, as the code does.

Findings covered: 04 (Self-Routing), 07 (OraRL), 08 (Open-MOPD) marked "estimators only" and 18 (DPO pair
design) "analysis" although all four run in the trainer; verdicts said to come from ``--out docs/checks``
while the pages read ``docs/paper_checks/``.
"""

from __future__ import annotations

import re
from pathlib import Path

INDEX = Path(__file__).resolve().parents[1] / "docs" / "methods" / "index.md"


def _rows() -> dict[str, str]:
    rows = {}
    for line in INDEX.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"\d\d", cells[0]):
            rows[cells[0]] = cells[3]
    return rows


def test_every_method_named_in_the_trainer_column_is_registered() -> None:
    from posttrain.llm.methods.catalog import METHODS

    named = [m for cell in _rows().values() for m in re.findall(r"algorithm\.method: (\w+)", cell)]
    assert named and all(m in METHODS.names() for m in named), [m for m in named if m not in METHODS.names()]


def test_methods_that_run_in_the_trainer_say_so() -> None:
    rows = _rows()
    for check, method in (("04", "self_routing"), ("07", "orarl"), ("08", "open_mopd")):
        assert f"algorithm.method: {method}" in rows[check], (check, rows[check])
    assert "posttrain pairs" in rows["18"] and "posttrain dpo" in rows["18"], rows["18"]


def test_verdicts_are_read_from_where_they_are_stored() -> None:
    from posttrain.paper_checks.readme_table import STORED_RESULTS

    text = INDEX.read_text()
    assert "docs/checks" not in text
    assert f"`{STORED_RESULTS.parent.as_posix()}/`" in text
