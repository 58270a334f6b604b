"""TensorBoard and W&B sinks: what they record equals metrics.jsonl, step by step."""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from posttrain.llm.config import LoggingConfig
from posttrain.llm.run import train
from tests.llm._lift import small_config

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _run(out: Path, **logging: Any) -> list[dict[str, Any]]:
    """Two GRPO steps of the small config through ``train`` (the CLI's path); the rows of metrics.jsonl."""
    cfg = small_config(steps=2)
    cfg = dataclasses.replace(cfg, logging=LoggingConfig(progress=False, **logging))
    history = train(cfg, out)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == len(history) == 2
    return rows


def test_tensorboard_scalars_equal_metrics_jsonl(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="TensorBoard is in the [dev] extra")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = _run(tmp_path / "run", tensorboard=True)
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert set(tags) == {k for r in rows for k, v in r.items() if k != "step" and _number(v)}
    assert {"reward_mean", "loss", "entropy", "flops/total"} <= set(tags)
    for tag in tags:  # TensorBoard stores float32 scalars
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert got == [(r["step"], float(np.float32(r[tag]))) for r in rows if _number(r.get(tag))], tag


_BLOCK, _HEADER = 32 * 1024, 7


def _wandb_records(path: Path) -> Iterator[Any]:
    """The protobuf records of a ``.wandb`` file (a ``:W&B`` header, then LevelDB-log framed chunks in 32 KiB
    blocks: crc32, little-endian length, type 1 full / 2 first / 3 middle / 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, chunk = _HEADER, b""
    while pos + _HEADER <= len(data):
        if _BLOCK - pos % _BLOCK < _HEADER:  # the block's zero-filled trailer
            pos += _BLOCK - pos % _BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if length == 0 and kind == 0:
            break
        chunk += data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            record.ParseFromString(chunk)
            chunk = b""
            yield record


def test_wandb_offline_history_equals_metrics_jsonl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wandb = pytest.importorskip("wandb", reason="W&B is in the [wandb] extra")
    for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off"}.items():
        monkeypatch.setenv(key, value)  # no network, no account
    rows = _run(tmp_path / "run", wandb_project="posttrain-test")
    wandb.teardown()  # the run is finished; wait for W&B's service process to close its files
    (run_file,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    logged = [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
        for r in _wandb_records(run_file)
        if r.WhichOneof("record_type") == "history"
    ]
    assert [{k: v for k, v in h.items() if not k.startswith("_")} for h in logged] == rows
    assert [h["_step"] for h in logged] == [1, 2]
