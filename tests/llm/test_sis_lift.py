"""SIS in the LLM trainer: on-policy updates accept every token; stale updates reject some; training works."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.llm.config import load_config
from posttrain.llm.run import build_trainer
from posttrain.llm.sis_trainer import SISTrainer
from tests.llm._lift import small_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_cpu.yaml"


def test_acceptance_is_total_on_policy_and_partial_when_stale(tmp_path: Path) -> None:
    on = SISTrainer.from_trainer(build_trainer(small_config(updates_per_batch=1), tmp_path / "on")).fit()
    assert all(h["sis/accept_rate"] > 0.999 for h in on)  # mu == pi_theta: every token accepted
    stale = SISTrainer.from_trainer(build_trainer(small_config(updates_per_batch=4, lr=3e-2), tmp_path / "stale")).fit()
    assert min(h["sis/accept_rate"] for h in stale) < 1.0  # later updates reject some stale tokens
    assert all(h["sis/d_sis"] <= h["sis/d_orig"] + 1e-9 for h in stale)


@pytest.mark.slow
def test_sis_grpo_raises_held_out_reward_with_stale_updates(tmp_path: Path) -> None:
    """SFT warm-up then 30 steps of 4 updates per rollout batch (tiny_cpu.yaml, seed 0): reward rises."""
    cfg = load_config(EXAMPLE, ["seed=0", "optim.steps=30", "optim.updates_per_batch=4", "checkpoint.every=0",
                                "logging.progress=false"])  # fmt: skip
    trainer = SISTrainer.from_trainer(build_trainer(cfg, tmp_path / "run"))  # K >= V: the exact envelope
    before = trainer.evaluate()["reward_mean"]
    history = trainer.fit()
    after = trainer.evaluate()["reward_mean"]
    print("SIS held-out reward", before, "->", after, [round(h["sis/accept_rate"], 3) for h in history])
    assert min(h["sis/accept_rate"] for h in history) < 1.0
    assert after - before >= 0.05
