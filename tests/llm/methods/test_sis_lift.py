"""SIS in the LLM trainer (``algorithm.method: sis``): the rejection test by hand, on/off-policy acceptance, training."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from posttrain.estimators import masked_mean, sis_logp_old
from posttrain.llm.methods.sis import SisEnvelope
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.run import build_trainer
from tests.llm._lift import fit_example, record_rollouts, sis_test_by_hand, small_config
from tests.llm.methods.test_algorithm import _trainer


def test_update_batches_equal_the_rejection_test_by_hand(tiny: tuple[Any, Any]) -> None:
    """Two updates on FixedEngine's noisy behaviour log-probs: each update's logp_old = sis_logp_old by hand."""
    trainer = _trainer(
        tiny,
        {"method": "sis", "options": {"top_k": 1000}},
        fillers=SisEnvelope(tiny[0], top_k=1000, temperature=1.0).fillers(),
    )  # K >= V: the exact envelope
    trainer.cfg = dataclasses.replace(trainer.cfg, optim=dataclasses.replace(trainer.cfg.optim, updates_per_batch=2))
    model, original = trainer.model, trainer.accumulate_gradients
    batches = record_rollouts(trainer)
    behaviour: list[tuple[torch.Tensor, torch.Tensor]] = []
    rates: list[float] = []

    def by_hand(batch: Any) -> dict[str, float]:
        rollout = batches[-1]
        logp, accepted = sis_test_by_hand(trainer, rollout, behaviour, len(rates))
        ref, _ = token_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids, rollout.mask)
        torch.testing.assert_close(torch.where(rollout.mask, logp, 0.0), torch.where(rollout.mask, ref, 0.0))
        rates.append(float(masked_mean(accepted.to(logp.dtype), rollout.mask)))
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
    # top_k = 100 >= V: the exact envelope
    _, history, before, after = fit_example(tmp_path / "run", "optim.updates_per_batch=4", "algorithm.method=sis")
    print("SIS held-out reward", before, "->", after, [round(h["sis/accept_rate"], 3) for h in history])
    assert min(h["sis/accept_rate"] for h in history) < 1.0
    assert after - before >= 0.05


def test_gspo_base_uses_the_released_gspo_sis_loss() -> None:
    """``base: gspo``: the trainer's token loss is `sis_gspo_loss` on the hook's accepted mask (float64, by hand)."""
    from posttrain.estimators.losses import sis_gspo_loss
    from posttrain.llm.methods.catalog import build_algorithm
    from posttrain.llm.rollout.batch import RolloutBatch

    gen = torch.Generator().manual_seed(0)
    b, t = 4, 6
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[1, 4:] = False
    logp_old = -torch.rand(b, t, generator=gen, dtype=torch.float64)
    logp = (logp_old + 0.3 * torch.randn(b, t, generator=gen, dtype=torch.float64)).requires_grad_()
    accepted = (torch.rand(b, t, generator=gen) < 0.5) & mask
    adv = torch.randn(b, 1, generator=gen, dtype=torch.float64).expand(b, t) * mask
    batch = RolloutBatch(
        prompt_ids=torch.ones(b, 2, dtype=torch.long), prompt_mask=torch.ones(b, 2, dtype=torch.bool),
        response_ids=torch.ones(b, t, dtype=torch.long), mask=mask, rewards=torch.zeros(b, dtype=torch.float64),
        group_size=2, logp_old=logp_old, advantages=adv, sis_accepted=accepted,
    )  # fmt: skip
    alg = build_algorithm(method="sis", horizon=t, options={"base": "gspo"})
    assert "sis_accepted" in alg.loss_needs
    loss, _ = alg.token_loss(logp, None, batch)
    want, _ = sis_gspo_loss(logp, logp_old, adv, mask, accepted, divergence=False)
    torch.testing.assert_close(loss, torch.where(mask, want, 0.0), rtol=1e-12, atol=1e-12)
    (g,) = torch.autograd.grad(loss.sum(), logp)
    (g_want,) = torch.autograd.grad(torch.where(mask, want, 0.0).sum(), logp)
    torch.testing.assert_close(g, g_want, rtol=1e-12, atol=1e-12)
    without = batch.replace(sis_accepted=None)
    with pytest.raises(Exception, match="sis_accepted"):
        alg.token_loss(logp, None, without)
