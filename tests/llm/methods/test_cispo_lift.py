"""CISPO in the LLM trainer (``algorithm.method: cispo``, and ``sis`` with ``base: cispo``): loss and gradients
equal the estimator functions applied by hand to the same batch (float64)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from posttrain.estimators import aggregate, broadcast_sequence_advantages, cispo_loss, group_normalized_advantages
from posttrain.llm.methods.sis import SisEnvelope
from posttrain.llm.rollout.logprobs import token_logprobs
from tests.llm._lift import record_rollouts, sis_test_by_hand
from tests.llm.methods.test_algorithm import G, K, _grads, _trainer

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")


def _by_hand(model: Any, batch: Any, **loss_options: Any) -> tuple[torch.Tensor, Any]:
    """GRPO advantages, ``cispo_loss`` against the rollout's behaviour log-probs, token mean; backward."""
    adv = broadcast_sequence_advantages(group_normalized_advantages(batch.rewards.reshape(G, K)), batch.mask)
    logp, _ = token_logprobs(
        model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask, group_size=batch.group_size
    )
    tok, diag = cispo_loss(logp, batch.logp_old, adv, batch.mask, **loss_options)
    loss = aggregate(tok, batch.mask, "token-mean")
    loss.backward()
    return loss.detach(), diag


@pytest.mark.parametrize(
    "loss_options", [{}, {"clip_mode": "minimax", "clip_high": 1.1}], ids=["verl", "minimax-cap-1.1"]
)
def test_cispo_trainer_loss_equals_estimators_by_hand(tiny: tuple[Any, Any], loss_options: dict[str, Any]) -> None:
    trainer = _trainer(tiny, {"method": "cispo", "loss_options": loss_options})
    batch, _ = trainer.rollout()  # FixedEngine: behaviour log-probs = the policy's + N(0, 0.3^2) noise
    model = trainer.model
    model.zero_grad()
    stats = trainer.accumulate_gradients(batch)
    g_trainer = _grads(model)
    model.zero_grad()
    by_hand, diag = _by_hand(model, batch, **loss_options)
    assert 0.0 < float(diag.clip_frac) < 1.0  # off-policy batch: some weights clipped, some not
    assert stats["loss"] == pytest.approx(float(by_hand), rel=1e-10, abs=1e-12)
    assert stats["pg/clip_frac"] == pytest.approx(float(diag.clip_frac), abs=1e-12)
    for a, b in zip(g_trainer, _grads(model), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_sis_on_cispo_equals_estimators_by_hand(tiny: tuple[Any, Any]) -> None:
    """Two SIS updates on CISPO: each update's loss and gradient = cispo_loss(..., on_policy=accepted) by hand,
    the rejection test redone from the estimator functions; accepted tokens carry weight 1."""
    trainer = _trainer(
        tiny,
        {"method": "sis", "options": {"base": "cispo", "top_k": 1000}},
        fillers=SisEnvelope(tiny[0], top_k=1000, temperature=1.0).fillers(),
    )  # K >= V: exact
    trainer.cfg = dataclasses.replace(trainer.cfg, optim=dataclasses.replace(trainer.cfg.optim, updates_per_batch=2))
    model, original = trainer.model, trainer.accumulate_gradients
    rollouts = record_rollouts(trainer)
    behaviour: list[tuple[torch.Tensor, torch.Tensor]] = []
    rates: list[float] = []

    def checked(batch: Any) -> dict[str, float]:
        rollout = rollouts[-1]
        logp, accepted = sis_test_by_hand(trainer, rollout, behaviour, len(rates))
        rates.append(float(accepted.sum()) / float(rollout.mask.sum()))
        model.zero_grad()
        by_hand, _ = _by_hand(model, rollout, on_policy=accepted)
        g_hand = _grads(model)
        # the ratio the trainer's loss sees on accepted tokens is 1 (inside every clip range): weight 1
        ratio = torch.exp(logp - batch.logp_old)[accepted]
        torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=1e-12)
        model.zero_grad()
        stats = original(batch)
        assert stats["loss"] == pytest.approx(float(by_hand), rel=1e-10, abs=1e-12)
        for g_t, g_h in zip(_grads(model), g_hand, strict=True):
            torch.testing.assert_close(g_t, g_h, rtol=1e-9, atol=1e-12)
        return stats

    trainer.accumulate_gradients = checked  # type: ignore[method-assign]
    metrics = trainer.train_step()
    assert len(rates) == 2 and 0.0 < min(rates) and max(rates) < 1.0  # both accepted and rejected tokens
    assert metrics["sis/accept_rate"] == pytest.approx(sum(rates) / 2, abs=1e-12)
