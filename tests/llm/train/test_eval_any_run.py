"""``posttrain eval`` works on any run directory or checkpoint, and only on verified bytes.

Findings covered: an interrupted run (``config.yaml``, ``metrics.jsonl``, ``initial/``, no checkpoint) called
"not a run directory"; ``posttrain eval RUN/checkpoints/step_N`` skipping the checksum check (a flipped
byte or a removed manifest evaluated silently); ``reward_mean nan`` printed for a run whose rewards were
all unjudged; the eval table wrapping badly at 80 columns.
"""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from posttrain.llm.config import config_from_dict, config_to_dict
from posttrain.llm.rollout.tasks import Problem
from posttrain.llm.train.rundir import CHECKSUMS, RunDirWarning, write_checksums

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")

runner = CliRunner()


def _run(tmp_path: Path, tiny_dir: Path, *, steps: tuple[int, ...] = ()) -> Path:
    """An interrupted run by hand: config.yaml, metrics.jsonl, a verified initial/ and checkpoints ``steps``."""
    run = tmp_path / "run"
    run.mkdir()
    cfg = config_from_dict({"data": {"task": "addition", "options": {"digits": 1}, "eval_prompts": 2},
                            "rollout": {"max_new_tokens": 2}})  # fmt: skip
    (run / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 3)))
    shutil.copytree(tiny_dir, run / "initial")
    write_checksums(run / "initial")
    for step in steps:
        ckpt = run / "checkpoints" / f"step_{step:06d}"
        shutil.copytree(tiny_dir, ckpt / "model")
        (ckpt / "state.pt").write_bytes(b"state")
        write_checksums(ckpt)
    return run


def _eval(target: Path) -> Any:
    from posttrain.cli import app

    return runner.invoke(app, ["eval", str(target), "--json", "--n", "1", "--prompts", "2"])


def _record(result: Any) -> dict[str, Any]:
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_an_interrupted_run_is_evaluated_from_its_initial_model(tmp_path: Path, tiny_dir: Path) -> None:
    run = _run(tmp_path, tiny_dir)
    result = _eval(run)
    assert result.exit_code == 0, result.output
    assert _record(result)["checkpoint"] == str(run / "initial")
    assert "no checkpoint" in result.stderr and "initial" in result.stderr


def test_a_run_is_evaluated_from_its_newest_intact_checkpoint(tmp_path: Path, tiny_dir: Path) -> None:
    run = _run(tmp_path, tiny_dir, steps=(1, 2))
    weights = run / "checkpoints" / "step_000002" / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.warns(RunDirWarning, match=r"step_000002 is corrupt .*falling back"):
        result = _eval(run)
    assert result.exit_code == 0, result.output
    assert _record(result)["checkpoint"] == str(run / "checkpoints" / "step_000001" / "model")
    assert (run / "checkpoints" / "step_000002").is_dir()  # eval reads; it never renames


@pytest.mark.parametrize("damage", ["flip", "remove-manifest", "unlisted-file"])
@pytest.mark.parametrize("target", ["checkpoint", "model", "initial"])
def test_a_checkpoint_path_is_verified_before_it_is_evaluated(
    tmp_path: Path, tiny_dir: Path, damage: str, target: str
) -> None:
    run = _run(tmp_path, tiny_dir, steps=(1,))
    ckpt = run / "initial" if target == "initial" else run / "checkpoints" / "step_000001"
    model = ckpt if target == "initial" else ckpt / "model"
    if damage == "flip":
        weights = model / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif damage == "remove-manifest":
        (ckpt / CHECKSUMS).unlink()
    else:
        (model / "model-00002-of-00002.safetensors").write_bytes(b"planted")
    result = _eval({"checkpoint": ckpt, "model": model, "initial": ckpt}[target])
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and ckpt.name in result.output and "fails verification" in result.output
    assert not (run / "eval.jsonl").exists()


def test_eval_json_is_appended_never_through_a_link(tmp_path: Path, tiny_dir: Path) -> None:
    run = _run(tmp_path, tiny_dir)
    outside = tmp_path / "outside.jsonl"
    (run / "eval.jsonl").symlink_to(outside)
    result = _eval(run)
    assert result.exit_code == 2 and "symbolic link" in result.output, result.output
    assert not outside.exists()


class _Unjudged:
    """Addition problems whose rewards are never judged (a reward function that returns None for all)."""

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        return [Problem(f"{i % 9}+1=", str(i % 9 + 1)) for i in range(n)]

    def rewards(self, problems: list[Problem], completions: list[str]) -> list[float]:
        return [math.nan] * len(completions)

    def reward(self, problem: Problem, completion: str) -> float:
        return math.nan

    def solution(self, problem: Problem, rng: random.Random) -> str:
        return problem.answer


def test_all_unjudged_rewards_are_reported_not_averaged_into_nan(tiny: tuple[Any, Any]) -> None:
    from posttrain.llm.cli import format_metrics
    from posttrain.llm.rollout.engine import SamplingConfig
    from posttrain.llm.train.evaluate import evaluate

    model, tokenizer = tiny
    metrics = evaluate(model, tokenizer, _Unjudged(), n_prompts=3, n_samples=2, ks=(1, 2),
                       sampling=SamplingConfig(max_new_tokens=2))  # fmt: skip
    assert metrics["unjudged"] == 6 and metrics["judged_prompts"] == 0
    assert all(math.isnan(metrics[k]) for k in ("pass@1", "pass@2", "reward_mean", "greedy_accuracy"))
    assert metrics["response_len"] > 0  # what does not need a reward is still measured
    text = format_metrics(metrics, title="eval run/initial", samples=6, width=80)
    assert "nan" not in text.lower()
    assert "no sampled completion was judged" in text and "6 of 6" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_the_eval_table_fits_80_columns(tiny: tuple[Any, Any]) -> None:
    from posttrain.llm.cli import format_metrics

    metrics = {"pass@1": 0.5, "pass@16": 0.75, "mean@1": 0.5, "reward_mean": 0.25, "unjudged": 0,
               "judged_prompts": 48, "greedy_accuracy": 0.5, "response_len": 7.5, "entropy": 0.9}  # fmt: skip
    text = format_metrics(metrics, title="eval " + "/very/long/run/directory" * 8, samples=96, width=80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert ["reward_mean", "0.2500"] in [line.replace("│", " ").split() for line in lines], text
