"""SIS in the LLM trainer (``algorithm.method: sis``): the rejection test by hand, on/off-policy acceptance, training."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from posttrain.estimators import masked_mean
from posttrain.estimators.sis import sis_accept, sis_acceptance_prob, sis_logp_old, token_in_topk
from posttrain.llm.config import load_config
from posttrain.llm.generate import token_logprobs
from posttrain.llm.run import build_trainer
from posttrain.llm.sis_trainer import response_log_probs
from tests.llm._lift import record_rollouts, small_config
from tests.llm.test_algorithm import _trainer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_cpu.yaml"


def test_update_batches_equal_the_rejection_test_by_hand(tiny: tuple[Any, Any]) -> None:
    """Two updates on FixedEngine's noisy behaviour log-probs: each update's logp_old = sis_logp_old by hand."""
    trainer = _trainer(tiny, {"method": "sis", "options": {"top_k": 1000}})  # K >= V: the exact envelope
    trainer.cfg = dataclasses.replace(trainer.cfg, optim=dataclasses.replace(trainer.cfg.optim, updates_per_batch=2))
    model, original = trainer.model, trainer.accumulate_gradients
    batches = record_rollouts(trainer)
    behaviour: list[tuple[torch.Tensor, torch.Tensor]] = []
    rates: list[float] = []

    def by_hand(batch: Any) -> dict[str, float]:
        rollout = batches[-1]
        full = response_log_probs(model, rollout, 1.0)  # [B, T, V], the current policy
        logp = full.gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)
        ref, _ = token_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids, rollout.mask)
        torch.testing.assert_close(torch.where(rollout.mask, logp, 0.0), torch.where(rollout.mask, ref, 0.0))
        if not behaviour:  # first update: the policy is still the behaviour policy
            top = full.topk(full.shape[-1], dim=-1)
            behaviour.append((top.indices, top.values))
        idx, old = behaviour[0]
        a = sis_acceptance_prob(
            logp, rollout.logp_old, full.gather(-1, idx), old, token_in_topk(rollout.response_ids, idx)
        )
        seed = trainer.cfg.seed * 1_000_003 + trainer.step * 101 + len(rates)
        u = torch.rand(a.shape, generator=torch.Generator().manual_seed(seed), dtype=a.dtype)
        accepted = sis_accept(a, u) & rollout.mask
        rates.append(float(masked_mean(accepted.to(a.dtype), rollout.mask)))
        want = sis_logp_old(logp, rollout.logp_old, accepted)
        torch.testing.assert_close(torch.where(batch.mask, batch.logp_old, 0.0), torch.where(batch.mask, want, 0.0))
        return original(batch)

    trainer.accumulate_gradients = by_hand  # type: ignore[method-assign]
    metrics = trainer.train_step()
    assert len(rates) == 2 and 0.0 < min(rates) < 1.0  # noisy behaviour log-probs: some tokens are rejected
    assert metrics["sis/accept_rate"] == pytest.approx(sum(rates) / 2, abs=1e-12)


def test_acceptance_is_total_on_policy_and_partial_when_stale(tmp_path: Path) -> None:
    sis = {"method": "sis", "options": {"top_k": 100}}
    on = build_trainer(small_config(algorithm=sis, updates_per_batch=1), tmp_path / "on").fit()
    assert all(h["sis/accept_rate"] > 0.999 for h in on)  # mu == pi_theta: every token accepted
    stale = build_trainer(small_config(algorithm=sis, updates_per_batch=4, lr=3e-2), tmp_path / "stale").fit()
    assert min(h["sis/accept_rate"] for h in stale) < 1.0  # later updates reject some stale tokens
    assert all(h["sis/d_sis"] <= h["sis/d_orig"] + 1e-9 for h in stale)


@pytest.mark.slow
def test_sis_grpo_raises_held_out_reward_with_stale_updates(tmp_path: Path) -> None:
    """SFT warm-up then 30 steps of 4 updates per rollout batch (tiny_cpu.yaml, seed 0): reward rises."""
    cfg = load_config(EXAMPLE, ["seed=0", "optim.steps=30", "optim.updates_per_batch=4", "checkpoint.every=0",
                                "logging.progress=false", "algorithm.method=sis"])  # fmt: skip
    trainer = build_trainer(cfg, tmp_path / "run")  # top_k = 100 >= V: the exact envelope
    before = trainer.evaluate()["reward_mean"]
    history = trainer.fit()
    after = trainer.evaluate()["reward_mean"]
    print("SIS held-out reward", before, "->", after, [round(h["sis/accept_rate"], 3) for h in history])
    assert min(h["sis/accept_rate"] for h in history) < 1.0
    assert after - before >= 0.05
