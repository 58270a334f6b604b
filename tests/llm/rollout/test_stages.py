"""Rollout stages from the config: validation at load, composition (RAIL + replay), checkpointed state."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from posttrain.errors import DomainError
from posttrain.llm.config import CheckpointConfig, config_from_dict
from posttrain.llm.rollout.branching import BranchingStage
from posttrain.llm.rollout.replay import ReplayStage
from posttrain.llm.rollout.stages import RolloutStage
from posttrain.llm.run import build_trainer
from posttrain.llm.train.trainer import Trainer
from tests.llm._lift import small_config
from tests.llm.fakes import TableTask

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")

TIME_KEYS = {"step_time_s", "gen_time_s"}


@pytest.mark.parametrize(
    ("rollout", "message"),
    [
        ({"replay": {"rule": "hdrr"}}, r"rollout\.replay\.rule: unknown name 'hdrr'; valid: drift_only, hdr"),
        ({"replay": {"k_rep": 2, "budget": 3}}, r"rollout\.replay: unknown key\(s\) budget; valid: rule, k_rep"),
        ({"replay": {"capacity": 0}}, r"rollout\.replay\.capacity: expected an integer in \[1, 65536\], got 0"),
        ({"replay": {"tau": "x"}}, r"rollout\.replay\.tau: expected a number, got 'x'"),
        ({"branching": {"branches": 8}}, r"rollout\.branching\.branches: expected 1 <= b < rollout\.group_size=8"),
        ({"branching": {"explore": 2.0}}, r"rollout\.branching\.explore: expected a number in \[0.0, 1.0\], got 2.0"),
        ({"branching": [1]}, r"rollout\.branching: expected a mapping"),
    ],
)
def test_stage_config_errors_name_the_key(rollout: dict[str, Any], message: str) -> None:
    with pytest.raises(DomainError, match=message):
        config_from_dict({"rollout": rollout})


def test_stages_default_off_and_parse_from_yaml_mappings() -> None:
    assert config_from_dict({}).rollout.replay is None and config_from_dict({}).rollout.branching is None
    cfg = config_from_dict({"rollout": {"replay": {"rule": "naive_recency", "tau": 1}, "branching": None}})
    assert cfg.rollout.replay is not None and cfg.rollout.replay.tau == 1.0 and cfg.rollout.branching is None


def _metrics(run: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]


def test_rail_then_replay_compose_and_resume_identically(tmp_path: Path) -> None:
    """Both stages in one run; a run resumed after step 2 logs the numbers of an uninterrupted one, so the
    stages' state (RAIL's controller and random generator, the replay buffer) is checkpointed. The task's
    graded rewards (length-based) give mixed-outcome groups, so the buffer fills."""
    cfg = small_config(
        steps=4,
        rollout={
            "branching": {"branches": 2, "shadow_steps": 1, "explore": 0.5},
            "replay": {"rule": "naive_recency", "k_rep": 2, "tau": 1e9},
        },
    )
    cfg = dataclasses.replace(cfg, checkpoint=CheckpointConfig(every=2, keep=2))

    def build(run: str, resume: bool = False) -> Trainer:
        trainer = build_trainer(cfg, tmp_path / run, resume=resume)
        trainer.task = TableTask()
        return trainer

    full = build("full")
    assert [type(s) for s in full.stages] == [BranchingStage, ReplayStage]
    assert all(isinstance(s, RolloutStage) for s in full.stages)
    full.fit()
    build("resumed").fit(stop_after=3)
    resumed = build("resumed", resume=True)
    assert resumed.step == 2
    resumed.fit()
    a, b = _metrics(tmp_path / "full"), _metrics(tmp_path / "resumed")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert a == b
    assert max(r["rail/branched"] for r in a) > 0
    assert a[2]["replay/buffer"] > 0 and a[2]["replay/groups"] > 0  # the step-2 checkpoint's buffer is used
