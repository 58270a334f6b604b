"""The README method table's status column is generated from a full run's results.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.errors import DomainError
from posttrain.paper_checks.readme_table import BEGIN, END, STORED_RESULTS, check_status, render_table, update_readme

ROOT = Path(__file__).resolve().parents[2]


def _row(name: str, asserted: bool, passed: bool, **kw: object) -> dict[str, object]:
    base = {"name": name, "asserted": asserted, "passed": passed, "kind": "mean", "mean": 0.1, "ci_low": 0.05,
            "ci_high": 0.15, "margin": 0.0, "count": 9, "n": 10, "required": None, "headline": False}  # fmt: skip
    return {**base, **kw}


RESULTS = {
    "mode": "full",
    "checks": [
        {"id": "01", "verdict": "reproduced", "comparisons": [
            _row("A", True, True), _row("D vs KDRL", False, False, mean=-0.045, headline=True)]},
        {"id": "11a", "verdict": "reproduced", "comparisons": [_row("x", True, True)]},
        {"id": "11b", "verdict": "not reproduced", "comparisons": [
            _row("y", True, False, kind="fraction", count=5, required=9), _row("z", True, True)]},
    ],
}  # fmt: skip
README = f"""intro
{BEGIN}
| # | paper | estimators | check | status |
| --- | --- | --- | --- | --- |
| core | GRPO | `grpo` | golden vectors | done |
| 01 | OPD | `opd_token_advantages` (a \\| b) | 01 | old text |
| 11 | RAIL | `rail` | 11a, 11b | old |
| 12 | Muon | `muon` | 12 | untouched (no results) |
{END}
after
"""


def test_status_column_is_generated_and_the_rest_kept() -> None:
    text, changed = render_table(README, RESULTS)
    assert changed == 2
    lines = text.splitlines()
    assert lines[0] == "intro" and lines[-1] == "after"
    row01 = next(line for line in lines if line.startswith("| 01 "))
    assert row01.startswith("| 01 | OPD | `opd_token_advantages` (a \\| b) | 01 | reproduced (1/1 asserted pass)")
    assert "reported only: D vs KDRL: mean -0.045" in row01 and "(would fail)" in row01
    row11 = next(line for line in lines if line.startswith("| 11 "))
    assert "11a: reproduced (1/1 asserted pass); 11b: **not reproduced** (1/2 asserted pass)" in row11
    assert "fails: y: 5/10 seeds > 0, needs 9" in row11
    assert "| core | GRPO | `grpo` | golden vectors | done |" in lines
    assert "| 12 | Muon | `muon` | 12 | untouched (no results) |" in lines
    assert render_table(text, RESULTS) == (text, 0)  # idempotent


def test_errors_and_bad_readme() -> None:
    assert check_status({"verdict": "error", "comparisons": []}) == "**error**"
    with pytest.raises(DomainError, match="markers"):
        render_table("no table", RESULTS)


def test_update_readme_stores_the_results(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(README)
    (tmp_path / "results.json").write_text(json.dumps(RESULTS))
    assert update_readme(tmp_path / "results.json", tmp_path / "README.md") == 2
    assert json.loads((tmp_path / STORED_RESULTS).read_text()) == RESULTS
    (tmp_path / "smoke.json").write_text(json.dumps({**RESULTS, "mode": "smoke"}))
    with pytest.raises(DomainError, match="full run"):
        update_readme(tmp_path / "smoke.json", tmp_path / "README.md")


def test_the_repository_readme_matches_its_stored_results() -> None:
    stored = ROOT / STORED_RESULTS
    assert stored.exists(), f"{stored} missing: regenerate with `posttrain check --out reports --update-readme`"
    readme = (ROOT / "README.md").read_text()
    assert render_table(readme, json.loads(stored.read_text()))[1] == 0, "README status column is stale"
