"""The harness and ``posttrain check``: verdicts, errors, exit codes, report files (fake checks)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.paper_checks import CHECKS
from posttrain.paper_checks.base import Comparison, Metric, PaperCheck, Result
from posttrain.registry import Entry


@dataclass(frozen=True)
class FakeConfig:
    effect: float = 1.0
    seeds: int = 6

    @classmethod
    def smoke(cls) -> FakeConfig:
        return cls(seeds=4)


def _run(config: FakeConfig) -> Result:
    diffs = tuple(config.effect + 0.01 * s for s in range(config.seeds))
    return Result(
        metrics=(Metric("score", tuple(float(s) for s in range(config.seeds)), paper_value=2.0),),
        comparisons=(
            Comparison("treatment - control", diffs, margin=0.5, margin_reason="half the paper's effect"),
            Comparison("reported only", tuple(-d for d in diffs), asserted=False),
        ),
        extra={"series": {"curve": {"x": [1, 2, 3], "lines": {"a": [1.0, 2.0, 3.0]}, "logx": True}}},
    )


def _run_null(config: FakeConfig) -> Result:
    return _run(FakeConfig(effect=0.0, seeds=config.seeds))


def _run_error(config: FakeConfig) -> Result:
    raise RuntimeError("simulated failure")


FAKES = {
    "90a": PaperCheck("90a", "Fake 2026", "a real effect", FakeConfig, _run),
    "90b": PaperCheck("90b", "Fake 2026", "no effect", FakeConfig, _run_null),
    "91": PaperCheck("91", "Fake 2026", "raises", FakeConfig, _run_error),
}


@pytest.fixture(autouse=True)
def fake_checks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for cid, chk in FAKES.items():
        monkeypatch.setitem(CHECKS._entries, cid, Entry(cid, chk, chk.claim, chk.paper))
    yield


def test_verdicts_report_and_prefix_selection(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["check", "90", "--smoke", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output  # every check ran; a not-reproduced verdict is not an error
    data = json.loads((tmp_path / "results.json").read_text())
    by_id = {c["id"]: c for c in data["checks"]}
    assert set(by_id) == {"90a", "90b"}
    assert by_id["90a"]["verdict"] == "reproduced" and by_id["90b"]["verdict"] == "not reproduced"
    assert by_id["90a"]["seeds"] == 4 and by_id["90a"]["config"] == {"effect": 1.0, "seeds": 4}
    comp = by_id["90a"]["comparisons"][0]
    assert comp["ci_low"] > 0.5 and comp["sign_p"] < 0.1 and comp["asserted"]
    assert by_id["90a"]["margin"] == [
        {"comparison": "treatment - control", "margin": 0.5, "reason": "half the paper's effect"}
    ]
    metric = by_id["90a"]["metrics"][0]
    assert metric["mean"] == pytest.approx(1.5) and metric["paper_value"] == 2.0
    report = (tmp_path / "report.md").read_text()
    assert "not reproduced" in report and "half the paper's effect" in report
    assert (tmp_path / "check_90a.png").stat().st_size > 0


def test_strict_fails_on_not_reproduced() -> None:
    assert CliRunner().invoke(app, ["check", "90a", "--smoke", "--strict"]).exit_code == 0
    assert CliRunner().invoke(app, ["check", "90b", "--smoke", "--strict"]).exit_code == 1


def test_error_is_reported_and_other_checks_continue() -> None:
    res = CliRunner().invoke(app, ["check", "91", "90a", "--smoke", "--json"])
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    by_id = {c["id"]: c for c in data["checks"]}
    assert by_id["91"]["verdict"] == "error" and "simulated failure" in by_id["91"]["error"]
    assert by_id["90a"]["verdict"] == "reproduced"


def test_seeds_override_and_unknown_id() -> None:
    res = CliRunner().invoke(app, ["check", "90a", "--seeds", "3", "--json"])
    assert json.loads(res.stdout)["checks"][0]["seeds"] == 3
    bad = CliRunner().invoke(app, ["check", "9999"])
    assert bad.exit_code == 2 and "unknown check id" in bad.output


def test_report_separates_reported_rows_and_records_the_run(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["check", "90a", "--smoke", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "results.json").read_text())
    run = data["run"]
    assert run["version"] and run["torch"] and "commit" in run and run["cpu_time_s"] >= 0
    rows = {c["name"]: c for c in data["checks"][0]["comparisons"]}
    assert rows["reported only"]["asserted"] is False and rows["reported only"]["passed"] is False
    assert rows["treatment - control"]["kind"] == "mean" and rows["treatment - control"]["p"] < 0.025
    report = (tmp_path / "report.md").read_text()
    assert "![check 90a](check_90a.png)" in report
    asserted, reported = report.index("Asserted criteria:"), report.index("Reported only (not in the verdict):")
    assert asserted < report.index("| treatment - control | mean") < reported < report.index("| reported only | mean")
    assert "would fail" in report and "| FAIL |" not in report
    assert "summary" in res.output and "1 checks: 1 reproduced" in res.output


def test_headline_reported_row_shows_in_the_overview(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def run_headline(config: FakeConfig) -> Result:
        base = _run(config)
        head = Comparison("vs joint rule", (-0.05, -0.04, -0.06, -0.05), asserted=False, headline=True)
        return dataclasses.replace(base, comparisons=(*base.comparisons, head))

    chk = PaperCheck("92", "Fake 2026", "asserted part", FakeConfig, run_headline, reported_claim="the headline")
    monkeypatch.setitem(CHECKS._entries, "92", Entry("92", chk, chk.claim, chk.paper))
    res = CliRunner().invoke(app, ["check", "92", "--smoke", "--json"])
    data = json.loads(res.stdout)["checks"][0]
    assert data["reported_claim"] == "the headline" and data["verdict"] == "reproduced"
    CliRunner().invoke(app, ["check", "92", "--smoke", "--out", str(tmp_path)])
    overview = (tmp_path / "report.md").read_text().split("\n## ")[0]  # the table above the per-check sections
    assert "| reproduced | 1/1 | the headline; vs joint rule: -0.05 [" in overview and "would fail" in overview


def test_stability_reruns_at_twice_the_seeds() -> None:
    res = CliRunner().invoke(app, ["check", "90", "--smoke", "--stability", "--json"])
    data = json.loads(res.stdout)["stability"]
    assert {r["id"]: (r["seeds"], r["verdict_flipped"]) for r in data} == {"90a": (4, False), "90b": (4, False)}


def test_an_asserted_point_estimate_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def run_point(config: FakeConfig) -> Result:
        return Result(metrics=(), comparisons=(Comparison("mean over seeds", (0.4,), margin=0.1),))

    chk = PaperCheck("93", "Fake 2026", "point", FakeConfig, run_point)
    monkeypatch.setitem(CHECKS._entries, "93", Entry("93", chk, chk.claim, chk.paper))
    data = json.loads(CliRunner().invoke(app, ["check", "93", "--smoke", "--json"]).stdout)["checks"][0]
    assert data["verdict"] == "error" and "per-seed values" in data["error"]
