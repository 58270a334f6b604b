"""HDR replay in the LLM trainer: zero budget is on-policy GRPO bit for bit; replay is active and trains."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from posttrain.llm.rollout.replay import ReplayStage
from posttrain.llm.run import build_trainer
from tests.llm._lift import fit_example, small_config

VOLATILE = {"step_time_s", "gen_time_s"}


def _clean(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in h.items() if k not in VOLATILE and not k.startswith("replay/")} for h in history]


def test_zero_replay_budget_is_on_policy_grpo_bit_for_bit(tmp_path: Path) -> None:
    plain = build_trainer(small_config(steps=3, updates_per_batch=2), tmp_path / "plain").fit()
    trainer = build_trainer(
        small_config(steps=3, updates_per_batch=2, rollout={"replay": {"k_rep": 0}}), tmp_path / "replay"
    )
    assert [type(s) for s in trainer.stages] == [ReplayStage]
    replay = trainer.fit()
    assert _clean(plain) == _clean(replay)
    assert all(h["replay/groups"] == 0 for h in replay)


@pytest.mark.slow
def test_hdr_replay_is_active_and_raises_held_out_reward(tmp_path: Path) -> None:
    """SFT warm-up then 30 GRPO + HDR steps on tiny_cpu.yaml (seed 0): replay admits groups and reward rises."""
    _, history, before, after = fit_example(
        tmp_path / "run", "rollout.replay={rule: hdr, k_rep: 16, capacity: 64, tau: 1e-2}"
    )
    print("HDR held-out reward", before, "->", after, json.dumps([h["replay/groups"] for h in history]))
    assert sum(h["replay/groups"] for h in history) > 0 and max(h["replay/ratio"] for h in history) > 0
    assert all(h["replay/groups"] <= 16 for h in history)
    assert after - before >= 0.05
