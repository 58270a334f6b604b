"""The README method table's generated cells come from a full run's results.json and mutants.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.errors import DomainError
from posttrain.paper_checks.readme_table import (
    BEGIN,
    END,
    FAIL_COLUMN,
    STORED_MUTANTS,
    STORED_RESULTS,
    check_status,
    render_table,
    stored_real,
    update_readme,
)

ROOT = Path(__file__).resolve().parents[2]


def _row(name: str, role: str, outcome: str, **kw: object) -> dict[str, object]:
    base = {"name": name, "role": role, "outcome": outcome, "kind": "mean", "estimate": 0.1, "lower": 0.05,
            "upper": 0.15, "margin": 0.0, "bounds": [-1.0, 1.0], "share": None, "count": 9, "n": 10,
            "mde": None, "headline": False}  # fmt: skip
    return {**base, **kw}


RESULTS = {
    "mode": "full",
    "checks": [
        {"id": "01", "verdict": "reproduced", "abstract": "OPD-then-RL wins.", "comparisons": [
            _row("A", "primary", "holds"), _row("B", "secondary", "holds"),
            _row("D vs KDRL", "context", "excluded", estimate=-0.045, headline=True)]},
        {"id": "11a", "verdict": "reproduced", "comparisons": [_row("x", "primary", "holds")]},
        {"id": "11b", "verdict": "inconclusive", "comparisons": [
            _row("y", "primary", "undecided", lower=-0.2, mde=0.31), _row("z", "secondary", "excluded")]},
    ],
}  # fmt: skip
MUTANTS = {"mode": "full", "mutants": [
    {"id": "01", "mutant": "grpo-for-otr", "verdict": "inconclusive", "primary": _row("A", "primary", "undecided")},
    {"id": "11b", "mutant": "heuristic-for-rail", "verdict": "reproduced", "primary": None},
]}  # fmt: skip
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


def test_generated_cells_and_the_inserted_column() -> None:
    text, changed = render_table(README, RESULTS, MUTANTS)
    assert changed == 6  # header, separator, and the four rows gain the column
    lines = text.splitlines()
    assert lines[0] == "intro" and lines[-1] == "after"
    assert lines[2] == f"| # | paper | estimators | check | {FAIL_COLUMN} | status |"
    row01 = next(line for line in lines if line.startswith("| 01 "))
    assert row01.startswith("| 01 | OPD | `opd_token_advantages` (a \\| b) | 01 | grpo-for-otr: inconclusive (0.1 [")
    assert '| reproduced; tests "OPD-then-RL wins."; primary A: 0.1 [0.05, 0.15], needs mean > 0 on [-1, 1]' in row01
    assert "secondary holding 1/1" in row01 and "reported only: D vs KDRL: -0.045 [" in row01
    row11 = next(line for line in lines if line.startswith("| 11 "))
    assert "11a: no mutant declared; 11b: heuristic-for-rail: **reproduced** |" in row11
    assert "11b: **inconclusive**" in row11 and "detectable at 10 seeds (80% power): 0.31 over the margin" in row11
    assert "| core | GRPO | `grpo` | golden vectors | - | done |" in lines
    assert "| 12 | Muon | `muon` | 12 | - | untouched (no results) |" in lines
    assert render_table(text, RESULTS, MUTANTS) == (text, 0)  # idempotent
    without = render_table(text, RESULTS)[0]  # no mutants.json: the column is kept as it is
    assert "grpo-for-otr: inconclusive" in without


def test_errors_and_bad_readme() -> None:
    assert check_status({"verdict": "error", "error": "boom", "comparisons": []}) == "**error**: boom"
    with pytest.raises(DomainError, match="markers"):
        render_table("no table", RESULTS)


def test_update_readme_stores_the_results(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(README)
    (tmp_path / "results.json").write_text(json.dumps(RESULTS))
    (tmp_path / "mutants.json").write_text(json.dumps(MUTANTS))
    assert update_readme(tmp_path / "results.json", tmp_path / "README.md") == 6
    assert json.loads((tmp_path / STORED_RESULTS).read_text()) == RESULTS
    assert json.loads((tmp_path / STORED_MUTANTS).read_text()) == MUTANTS
    (tmp_path / "smoke.json").write_text(json.dumps({**RESULTS, "mode": "smoke"}))
    with pytest.raises(DomainError, match="full run"):
        update_readme(tmp_path / "smoke.json", tmp_path / "README.md")


def test_the_repository_readme_matches_its_stored_results() -> None:
    stored = ROOT / STORED_RESULTS
    assert stored.exists(), (
        f"{stored} missing: regenerate with `posttrain check --out reports --mutants --update-readme`"
    )
    mutants = ROOT / STORED_MUTANTS
    runs = json.loads(mutants.read_text()) if mutants.exists() else None
    readme = (ROOT / "README.md").read_text()
    real = stored_real(ROOT)  # the real-model column, once the real tier has stored its results
    assert render_table(readme, json.loads(stored.read_text()), runs, real)[1] == 0, "README generated cells are stale"
