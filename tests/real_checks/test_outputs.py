"""Generated outputs: the transfer table, standardised effects, the README cell, the docs sections between markers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from posttrain.real_checks.outputs import (
    _replace,
    lesson,
    merge_results,
    method_section,
    real_model_cell,
    standardised_effect,
    transfer_rows,
    transfer_table,
    update_docs,
)


def _row(diffs: list[float], margin: float = 0.0) -> dict:
    return {"role": "primary", "name": "p", "differences": diffs, "margin": margin, "estimate": 1.0, "lower": 0.7,
            "upper": 1.0, "count": len(diffs), "n": len(diffs), "outcome": "holds", "mean": 0.1, "mde": math.nan}  # fmt: skip


def _real(eid: str, verdict: str, diffs: list[float], gate: list | None = None) -> dict:
    return {"id": eid, "title": f"paper {eid}", "verdict": verdict, "seeds_run": len(diffs), "seeds_planned": 9,
            "card": {"toy": [{"id": eid}], "effect": "e", "regime": {"p0": "0.2"}},
            "comparisons": [_row(diffs)], "gate": gate or []}  # fmt: skip


REAL = {"mode": "full", "run": {"profile": "full", "date": "d", "commit": "abc", "wall_s": 1.0, "cpu_s": 2.0},
        "experiments": [_real("01", "reproduced", [0.1, 0.2, 0.15]), _real("02", "inconclusive", [0.0, -0.1, 0.1]),
                        _real("03", "regime not reached", [-0.2, -0.1, -0.3],
                              [{"name": "zv", "value": 0.7, "inside": False, "toy": {"lo": 0.0, "hi": 0.1}}])]}  # fmt: skip
TOY = {"checks": [{"id": i, "verdict": "reproduced", "comparisons": [_row(d)]}
                  for i, d in (("01", [0.3, 0.5, 0.4]), ("02", [0.1, 0.2, 0.15]), ("03", [0.2, 0.3, 0.1]))]}  # fmt: skip


def test_standardised_effect():
    assert standardised_effect(_row([0.1, 0.2, 0.3])) == pytest.approx(0.2 / 0.1)
    assert standardised_effect(_row([0.1, 0.1])) == math.inf and standardised_effect(_row([0.1])) != 0.1
    assert math.isnan(standardised_effect(None))


def test_transfer_rows_sign_agreement_and_lessons():
    rows = {r["id"]: r for r in transfer_rows(REAL, TOY)}
    assert rows["01"]["same_sign"] and rows["01"]["lesson"] == ""
    assert rows["03"]["same_sign"] is False
    assert "0.7" in rows["03"]["lesson"] and "regime" in rows["03"]["lesson"]
    assert "too small or too noisy" in rows["02"]["lesson"]
    text = transfer_table(REAL, TOY)
    assert "| 03 paper 03 | 03 | reproduced | regime not reached | **no** |" in text
    assert "Spearman" in text and "over 3 papers" in text


def test_lesson_for_a_contradiction_with_the_regime_reached():
    assert "mechanism" in lesson({"verdict": "contradicted", "gate": []}, "reproduced")


def test_a_zero_effect_has_no_sign():
    zero = {**REAL, "experiments": [_real("01", "contradicted", [0.0, 0.0, 0.0])]}
    assert transfer_rows(zero, TOY)[0]["same_sign"] is None


def test_lesson_for_an_experiment_not_run_claims_nothing():
    text = lesson({"verdict": "not run", "runs_cached": 9, "runs_planned": 18}, "reproduced")
    assert "9 of 18" in text and "mechanism" not in text
    assert "mechanism" not in lesson({"verdict": "not run"}, "reproduced")


def test_a_mediator_not_measured_is_neither_a_miss_nor_a_value():
    unmeasured = {"name": "headroom", "value": math.nan, "inside": None, "toy": {"lo": 0.1, "hi": 1.0, "origin": "o"}}
    missed = {"name": "zv", "value": 0.7, "inside": False, "toy": {"lo": 0.0, "hi": 0.1, "origin": "o"}}
    entry = {**_real("08", "regime not reached", []), "gate": [missed, unmeasured]}
    text = lesson(entry, "reproduced")
    assert "zv is 0.7" in text and "headroom" not in text
    page = method_section(entry)
    assert "| headroom | - | [0.1, 1] | not measured |" in page and "| zv | 0.7 | [0, 0.1] | **no** |" in page


def test_an_infinite_standardised_effect_is_printed_as_infinite():
    toy = {"checks": [{"id": "01", "verdict": "reproduced", "comparisons": [_row([1.0, 1.0, 1.0], margin=0.5)]}]}
    real = {**REAL, "experiments": [_real("01", "reproduced", [0.1, 0.2, 0.15])]}
    row = transfer_table(real, toy).splitlines()[-3]
    assert "| yes | inf | 3 |" in row, row


def test_readme_cell_maps_lettered_ids_and_escapes_pipes():
    assert real_model_cell(["01"], REAL).startswith("reproduced (3 seeds")
    assert real_model_cell(["01", "02"], REAL).startswith("01: reproduced")
    assert real_model_cell(["11b"], REAL) == "-" and real_model_cell(["01"], None) == "-"


def test_replace_between_markers_keeps_the_rest():
    page = "# Title\n\nhand text\n"
    once = _replace(page, ("<!-- A -->", "<!-- END A -->"), "one\n")
    twice = _replace(once + "tail\n", ("<!-- A -->", "<!-- END A -->"), "two\n")
    assert once.startswith(page.rstrip("\n")) and "one" in once
    assert "two" in twice and "one" not in twice and twice.endswith("tail\n") and twice.startswith("# Title")


def test_update_docs_writes_sections_figures_and_the_table(tmp_path: Path):
    (tmp_path / "docs" / "methods").mkdir(parents=True)
    (tmp_path / "docs" / "paper_checks").mkdir(parents=True)
    (tmp_path / "docs" / "methods" / "opd_then_rl.md").write_text("# OPD then RL\n\nkept\n")
    (tmp_path / "docs" / "validation.md").write_text("# Validation\n\nearlier runs\n")
    written = update_docs(REAL, tmp_path, toy=TOY)
    page = (tmp_path / "docs" / "methods" / "opd_then_rl.md").read_text()
    assert "kept" in page and "## On a real model" in page and "real_01.png" in page
    assert (tmp_path / "docs" / "paper_checks" / "real_01.png").is_file()
    assert "earlier runs" in (tmp_path / "docs" / "validation.md").read_text()
    assert tmp_path / "docs" / "validation.md" in written
    assert "Verdict: reproduced" in method_section(REAL["experiments"][0])
    measured = {**REAL["experiments"][0], "metrics": [{"name": "accuracy grpo", "mean": 0.75, "sd": 0.1, "n": 9}]}
    assert "| accuracy grpo | 0.75 | 0.1 | 9 |" in method_section(measured)
    json.dumps(REAL)


def test_update_docs_fills_the_readme_real_model_column_and_keeps_the_other_cells(tmp_path: Path):
    from posttrain.paper_checks.readme_table import BEGIN, END, REAL_COLUMN, render_table

    (tmp_path / "docs" / "paper_checks").mkdir(parents=True)
    (tmp_path / "docs" / "validation.md").write_text("# Validation\n")
    readme = (f"intro\n{BEGIN}\n| # | paper | check | can it fail | status |\n| --- | --- | --- | --- | --- |\n"
              f"| 01 | OPD | 01 | m: contradicted | old |\n| 02 | HDR | 02 | m: inconclusive | old |\n"
              f"| 20 | GARL | 20a, 20b | - | old |\n{END}\ntail\n")  # fmt: skip
    (tmp_path / "README.md").write_text(readme)
    toy: dict = {"checks": []}  # no stored toy results: their cells stay as written
    written = update_docs(REAL, tmp_path, toy=toy, pages=True)
    text = (tmp_path / "README.md").read_text()
    assert tmp_path / "README.md" in written and text.startswith("intro\n") and text.endswith("tail\n")
    lines = text.splitlines()
    assert lines[2] == f"| # | paper | check | can it fail | {REAL_COLUMN} | status |"
    row01 = next(x for x in lines if x.startswith("| 01 "))
    assert row01 == "| 01 | OPD | 01 | m: contradicted | reproduced (3 seeds, share 1 [0.7, 1]) | old |"
    assert "| 02 | HDR | 02 | m: inconclusive | inconclusive (3 seeds, share 1 [0.7, 1]) | old |" in lines
    assert "| 20 | GARL | 20a, 20b | - | - | old |" in lines  # no real record for 20
    assert render_table(text, toy, None, REAL)[1] == 0  # idempotent


def test_merge_results_takes_later_judged_entries_with_their_run():
    later = {"mode": "full", "run": {"profile": "full", "commit": "def4567", "code_digest": "c", "date": "d2", "wall_s": 3600.0,
                                     "cpu_s": 7200.0},
             "experiments": [_real("02", "contradicted", [-0.1, -0.2]), {**_real("03", "not run", []), "gate": []},
                             _real("04", "reproduced", [0.1])]}  # fmt: skip
    merged = merge_results([REAL, later])
    by_id = {e["id"]: e for e in merged["experiments"]}
    assert [e["id"] for e in merged["experiments"]] == ["01", "02", "03", "04"]
    assert by_id["02"]["verdict"] == "contradicted" and by_id["02"]["run"]["commit"] == "def4567"
    assert by_id["03"]["verdict"] == "regime not reached" and "run" not in by_id["03"]  # not run never replaces
    counted = {**later, "experiments": [{**_real("05", "not run", []), "runs_cached": 2, "runs_planned": 18}]}
    newer = {**later, "experiments": [{**_real("05", "not run", []), "runs_cached": 9, "runs_planned": 18}]}
    fresh = next(e for e in merge_results([REAL, counted, newer])["experiments"] if e["id"] == "05")
    assert fresh["runs_cached"] == 9  # an unjudged entry replaces an earlier unjudged one
    assert "run" not in by_id["01"] and merged["run"] == REAL["run"] and merged["mode"] == "full (in parts)"
    assert "commit def4567" in method_section(by_id["02"]) and "2 CPU h" in method_section(by_id["02"])
    assert "measured in their own runs: 02: commit def4567" in transfer_table(merged, TOY)
    judged = {**later, "mode": "full (cached runs)", "experiments": [
        {**_real("02", "contradicted", [-0.1]), "cost": {"a": {"train_cpu_s": 5400.0, "eval_cpu_s": 1800.0}}}]}  # fmt: skip
    read = merge_results([REAL, judged])["experiments"][1]
    assert "Judged from finished runs (commit def4567" in method_section(read)
    assert "the runs it read: 2 CPU h" in method_section(read) and "h wall" not in method_section(read)
    with pytest.raises(ValueError, match="parts"):
        merge_results([REAL, {**later, "run": {**later["run"], "profile": "smoke"}}])
    with pytest.raises(ValueError, match="parts"):
        merge_results([])
