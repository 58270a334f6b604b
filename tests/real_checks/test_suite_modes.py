"""Seed plans from a recorded pilot, the pilot file, the gate-only and cached-only modes (nothing trained)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.real_checks import experiments, select_experiments
from posttrain.real_checks.arm_table import ARMS
from posttrain.real_checks.arms import PILOT_OFFSET, PROFILES
from posttrain.real_checks.experiment import RealVerdict
from posttrain.real_checks.plan import pilot_share, seeds_for_share
from posttrain.real_checks.suite import pilot_record, planned_seeds, run_suite, seed_plan


def test_the_seed_plan_follows_a_recorded_pilot(tmp_path: Path):
    exp = experiments()["16"]
    assert seed_plan(exp, tmp_path / "none.json") == (exp.seeds, exp.seed_reason)
    pilot = tmp_path / "pilot.json"
    pilot.write_text(json.dumps({"16": {"differences": [0.02, 0.05, -0.01], "margin": 0.0, "seeds": [10000, 10002]}}))
    n, reason = seed_plan(exp, pilot)
    assert n == max(6, seeds_for_share(pilot_share([0.02, 0.05, -0.01], 0.0))) and "pilot" in reason
    assert planned_seeds(exp, PROFILES["smoke"], None) == 1 and planned_seeds(exp, PROFILES["full"], 4) == 4


def test_pilot_record_keeps_the_primary_differences():
    payload = {"experiments": [{"id": "16", "comparisons": [
        {"role": "primary", "differences": [0.1, 0.2, 0.0], "margin": 0.0},
        {"role": "context", "differences": [9.0], "margin": 0.0}]}, {"id": "09", "comparisons": []}]}  # fmt: skip
    rec = pilot_record(payload)
    assert rec == {"16": {"differences": [0.1, 0.2, 0.0], "margin": 0.0, "seeds": [PILOT_OFFSET, PILOT_OFFSET + 1,
                                                                                     PILOT_OFFSET + 2]}}  # fmt: skip


@pytest.mark.slow
def test_gate_only_trains_nothing(tmp_path: Path):
    lines: list[str] = []
    out = run_suite(select_experiments(["09", "11", "16"]), PROFILES["smoke"], tmp_path, gate_only=True,
                    log=lines.append)  # fmt: skip
    verdicts = {e["id"]: e["verdict"] for e in out["experiments"]}
    assert verdicts["09"] == RealVerdict.OUT_OF_SCOPE.value
    assert verdicts["11"] in (RealVerdict.NOT_RUN.value, RealVerdict.REGIME_NOT_REACHED.value)
    assert not any(line.startswith(("train ", "resume ")) for line in lines)
    assert all("gate" in e for e in out["experiments"] if e["id"] != "09")


@pytest.mark.slow
def test_cached_only_judges_finished_experiments_and_trains_nothing(tmp_path: Path):
    lines: list[str] = []
    ids = select_experiments(["19"])
    smoke = {"train_ungated": True}  # the tiny model misses the regimes; the smoke tier trains anyway
    before = run_suite(ids, PROFILES["smoke"], tmp_path, cached_only=True, log=lines.append, **smoke)
    entry = before["experiments"][0]
    assert entry["verdict"] == RealVerdict.NOT_RUN.value and entry["runs_cached"] == 0
    assert entry["runs_planned"] == len(entry["arms"]) and "gate" in entry
    assert not any(line.startswith(("train ", "resume ")) for line in lines)
    trained = run_suite(ids, PROFILES["smoke"], tmp_path, log=lines.append, **smoke)["experiments"][0]
    lines.clear()
    after = run_suite(ids, PROFILES["smoke"], tmp_path, cached_only=True, log=lines.append, **smoke)["experiments"][0]
    assert after["verdict"] == trained["verdict"] != RealVerdict.NOT_RUN.value
    assert not any(line.startswith(("train ", "resume ")) for line in lines)


def test_an_arm_read_by_any_pass_at_k_experiment_is_scored_with_coverage_samples():
    """The plan is the registry's, not the selection's: ``real-check 19`` alone and the whole suite give GRPO one
    content key (05's pass@16 needs its 16 samples), so a suite run in parts finds its cached runs."""
    from posttrain.real_checks.suite import sample_plan

    for profile in PROFILES.values():
        plan = sample_plan(profile)
        assert plan["grpo"] == plan["es"] == profile.coverage_samples
        assert plan["base"] == plan["grpo_cold"] == profile.eval_samples


def test_the_summary_prints_an_experiments_error_message():
    from rich.console import Console

    from posttrain.real_checks.cli import _print_summary

    console = Console(record=True, width=200)
    payload = {"mode": "full", "experiments": [
        {"id": "18", "verdict": "error", "error": "ModelNotPrepared: [dim] run `posttrain models prepare x`"},
        {"id": "19", "verdict": "contradicted", "seeds_run": 9},
    ]}  # fmt: skip
    _print_summary(payload, console)
    text = console.export_text()
    assert "18: ModelNotPrepared: [dim] run `posttrain models prepare x`" in text
    assert "19:" not in text


def test_the_suite_prepares_its_registered_model_before_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import dataclasses

    from posttrain.llm.tools import models

    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    calls: list[str] = []
    monkeypatch.setattr(models, "prepare_model", lambda name, **_: calls.append(name) or models.model_dir(name))
    real = dataclasses.replace(
        PROFILES["smoke"], base={**PROFILES["smoke"].base, "model": {"path": "smollm2-135m-instruct"}}
    )
    run_suite([], real, tmp_path / "runs", log=lambda line: None)
    assert calls == ["smollm2-135m-instruct"]
    run_suite([], PROFILES["smoke"], tmp_path / "runs", log=lambda line: None)  # the tiny model: nothing to prepare
    assert calls == ["smollm2-135m-instruct"]


class _StubRunner:
    """Records from `tests.real_checks._records.record` by arm accuracy; remembers which (arm, seed) it was asked."""

    def __init__(self, accuracy: dict[str, float]):
        from posttrain.real_checks.arms import Arm

        self.accuracy, self.asked = accuracy, []
        self.arms = {name: Arm(name) for name in accuracy}  # no dependencies: no weights to restore

    def cached(self, arm: str, seed: int):
        return None

    def record(self, arm: str, seed: int):
        from tests.real_checks._records import record

        self.asked.append((arm, seed))
        return record(self.accuracy[arm], seed=100 * seed + len(self.asked), prompts=200)


def _gap_experiment():
    from posttrain.paper_checks.model import Role
    from posttrain.real_checks.card import Mediator, Source, TransferCard, declared
    from posttrain.real_checks.experiment import Contrast, RealExperiment, diff

    gap = Mediator("gain of t over b", "accuracy_gap:t:b", "", declared(0.1, 0.3, "test"), Source.RUN)
    card = TransferCard(("99",), "test", (gap,))
    return RealExperiment("99", "test", card, (Contrast("e - t", diff("accuracy", "e", "t"), Role.PRIMARY),),
                          context=(("b", "accuracy"),), probe_tasks=())  # fmt: skip


@pytest.mark.parametrize("gain, trained", [(0.6, {("t", 0), ("b", 0)}), (0.2, None)])
def test_a_run_mediator_outside_the_range_stops_before_the_other_arms(tmp_path: Path, gain: float, trained):
    """The arms a run mediator reads run first for seed 0; a miss gives *regime not reached* with the rest untrained,
    an inside value trains every arm for every seed and judges as before."""
    from posttrain.real_checks.suite import _judge_one

    exp, runner = _gap_experiment(), _StubRunner({"t": 0.1 + gain, "b": 0.1, "e": 0.5})
    out = _judge_one(exp, PROFILES["smoke"], runner, tmp_path, range(9), False, False)  # type: ignore[arg-type]
    if trained is not None:
        assert out["verdict"] == RealVerdict.REGIME_NOT_REACHED.value and set(runner.asked) == trained
        assert [g["inside"] for g in out["gate"]] == [False] and "not trained" in out["reason"]
        assert set(out["cost"]) == {"t", "b"}  # what the gate's runs cost, from their records
        pilot = _StubRunner({"t": 0.1 + gain, "b": 0.1, "e": 0.5})
        _judge_one(exp, PROFILES["smoke"], pilot, tmp_path, range(PILOT_OFFSET, PILOT_OFFSET + 3), False, False)  # type: ignore[arg-type]
        assert set(pilot.asked) == {("t", PILOT_OFFSET), ("b", PILOT_OFFSET)}  # the gate's seed is the first planned
    else:
        assert out["verdict"] != RealVerdict.REGIME_NOT_REACHED.value and ("e", 8) in runner.asked
    ungated = _judge_one(exp, PROFILES["smoke"], _StubRunner({"t": 0.7, "b": 0.1, "e": 0.5}), tmp_path, range(9),
                         True, False)  # type: ignore[arg-type]  # fmt: skip
    assert ungated["verdict"] == RealVerdict.REGIME_NOT_REACHED.value and ungated["seeds_run"] == 9


def test_every_run_mediator_is_measured_from_the_records_the_suite_reads(tmp_path: Path, monkeypatch):
    """A run mediator naming an arm the experiment does not compare (the base beside 01's and 13's teacher) is
    still read: the gate gets a number, not a NaN that would call every run *regime not reached*."""
    from posttrain.real_checks import suite
    from tests.real_checks._records import record

    class Every(_StubRunner):
        def record(self, arm: str, seed: int):
            self.asked.append((arm, seed))
            return record(0.5, seed=seed, history=history, rms=1.0)

        def folder(self, arm: str, seed: int) -> Path:
            return tmp_path / f"{arm}-{seed}"

    history = [{"rollout/lag": 1, "sis/accept_rate": 0.9, "replay/groups": 1.0, "replay/scanned": 2.0}]
    monkeypatch.setattr(suite, "_probe", lambda *args: {})
    gated = [e for e in experiments().values() if any(m.source.value == "run" for m in e.card.mediators)]
    assert {"01", "13"} <= {e.id for e in gated}
    for exp in gated:
        runner = Every({})
        runner.arms = dict(ARMS)
        out = suite._judge_one(exp, PROFILES["full"], runner, tmp_path, range(1), True, False)  # type: ignore[arg-type]
        rows = [g for g in out["gate"] if g["source"] == "run"]
        assert rows and all(g["value"] == g["value"] for g in rows), (exp.id, rows)  # no NaN


def test_the_cost_counts_a_run_read_by_several_seeds_once():
    """A teacher trains once at its fixed seed; every evaluation seed reads that record, and the cost sums runs."""
    from posttrain.real_checks.suite import _cost

    teacher = {"key": "t", "train_cpu_s": 400.0, "eval_cpu_s": 200.0}
    per_seed = [{"teacher": teacher, "arm": {"key": f"a{s}", "train_cpu_s": 10.0, "eval_cpu_s": 5.0}} for s in range(9)]
    assert _cost(per_seed, ["teacher", "arm"]) == {"teacher": {"train_cpu_s": 400.0, "eval_cpu_s": 200.0},
                                                   "arm": {"train_cpu_s": 90.0, "eval_cpu_s": 45.0}}  # fmt: skip


@pytest.mark.parametrize("finished, measured", [({"t", "b"}, True), ({"t"}, False), (set(), False)])
def test_a_run_mediator_is_measured_before_the_verdict_once_its_arms_are_finished(tmp_path: Path, finished, measured):
    """Cached-only, with some runs missing: the entry is *not run*, and its run mediator shows the value its finished
    arms give (a teacher trained for another experiment), or *not measured* while one of them is missing."""
    from posttrain.real_checks.metrics import metric
    from posttrain.real_checks.suite import _judge_one

    kept: dict[str, dict] = {}

    class Partial(_StubRunner):
        def cached(self, arm: str, seed: int):
            if arm not in finished or seed != 0:
                return None
            if arm not in kept:  # one finished run: the same record at every read
                kept[arm] = self.record(arm, seed)
            return kept[arm]

    out = _judge_one(_gap_experiment(), PROFILES["smoke"], Partial({"t": 0.3, "b": 0.1, "e": 0.5}), tmp_path, range(3),
                     False, False, cached_only=True)  # type: ignore[arg-type]  # fmt: skip
    assert out["verdict"] == RealVerdict.NOT_RUN.value
    row = out["gate"][0]
    if measured:
        gap = metric(kept["t"], "accuracy") - metric(kept["b"], "accuracy")
        assert row["inside"] is True and row["value"] == pytest.approx(gap) and 0.1 < gap < 0.3
    else:
        assert row["inside"] is None


def test_a_run_log_line_names_the_arm_not_only_the_trainer_method(tmp_path: Path):
    """The OPD arm trains the method ``opd_then_rl`` and a teacher ``grpo``: the suite's log names the arm by key."""
    from posttrain.real_checks.runs import Runner
    from posttrain.real_checks.suite import _arm_names, _naming_log, sample_plan

    full = PROFILES["full"]
    runner = Runner(full, ARMS, tmp_path, samples=sample_plan(full), log=lambda line: None)
    names = _arm_names(runner, range(2))
    lines: list[str] = []
    log = _naming_log(lines.append, names)
    for arm, seed in (("opd", 1), ("opd_then_rl", 1), ("teacher_add", 0), ("grpo", 0)):
        log(f"train method on a task, seed {seed}: {runner.key(arm, seed)}")
        assert lines[-1].endswith(f"(arm {arm})"), lines[-1]
    assert runner.key("teacher_add", 0) == runner.key("teacher_add", 1)  # one fixed-seed run, one name
    log("probe add: p0 0.164, zero-variance groups 0.50")
    assert lines[-1] == "probe add: p0 0.164, zero-variance groups 0.50"
