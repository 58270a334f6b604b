"""A run directory belongs to one run; every file a resume reads is written atomically and checked.

Findings covered: a second train into a used directory, --resume with changed settings, a kill
while ``initial/`` is written, duplicate / torn ``metrics.jsonl`` rows, corrupted checkpoints
(truncated file, flipped bytes) with fallback to the newest intact one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from posttrain.llm.config import config_from_dict
from posttrain.llm.run import build_trainer
from posttrain.llm.train import rundir
from posttrain.llm.train.checkpoint import latest_checkpoint, truncate_metrics
from posttrain.llm.train.rundir import RunDirError, RunDirWarning, verify_checksums

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")

TIME_KEYS = {"step_time_s", "gen_time_s"}


def _raw(**over: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "model": {"tiny": {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 64}},
        "data": {"task": "addition", "options": {"digits": 1}, "prompts_per_step": 2, "sft_steps": 2,
                 "sft_batch_size": 8, "sft_lr": 1e-3, "eval_prompts": 4},
        "rollout": {"group_size": 2, "max_new_tokens": 2},
        "optim": {"steps": 4, "lr": 1e-3},
        "checkpoint": {"every": 1, "keep": 2},
        "logging": {"progress": False},
    }  # fmt: skip
    for key, value in over.items():
        section, name = key.split("__")
        raw[section][name] = value
    return raw


def _cfg(**over: Any) -> Any:
    return config_from_dict(_raw(**over))


def _rows(run: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]


def test_second_run_into_a_used_directory_is_refused_unless_resume_or_overwrite(tmp_path: Path) -> None:
    run = tmp_path / "run"
    build_trainer(_cfg(optim__steps=2), run).fit()
    assert [r["step"] for r in _rows(run)] == [1, 2]
    with pytest.raises(RunDirError, match=r"--resume.*--overwrite"):
        build_trainer(_cfg(optim__steps=2), run)
    assert [r["step"] for r in _rows(run)] == [1, 2]  # untouched
    fresh = build_trainer(_cfg(optim__steps=1), run, overwrite=True)
    fresh.fit()
    assert [r["step"] for r in _rows(run)] == [1]
    assert [p.name for p in sorted((run / "checkpoints").iterdir())] == ["step_000001"]  # old step_2 gone
    with pytest.raises(RunDirError, match="choose one"):
        build_trainer(_cfg(), run, resume=True, overwrite=True)


def test_resume_refuses_changed_settings_and_records_allowed_ones(tmp_path: Path) -> None:
    run = tmp_path / "run"
    build_trainer(_cfg(optim__steps=2), run).fit()
    with pytest.raises(RunDirError, match=r"optim\.lr: 0\.001 -> 0\.01"):
        build_trainer(_cfg(optim__steps=3, optim__lr=1e-2), run, resume=True)
    longer = build_trainer(_cfg(optim__steps=3), run, resume=True)
    assert longer.step == 2
    longer.fit()
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[2]["resumed_with"] == {"optim.steps": [2, 3]} and "resumed_with" not in rows[1]
    text = (run / "config.yaml").read_text()
    assert text.splitlines()[0] == "# resumed with optim.steps: 2 -> 3"
    assert "steps: 3" in text


def test_torn_metrics_line_is_dropped_with_a_warning_and_rewrite_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1}\n{"step": 2, "x": 2}\n{"step": 3, "x"')
    with pytest.warns(RunDirWarning, match=r"set aside 1 line\(s\)"):
        truncate_metrics(path, 2)
    assert [json.loads(ln)["step"] for ln in path.read_text().splitlines()] == [1, 2]
    truncate_metrics(path, 0)
    assert path.read_text() == ""
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]  # no temporary file left


def test_resume_before_the_first_checkpoint_leaves_no_duplicate_rows(tmp_path: Path) -> None:
    run = tmp_path / "run"
    trainer = build_trainer(_cfg(checkpoint__every=0), run)
    trainer.fit(stop_after=2)  # rows 1, 2 and no checkpoint (checkpoint.every=0 saves at the end only)
    assert latest_checkpoint(run / "checkpoints") is None
    resumed = build_trainer(_cfg(checkpoint__every=0), run, resume=True)
    assert resumed.step == 0
    resumed.fit()
    assert [r["step"] for r in _rows(run)] == [1, 2, 3, 4]


def _flip(path: Path, n: int = 4) -> None:
    data = bytearray(path.read_bytes())
    for i in range(n):
        data[len(data) // 2 + 97 * i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flip", "truncate", "flip-and-remove-manifest"])
def test_corrupt_checkpoint_falls_back_to_the_newest_intact_one(tmp_path: Path, damage: str) -> None:
    run = tmp_path / "run"
    build_trainer(_cfg(optim__steps=3, checkpoint__keep=3), run).fit()
    reference = build_trainer(_cfg(optim__steps=3, checkpoint__keep=3), tmp_path / "ref")
    reference.fit(stop_after=2)  # the weights of step 2, for comparison
    weights = run / "checkpoints" / "step_000003" / "model" / "model.safetensors"
    if damage.startswith("flip"):
        _flip(weights)
        if damage.endswith("manifest"):  # a checkpoint that cannot be verified is not trusted
            (weights.parents[1] / rundir.CHECKSUMS).unlink()
    else:
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert verify_checksums(run / "checkpoints" / "step_000003") is not None
    with pytest.warns(RunDirWarning, match=r"step_000003.*falling back"):
        resumed = build_trainer(_cfg(optim__steps=3, checkpoint__keep=3), run, resume=True)
    assert resumed.step == 2
    for p, q in zip(resumed.policy.parameters(), reference.policy.parameters(), strict=True):
        assert torch.equal(p, q)
    resumed.fit()
    assert [r["step"] for r in _rows(run)] == [1, 2, 3]
    assert latest_checkpoint(run / "checkpoints").name == "step_000003"  # type: ignore[union-attr]
    assert verify_checksums(run / "checkpoints" / "step_000003") is None  # rewritten intact


INITIAL_KILLER = textwrap.dedent(
    """
    import json, os, sys, time
    from transformers import PreTrainedModel
    from posttrain.llm.config import config_from_dict
    from posttrain.llm.run import build_trainer
    raw, out = json.loads(sys.argv[1]), sys.argv[2]
    real = PreTrainedModel.save_pretrained
    def hang(self, directory, *args, **kwargs):
        if "initial" in str(directory):
            real(self, directory, *args, **kwargs)
            with open(os.path.join(directory, "model.safetensors"), "r+b") as f:
                f.truncate(100)  # a torn weights file, as if killed mid-write
            open(os.path.join(out, "WRITING"), "w").close()
            time.sleep(600)
        return real(self, directory, *args, **kwargs)
    PreTrainedModel.save_pretrained = hang
    build_trainer(config_from_dict(raw), out)
    """
)


def test_kill_while_initial_is_written_leaves_a_resumable_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    raw = _raw(optim__steps=2)
    proc = subprocess.Popen([sys.executable, "-c", INITIAL_KILLER, json.dumps(raw), str(run)])
    try:
        deadline = time.monotonic() + 300
        while not (run / "WRITING").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the writer died or never reached the write"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    (run / "WRITING").unlink()
    assert not (run / "initial").exists()  # only a temporary directory
    resumed = build_trainer(config_from_dict(raw), run, resume=True)  # redoes the SFT warm-up
    resumed.fit()
    assert verify_checksums(run / "initial") is None and (run / "initial" / rundir.CHECKSUMS).is_file()
    assert [r["step"] for r in _rows(run)] == [1, 2]
