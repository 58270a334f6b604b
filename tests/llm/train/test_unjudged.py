"""A sample whose reward could not be computed (NaN from the verifier) is excluded from the loss and counted.

The whole group of an unjudged sample is excluded: its advantages depend on every reward in it. The
test: the trainer's gradient on a batch with one unjudged sample equals its gradient on the batch of
the other groups alone, and the step's metrics count the sample and the group.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from posttrain.errors import ShapeError
from posttrain.llm.config import config_from_dict
from posttrain.llm.methods.catalog import build_algorithm
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.tasks import Problem
from posttrain.llm.train.trainer import Trainer
from tests.llm.fakes import FixedEngine, TableTask

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")

G, K = 3, 4
RESPONSES = [[5 + (i % 7)] * (1 + i % 5) + [3] for i in range(G * K)]
UNJUDGED_ROW = 1  # group 0


class HalfJudgedTask(TableTask):
    """TableTask's rewards, except NaN (a verdict not reached) for the ``UNJUDGED_ROW``-th scored completion."""

    def __init__(self) -> None:
        self.calls = 0

    def reward(self, problem: Problem, completion: str) -> float:
        self.calls += 1
        return math.nan if (self.calls - 1) % (G * K) == UNJUDGED_ROW else super().reward(problem, completion)


def _trainer(tiny: tuple[Any, Any]) -> Trainer:
    model, tok = tiny
    model.double()
    cfg = config_from_dict(
        {"data": {"prompts_per_step": G}, "rollout": {"group_size": K, "max_new_tokens": 8},
         "optim": {"max_grad_norm": None}}
    )  # fmt: skip
    alg = build_algorithm(method="grpo", horizon=8)
    return Trainer(cfg, model=model, tokenizer=tok, task=HalfJudgedTask(), engine=FixedEngine(model, RESPONSES),
                   algorithm=alg, sampling=cfg.rollout.sampling())  # fmt: skip


def _grads(model: Any) -> list[torch.Tensor]:
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def test_unjudged_group_is_excluded_from_the_loss(tiny: tuple[Any, Any]) -> None:
    trainer = _trainer(tiny)
    batch, _ = trainer.rollout()
    assert batch.judged is not None
    assert batch.judged.tolist() == [i != UNJUDGED_ROW for i in range(G * K)]
    assert bool(torch.isfinite(batch.rewards).all())
    assert batch.loss_mask()[:K].sum() == 0 and torch.equal(batch.loss_mask()[K:], batch.mask[K:])
    trainer.model.zero_grad()
    stats = trainer.accumulate_gradients(batch)
    with_unjudged = _grads(trainer.model)
    trainer.model.zero_grad()
    judged_only = batch.rows(K, G * K).replace(judged=None)
    expected = trainer.accumulate_gradients(judged_only)
    assert stats["loss"] == pytest.approx(expected["loss"], rel=1e-12)
    for a, b in zip(with_unjudged, _grads(trainer.model), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_step_metrics_count_unjudged_samples_and_excluded_groups(tiny: tuple[Any, Any]) -> None:
    trainer = _trainer(tiny)
    metrics = trainer.train_step()
    assert metrics["unjudged"] == 1 and metrics["excluded_groups"] == 1
    assert math.isfinite(metrics["reward_mean"]) and math.isfinite(metrics["loss"])


def test_batch_validates_the_judged_field() -> None:
    base: dict[str, Any] = dict(
        prompt_ids=torch.ones(4, 2, dtype=torch.long), prompt_mask=torch.ones(4, 2, dtype=torch.bool),
        response_ids=torch.ones(4, 3, dtype=torch.long), mask=torch.ones(4, 3, dtype=torch.bool),
        rewards=torch.zeros(4), group_size=2,
    )  # fmt: skip
    b = RolloutBatch(**base, judged=torch.tensor([True, True, False, True]))
    assert b.loss_mask().tolist() == [[True] * 3, [True] * 3, [False] * 3, [False] * 3]
    assert b.judged_groups().tolist() == [True, False]
    assert RolloutBatch(**base).loss_mask() is not None
    with pytest.raises(ShapeError, match="judged"):
        RolloutBatch(**base, judged=torch.ones(3, dtype=torch.bool))
    with pytest.raises(ShapeError, match="judged"):
        RolloutBatch(**base, judged=torch.ones(4))
