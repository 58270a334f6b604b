"""``algorithm.rollout_correction`` in the trainer: loss and gradient equal the estimators by hand (float64)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from posttrain.errors import DomainError
from posttrain.estimators import aggregate, broadcast_sequence_advantages, clipped_ratio_loss, gspo_loss, k3_kl
from posttrain.estimators import group_normalized_advantages as grpo_adv
from posttrain.llm.config import config_from_dict, load_run
from posttrain.llm.methods.correction import with_rollout_correction
from posttrain.llm.methods.needs import policy_logp_filler
from posttrain.llm.rollout.logprobs import token_logprobs
from tests.llm.methods.test_algorithm import G, K, _grads, _trainer

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")


def _weights_by_hand(prox: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, mode: str, cap: float, floor: float):
    """The weight of every token, one row at a time (no library function)."""
    w = torch.zeros_like(prox)
    flagged = torch.zeros_like(mask)
    for b in range(prox.shape[0]):
        d = [(float(prox[b, t]) - float(old[b, t])) if mask[b, t] else 0.0 for t in range(prox.shape[1])]
        seq = math.exp(sum(d))
        for t in range(prox.shape[1]):
            if not mask[b, t]:
                continue
            r = seq if mode.startswith("sequence") else math.exp(d[t])
            out = r < floor or r > cap
            w[b, t] = (0.0 if out else r) if mode.endswith("mask") else min(max(r, floor), cap)
            flagged[b, t] = out
    return w, flagged


CASES = [
    ("grpo", "token_truncate", 1.2, 0.0, {}),
    ("grpo", "token_mask", 1.3, 0.75, {}),
    ("grpo", "sequence_truncate", 1.5, 0.5, {}),
    ("grpo", "sequence_mask", 2.0, 0.5, {}),
    ("gspo", "token_truncate", 1.2, 0.0, {"clip_low": 0.1, "clip_high": 0.12}),
]


@pytest.mark.parametrize(("method", "mode", "cap", "floor", "loss_kw"), CASES, ids=lambda x: str(x)[:18])
def test_corrected_loss_equals_estimators_by_hand(
    tiny: tuple[Any, Any], method: str, mode: str, cap: float, floor: float, loss_kw: dict
) -> None:
    correction = {"mode": mode, "cap": cap, "floor": floor}
    algorithm = {
        "method": method,
        "kl": "k3",
        "kl_coef": 0.05,
        "loss_options": loss_kw,
        "rollout_correction": correction,
    }
    if not loss_kw:
        del algorithm["loss_options"]
    trainer = _trainer(tiny, algorithm, fillers={"logp_prox": policy_logp_filler(tiny[0], 1.0)})
    trainer.algorithm = with_rollout_correction(trainer.algorithm, trainer.cfg.algorithm.rollout_correction)
    batch, _ = trainer.rollout()  # FixedEngine: the engine's log-probs = the policy's + N(0, 0.3^2)
    model = trainer.model
    model.zero_grad()
    stats = trainer.accumulate_gradients(batch)
    g_trainer = _grads(model)

    model.zero_grad()
    m = batch.mask
    # the trainer's forward: each prompt once, its K samples on the shared prompt (group_size)
    forward = (batch.prompt_ids, batch.prompt_mask, batch.response_ids, m)
    with torch.no_grad():
        prox, _ = token_logprobs(model, *forward, group_size=batch.group_size)
    torch.testing.assert_close(torch.where(m, batch.extras["logp_prox"], 0.0), torch.where(m, prox, 0.0))
    assert batch.logp_old is not None and batch.logp_ref is not None
    w, flagged = _weights_by_hand(prox, batch.logp_old, m, mode, cap, floor)
    assert 0 < int(flagged.sum()) < int(m.sum())  # the rule acts on some tokens of this batch, not all
    logp, _ = token_logprobs(model, *forward, group_size=batch.group_size)
    adv = broadcast_sequence_advantages(grpo_adv(batch.rewards.reshape(G, K)), m)
    loss_fn = gspo_loss if method == "gspo" else clipped_ratio_loss
    pg, _ = loss_fn(logp, prox, adv, m, **loss_kw)
    tok = pg * w + 0.05 * k3_kl(logp, batch.logp_ref)  # the KL term is not weighted
    by_hand = aggregate(tok, m, "seq-mean-token-mean")
    by_hand.backward()
    assert stats["loss"] == pytest.approx(float(by_hand.detach()), rel=1e-10, abs=1e-12)
    for a, b in zip(g_trainer, _grads(model), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    if not mode.startswith("sequence"):
        key = "pg/is_masked" if mode.endswith("mask") else "pg/is_truncated"
        assert stats[key] == pytest.approx(float(flagged[m].double().mean()), abs=1e-12)


def test_without_correction_the_loss_ratio_is_to_the_engine_log_probs(tiny: tuple[Any, Any]) -> None:
    """Bypass: no logp_prox is filled and the loss's ratio is pi_theta / mu (the engine's noisy log-probs)."""
    trainer = _trainer(tiny, {"method": "grpo"})
    batch, _ = trainer.rollout()
    assert "logp_prox" not in batch.extras
    stats = trainer.accumulate_gradients(batch)
    assert stats["pg/clip_frac"] > 0  # N(0, 0.3^2) noise on the behaviour log-probs: ratios beyond 1 +- 0.2


def test_config_refuses_bad_corrections() -> None:
    for raw, message in [
        ({"rollout_correction": {"mode": "tokenwise"}}, "algorithm.rollout_correction.mode"),
        ({"rollout_correction": {"cap": 0}}, "algorithm.rollout_correction.cap"),
        ({"rollout_correction": {"cap": 2, "floor": 3}}, "algorithm.rollout_correction.floor"),
        ({"method": "sis", "rollout_correction": {}}, "algorithm.rollout_correction: method 'sis'"),
    ]:
        with pytest.raises(DomainError, match=message):
            config_from_dict({"algorithm": raw})
    plan = load_run(None, ["algorithm.rollout_correction={mode: sequence_mask, cap: 3.0}"])
    assert plan.config.algorithm.rollout_correction is not None
    assert "logp_prox" in plan.algorithm.needs and "logp_prox" in plan.algorithm.loss_needs
    with pytest.raises(DomainError, match="logp_prox"):  # a bundle built by hand without the filler's batch input
        plan.algorithm.policy_loss(*(torch.zeros(1, 2),) * 2, torch.zeros(1), torch.ones(1, 2, dtype=torch.bool),
                                   logp_prox=None)  # fmt: skip
