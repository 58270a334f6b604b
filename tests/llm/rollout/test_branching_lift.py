"""RAIL in the LLM trainer: branch rows carry correct behaviour log-probs; branching is active and trains."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posttrain.llm.rollout.branching import BranchingStage
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.run import build_trainer
from tests.llm._lift import fit_example, small_config


def test_branch_rows_share_a_prefix_and_carry_behaviour_log_probs(tmp_path: Path) -> None:
    cfg = small_config(rollout={"branching": {"branches": 2, "shadow_steps": 10}})
    trainer = build_trainer(cfg, tmp_path / "run")
    (stage,) = trainer.stages
    assert isinstance(stage, BranchingStage)
    batch, texts = trainer.rollout()
    assert batch.batch_size == 4 * 4 and batch.group_size == 4 and len(texts) == 16
    with torch.no_grad():
        recomputed, _ = token_logprobs(
            trainer.model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask
        )
    assert batch.logp_old is not None
    gap = torch.where(batch.mask, (recomputed - batch.logp_old).abs(), torch.zeros(()))
    assert float(gap.max()) < 1e-4  # prefix log-probs from the base row + engine log-probs of the continuation
    assert 0.0 <= trainer.stage_logs["rail/branched"] <= 1.0
    metrics = trainer.train_step()
    assert {"rail/branched", "rail/depth", "rail/gain"} <= set(metrics)


@pytest.mark.slow
def test_rail_branching_is_active_and_raises_held_out_reward(tmp_path: Path) -> None:
    """SFT warm-up then 30 GRPO steps with RAIL branching (4 base + 4 branches) on tiny_cpu.yaml (seed 0)."""
    trainer, history, before, after = fit_example(tmp_path / "run", "rollout.branching={branches: 4, shadow_steps: 5}")
    print("RAIL held-out reward", before, "->", after, [round(h["rail/branched"], 2) for h in history])
    assert max(h["rail/branched"] for h in history) > 0
    (stage,) = trainer.stages
    assert isinstance(stage, BranchingStage)
    assert stage.ctrl.features.shape[0] > 0  # the controller was fitted on realised gains
    assert after - before >= 0.05
