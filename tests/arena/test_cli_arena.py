"""``posttrain arena``: bad input is one line and exit code 2; a small run writes the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posttrain.cli import app

runner = CliRunner()


def _one_line_error(args: list[str], needle: str) -> None:
    result = runner.invoke(app, ["arena", *args])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert needle in lines[0], lines[0]


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(
        "import torch\nVALUE = 1\n"
        "def three(a, b, c):\n    return a\n"
        "def adv(rewards):\n    return rewards - rewards.mean(-1, keepdim=True)\n"
    )
    (tmp_path / "broken.py").write_text("this is not python\n")
    _one_line_error([f"{tmp_path}/broken.py:adv"], "does not import")
    _one_line_error(["not_a_module_xyz:adv"], "does not import")
    _one_line_error([f"{tmp_path}/mine.py:VALUE"], "not a function")
    _one_line_error([f"{tmp_path}/mine.py:missing"], "has no name")
    _one_line_error([f"{tmp_path}/mine.py:three", "--kind", "advantage"], "does not have a advantage signature")
    _one_line_error([f"{tmp_path}/mine.py:adv", "--kind", "value"], "kind: expected one of")
    _one_line_error([f"{tmp_path}/mine.py:adv", "--baselines", "rloo,nope"], "unknown advantage 'nope'")
    _one_line_error([f"{tmp_path}/mine.py:adv", "--seeds", "1"], "at least 2 seeds")


@pytest.mark.slow
def test_a_run_writes_the_report_and_a_summary_that_fits_80_columns(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = runner.invoke(app, ["arena", "tests/arena/planted.py:rloo_by_matrix", "--seeds", "16", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    data = json.loads((out / "report.json").read_text())
    assert [m["name"] for m in data["conventions"]["matches"] if m["relation"] == "equal"] == ["rloo"]
    assert not any(g["p_value"] < 1e-4 for g in data["gradients"]["tests/arena/planted.py:rloo_by_matrix"])
    verdicts = {(e["endpoint"], e["baseline"]): e["verdict"] for e in data["endpoints"]}
    assert verdicts[("final reward", "rloo")] == "indistinguishable"
    assert (out / "arena.png").stat().st_size > 10_000 and "## 4. Learning curves" in (out / "report.md").read_text()
    assert data["cost"]["cpu_s"] > 0 and len(data["cost"]["load_avg"]) == 3
