"""The harness and ``posttrain check``: three-way verdicts, errors, exit codes, report files, mutants (fake checks)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.paper_checks import CHECKS
from posttrain.paper_checks.cli import main_for
from posttrain.paper_checks.model import (
    MEDIAN,
    Metric,
    Mutant,
    PaperCheck,
    Result,
    Role,
    exact_criterion,
    mean_criterion,
    quantile_criterion,
)
from posttrain.paper_checks.runner import run_check
from posttrain.registry import Entry

SENTENCE = "Our method consistently outperforms the baseline."


@dataclass(frozen=True)
class FakeConfig:
    effect: float = 0.5
    seeds: int = 12
    baseline_in_place: bool = False  # the mutant: the method replaced by the baseline

    @classmethod
    def smoke(cls) -> FakeConfig:
        return cls(seeds=10)


def _run(config: FakeConfig) -> Result:
    effect = 0.0 if config.baseline_in_place else config.effect
    diffs = [effect + 0.01 * (s % 3) for s in range(config.seeds)]
    return Result(
        metrics=(Metric("score", tuple(float(s) for s in range(config.seeds)), paper_value=2.0),),
        comparisons=(
            mean_criterion("treatment - control", diffs, margin=0.0, reason="the paper's claim", bounds=(-1.0, 1.0),
                           role=Role.PRIMARY),
            quantile_criterion("treatment > control", diffs, margin=0.0, share=MEDIAN, reason="most seeds"),
            mean_criterion("reported only", [-d for d in diffs], margin=0.0, reason="context", bounds=(-1.0, 1.0),
                           role=Role.CONTEXT),
        ),
        extra={"series": {"curve": {"x": [1, 2, 3], "lines": {"a": [1.0, 2.0, 3.0]}, "logx": True}}},
    )  # fmt: skip


def _run_null(config: FakeConfig) -> Result:
    return _run(dataclasses.replace(config, effect=-0.8))  # the upper bound falls below the margin: contradicted


def _run_small(config: FakeConfig) -> Result:
    return _run(dataclasses.replace(config, effect=0.02))  # real but too small for these seeds: inconclusive


def _run_error(config: FakeConfig) -> Result:
    raise RuntimeError("simulated failure")


def _threads(config: FakeConfig) -> Result:
    return Result((), (exact_criterion("threads during run", (float(torch.get_num_threads()),), margin=0.5,
                                       reason="one thread", role=Role.PRIMARY),))  # fmt: skip


BASELINE = Mutant("baseline-for-method", "the baseline in the method's place",
                  lambda c: dataclasses.replace(c, baseline_in_place=True))  # fmt: skip
FAKES = {
    "90a": PaperCheck("90a", "Fake 2026", "a real effect", FakeConfig, _run, abstract=SENTENCE, mutants=(BASELINE,)),
    "90b": PaperCheck("90b", "Fake 2026", "a contradicted claim", FakeConfig, _run_null),
    "90c": PaperCheck("90c", "Fake 2026", "an effect too small to see", FakeConfig, _run_small),
    "91": PaperCheck("91", "Fake 2026", "raises", FakeConfig, _run_error),
    "92": PaperCheck("92", "Fake 2026", "threads", FakeConfig, _threads),
}


@pytest.fixture(autouse=True)
def fake_checks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for cid, chk in FAKES.items():
        monkeypatch.setitem(CHECKS._entries, cid, Entry(cid, chk, chk.claim, chk.paper))
    yield


def _add(monkeypatch: pytest.MonkeyPatch, check: PaperCheck) -> None:
    monkeypatch.setitem(CHECKS._entries, check.id, Entry(check.id, check, check.claim, check.paper))


def _json(*args: str) -> dict:
    res = CliRunner().invoke(app, ["check", *args, "--json"])
    return json.loads(res.stdout)


def test_three_way_verdicts_and_the_report(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["check", "90", "--smoke", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output  # every check ran; a verdict other than reproduced is not an error
    data = json.loads((tmp_path / "results.json").read_text())
    by_id = {c["id"]: c for c in data["checks"]}
    assert {k: v["verdict"] for k, v in by_id.items()} == {
        "90a": "reproduced", "90b": "contradicted", "90c": "inconclusive",
    }  # fmt: skip
    a = by_id["90a"]
    assert a["seeds"] == 10 and a["config"] == {"effect": 0.5, "seeds": 10, "baseline_in_place": False}
    assert a["abstract"] == SENTENCE
    primary = next(c for c in a["comparisons"] if c["role"] == "primary")
    assert primary["lower"] > 0.0 and primary["outcome"] == "holds" and primary["bounds"] == [-1.0, 1.0]
    small = next(c for c in by_id["90c"]["comparisons"] if c["role"] == "primary")
    assert small["outcome"] == "undecided" and small["mde"] > 0.02  # what these seeds could have shown
    assert a["metrics"][0]["mean"] == pytest.approx(4.5) and a["metrics"][0]["paper_value"] == 2.0
    report = (tmp_path / "report.md").read_text()
    assert SENTENCE in report and "contradicted" in report and "detectable at 10 seeds" in report
    assert "![check 90a: metrics, per-seed differences and curves](check_90a.png)" in report
    assert (tmp_path / "check_90a.png").stat().st_size > 0


def test_the_terminal_shows_the_summary_and_tables_only_on_request() -> None:
    plain = CliRunner().invoke(app, ["check", "90a", "--smoke"]).output
    assert "summary" in plain and "1 checks: 1 reproduced" in plain and "comparisons (one-sided" not in plain
    tables = CliRunner().invoke(app, ["check", "90a", "--smoke", "--tables"]).output
    assert "comparisons (one-sided" in tables and "treatment" in tables


def test_strict_fails_unless_reproduced() -> None:
    assert CliRunner().invoke(app, ["check", "90a", "--smoke", "--strict"]).exit_code == 0
    assert CliRunner().invoke(app, ["check", "90b", "--smoke", "--strict"]).exit_code == 1
    assert CliRunner().invoke(app, ["check", "90c", "--smoke", "--strict"]).exit_code == 1


def test_error_is_reported_and_other_checks_continue() -> None:
    res = CliRunner().invoke(app, ["check", "91", "90a", "--smoke", "--json"])
    assert res.exit_code == 1
    by_id = {c["id"]: c for c in json.loads(res.stdout)["checks"]}
    assert by_id["91"]["verdict"] == "error" and "simulated failure" in by_id["91"]["error"]
    assert by_id["90a"]["verdict"] == "reproduced"


def test_seeds_override_and_unknown_id() -> None:
    assert _json("90a", "--seeds", "3")["checks"][0]["seeds"] == 3
    bad = CliRunner().invoke(app, ["check", "9999"])
    assert bad.exit_code == 2 and "unknown check id" in bad.output


def test_a_check_runs_on_one_thread_and_the_count_is_restored() -> None:
    torch.set_num_threads(2)
    try:
        outcome = run_check(FAKES["92"], smoke=True)
        assert outcome.result is not None and outcome.result.comparisons[0].differences == (1.0,)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)


@pytest.mark.parametrize(
    ("comparisons", "message"),
    [
        ((), "exactly one primary"),
        ((exact_criterion("a", [1.0], margin=0.0, reason="", role=Role.PRIMARY),) * 2, "exactly one primary"),
        ((mean_criterion("mean over seeds", [0.4], margin=0.1, reason="", bounds=(0, 1), role=Role.PRIMARY),),
         "per-seed values"),
    ],
)  # fmt: skip
def test_a_malformed_result_is_an_error(monkeypatch: pytest.MonkeyPatch, comparisons: tuple, message: str) -> None:
    _add(monkeypatch, PaperCheck("93", "Fake 2026", "malformed", FakeConfig, lambda c: Result((), comparisons)))
    data = _json("93", "--smoke")["checks"][0]
    assert data["verdict"] == "error" and message in data["error"]


def test_mutants_run_alone_or_all_and_are_recorded(tmp_path: Path) -> None:
    one = _json("90a", "--smoke", "--mutant", "baseline-for-method")
    assert one["checks"] == [] and [(m["mutant"], m["verdict"]) for m in one["mutants"]] == [
        ("baseline-for-method", "inconclusive")
    ]
    res = CliRunner().invoke(app, ["check", "90", "--smoke", "--mutants", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    stored = json.loads((tmp_path / "mutants.json").read_text())["mutants"]
    assert [(m["id"], m["mutant"], m["verdict"]) for m in stored] == [("90a", "baseline-for-method", "inconclusive")]
    assert stored[0]["description"] == BASELINE.description and stored[0]["primary"]["role"] == "primary"
    assert "mutants: wrong methods" in res.output and "baseline-for-method" in (tmp_path / "report.md").read_text()
    unknown = CliRunner().invoke(app, ["check", "90a", "--mutant", "nope"])
    assert unknown.exit_code == 2 and "baseline-for-method" in unknown.output


def test_each_check_module_has_its_own_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main_for(FAKES["90a"], argv=["--smoke", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [c["id"] for c in out["checks"]] == ["90a"] and out["checks"][0]["verdict"] == "reproduced"
    assert main_for(FAKES["90b"], argv=["--smoke", "--strict"]) == 1
    assert main_for(FAKES["90a"], argv=["--no-such-flag"]) == 2


def test_stability_reruns_at_twice_the_seeds() -> None:
    data = _json("90a", "90b", "--smoke", "--stability")["stability"]
    assert {r["id"]: (r["seeds"], r["verdict_flipped"]) for r in data} == {"90a": (10, False), "90b": (10, False)}
