"""The trainer's loss and gradients against the estimator functions applied by hand to the same batch."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from posttrain.errors import DomainError
from posttrain.estimators import (
    AggregationMode,
    aggregate,
    broadcast_sequence_advantages,
    clipped_ratio_loss,
    group_normalized_advantages,
    gspo_loss,
    k1_kl,
    k3_kl,
    rloo_advantages,
)
from posttrain.estimators.aggregation import normaliser
from posttrain.llm.config import config_from_dict
from posttrain.llm.methods.catalog import build_algorithm
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.train.trainer import Trainer
from tests.llm.fakes import FixedEngine, TableTask

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")

G, K = 3, 4
# B = 12 responses of different lengths (token ids of the char vocabulary; 3 = <eos>)
RESPONSES = [[5 + (i % 7)] * (1 + i % 5) + [3] for i in range(G * K)]


def _trainer(
    tiny: tuple[Any, Any], algorithm: dict[str, Any], micro: int | None = None, fillers: dict[str, Any] | None = None
) -> Trainer:
    model, tok = tiny
    model.double()  # float64 so that the comparisons below test the mathematics, not float32 rounding
    torch.manual_seed(0)
    cfg = config_from_dict(
        {
            "model": {"teacher": model.name_or_path},  # a method's teacher fillers are given below, not loaded
            "data": {"prompts_per_step": G},
            "rollout": {"group_size": K, "max_new_tokens": 8},
            "algorithm": algorithm,
            "optim": {"micro_batch_size": micro, "max_grad_norm": None},
        }
    )
    a = cfg.algorithm
    alg = build_algorithm(
        method=a.method,
        horizon=8,
        loss_options=a.loss_options,
        kl=a.kl,
        kl_coef=a.kl_coef,
        entropy_coef=a.entropy_coef,
        aggregation=a.aggregation,
        options=a.options,
    )
    ref = type(model).from_pretrained(model.name_or_path).double()
    with torch.no_grad():  # a reference model that differs from the policy
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))

    def fill_ref(batch: Any) -> torch.Tensor:
        return token_logprobs(ref, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask)[0]

    return Trainer(
        cfg,
        model=model,
        tokenizer=tok,
        task=TableTask(),
        engine=FixedEngine(model, RESPONSES),
        algorithm=alg,
        sampling=cfg.rollout.sampling(),
        fillers={"logp_ref": fill_ref, **(fillers or {})},
    )


def _grads(model: Any) -> list[torch.Tensor]:
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


CASES = [
    ({"method": "grpo"}, group_normalized_advantages, clipped_ratio_loss, {}, "seq-mean-token-mean"),
    (
        {"method": "drgrpo"},
        lambda r: group_normalized_advantages(r, scale_by_std=False),
        clipped_ratio_loss,
        {},
        "seq-mean-token-sum-norm",
    ),
    ({"method": "rloo", "kl": "k1", "kl_coef": 0.1}, rloo_advantages, clipped_ratio_loss, {}, "seq-mean-token-sum"),
    (
        {"method": "gspo", "loss_options": {"clip_low": 0.1, "clip_high": 0.12}},
        group_normalized_advantages,
        gspo_loss,
        {"clip_low": 0.1, "clip_high": 0.12},
        "seq-mean-token-mean",
    ),
    (
        {"method": "ppo_clip", "kl": "k3", "kl_coef": 0.05, "entropy_coef": 0.01},
        group_normalized_advantages,
        clipped_ratio_loss,
        {"dual_clip": 3.0},
        "token-mean",
    ),
]


@pytest.mark.parametrize(("algorithm", "adv_fn", "loss_fn", "loss_kwargs", "mode"), CASES, ids=lambda x: str(x)[:24])
def test_trainer_loss_equals_estimators_by_hand(
    tiny: tuple[Any, Any], algorithm: dict[str, Any], adv_fn: Any, loss_fn: Any, loss_kwargs: dict[str, Any], mode: str
) -> None:
    trainer = _trainer(tiny, algorithm)
    batch, _ = trainer.rollout()
    model = trainer.model
    model.zero_grad()
    stats = trainer.accumulate_gradients(batch)
    g_trainer = _grads(model)

    # by hand: the estimator functions, composed in the obvious way
    model.zero_grad()
    rewards = batch.rewards.reshape(G, K)
    assert rewards.std() > 0  # the fake task gives a non-trivial reward table
    adv = broadcast_sequence_advantages(adv_fn(rewards), batch.mask)
    logp, entropy = token_logprobs(
        model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask, with_entropy=True, entropy_grad=True,
        group_size=batch.group_size,
    )  # fmt: skip
    assert entropy is not None and batch.logp_old is not None
    tok, _ = loss_fn(logp, batch.logp_old, adv, batch.mask, **loss_kwargs)
    kl_fn = {"k1": k1_kl, "k3": k3_kl}.get(algorithm.get("kl", ""))
    if kl_fn is not None:
        assert batch.logp_ref is not None
        tok = tok + algorithm["kl_coef"] * kl_fn(logp, batch.logp_ref)
    tok = tok - algorithm.get("entropy_coef", 0.0) * entropy
    by_hand = aggregate(tok, batch.mask, mode, horizon=8)
    by_hand.backward()

    assert stats["loss"] == pytest.approx(float(by_hand.detach()), rel=1e-10, abs=1e-12)
    for a, b in zip(g_trainer, _grads(model), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    assert ("logp_ref" in trainer.algorithm.needs) == (kl_fn is not None)


@pytest.mark.parametrize("mode", [m.value for m in AggregationMode])
def test_micro_batched_gradients_equal_full_batch(tiny: tuple[Any, Any], mode: str) -> None:
    """Gradient accumulation over whole-group micro-batches reproduces the full batch, every aggregation."""
    algorithm = {"method": "grpo", "aggregation": mode, "kl": "k3", "kl_coef": 0.1, "entropy_coef": 0.01}
    full = _trainer(tiny, algorithm)
    batch, _ = full.rollout()
    full.model.zero_grad()
    loss_full = full.accumulate_gradients(batch)["loss"]
    g_full = _grads(full.model)
    micro = _trainer(tiny, algorithm, micro=K)  # three micro-batches of one group each
    assert len(micro.micro_batches(batch)) == G
    micro.model.zero_grad()
    loss_micro = micro.accumulate_gradients(batch)["loss"]
    assert loss_micro == pytest.approx(loss_full, rel=1e-10, abs=1e-12)
    for a, b in zip(g_full, _grads(micro.model), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_normaliser_matches_aggregate() -> None:
    """aggregate(all rows) == sum over row blocks of aggregate(block) * Z_block / Z_all, every mode."""
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    mask = torch.rand(6, 5, generator=gen) < 0.7
    mask[:, 0] = True
    for mode in AggregationMode:
        z = normaliser(mask, mode, horizon=7)
        parts = sum(
            aggregate(values[i : i + 2], mask[i : i + 2], mode, horizon=7)
            * normaliser(mask[i : i + 2], mode, horizon=7)
            / z
            for i in range(0, 6, 2)
        )
        torch.testing.assert_close(parts, aggregate(values, mask, mode, horizon=7))


def test_build_algorithm_rejects_unknown_options() -> None:
    with pytest.raises(DomainError, match="clip_low"):
        build_algorithm(method="grpo", horizon=4, loss_options={"clip_lo": 0.2})
    with pytest.raises(KeyError, match="valid names"):
        build_algorithm(method="grpo", horizon=4, loss="nope")
