"""The smoke tier: every real-model experiment end to end on the tiny model (1 seed, 2 steps), cached and resumable."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.real_checks import select_experiments
from posttrain.real_checks.arm_table import ARMS
from posttrain.real_checks.arms import PROFILES
from posttrain.real_checks.experiment import RealVerdict
from posttrain.real_checks.runs import Runner
from posttrain.real_checks.suite import run_suite, sample_plan

pytestmark = pytest.mark.slow


def test_every_experiment_runs_and_a_second_run_is_read_from_the_cache(tmp_path: Path):
    lines: list[str] = []
    first = run_suite(select_experiments(), PROFILES["smoke"], tmp_path, train_ungated=True, log=lines.append)
    verdicts = {e["id"]: e["verdict"] for e in first["experiments"]}
    errors = {e["id"]: e.get("error") for e in first["experiments"] if e["verdict"] == RealVerdict.ERROR.value}
    assert not errors, errors
    assert set(verdicts.values()) <= {v.value for v in RealVerdict}
    assert verdicts["09"] == verdicts["15"] == RealVerdict.OUT_OF_SCOPE.value
    assert any(line.startswith("train ") for line in lines)
    again: list[str] = []
    second = run_suite(select_experiments(), PROFILES["smoke"], tmp_path, train_ungated=True, log=again.append)
    assert not any(line.startswith(("train ", "resume ")) for line in again), again
    assert [e["verdict"] for e in second["experiments"]] == list(verdicts.values())


def test_a_killed_run_resumes_to_the_uninterrupted_result(tmp_path: Path):
    from posttrain.llm.run import build_trainer
    from posttrain.real_checks.arms import arm_config
    from posttrain.real_checks.runs import _config

    profile = PROFILES["smoke"]
    whole = Runner(profile, ARMS, tmp_path / "whole", samples=sample_plan(profile), log=lambda _: None)
    expected = whole.record("grpo", 0)
    lines: list[str] = []
    cut = Runner(profile, ARMS, tmp_path / "cut", samples=sample_plan(profile), log=lines.append)
    run = cut.folder("grpo", 0) / "run"
    build_trainer(_config(arm_config(profile, ARMS["grpo"], 0)), run).fit(stop_after=1)  # killed after step 1
    resumed = cut.record("grpo", 0)
    assert any(line.startswith("resume ") for line in lines)
    keys = ("step", "reward_mean", "loss", "grad_norm")
    assert [[h[k] for k in keys] for h in resumed["history"]] == [[h[k] for k in keys] for h in expected["history"]]
    assert resumed["eval"]["rewards"] == expected["eval"]["rewards"]
