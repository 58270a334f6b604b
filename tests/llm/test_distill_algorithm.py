"""The distillation losses plug into the LLM trainer's Algorithm bundle: the teacher is a declared need."""

from __future__ import annotations

import torch

from posttrain.estimators import clipped_ratio_loss, group_normalized_advantages
from posttrain.estimators.distill import eos_teacher_mask, opd_token_advantages
from posttrain.estimators.distill_rules import kdrl_advantages
from posttrain.llm.algorithm import build_algorithm
from posttrain.llm.batch import RolloutBatch


def _batch() -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    b, t = 4, 5
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[1, 3:] = False
    return RolloutBatch(
        prompt_ids=torch.randint(4, 20, (b, 3), generator=g),
        prompt_mask=torch.ones(b, 3, dtype=torch.bool),
        response_ids=torch.randint(4, 20, (b, t), generator=g),
        mask=mask,
        rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]),
        group_size=2,
        logp_old=-torch.rand(b, t, generator=g),
        logp_teacher=-torch.rand(b, t, generator=g),
    )


def test_kdrl_and_trrd_declare_the_teacher_and_match_the_estimators() -> None:
    batch = _batch()
    logp = batch.logp_old + 0.05
    a_hat = group_normalized_advantages(batch.grouped_rewards()).reshape(-1)
    d = opd_token_advantages(batch.logp_teacher, batch.logp_old, batch.mask, teacher_mask=eos_teacher_mask(batch.mask))
    alg = build_algorithm(method="grpo", horizon=5, loss="opd", loss_options={"beta": 0.2, "mask_final_token": True})
    assert "logp_teacher" in alg.needs
    prepared = batch.replace(advantages=alg.advantages(batch))
    loss, _ = alg.token_loss(logp, None, prepared)
    want, _ = clipped_ratio_loss(logp, batch.logp_old, kdrl_advantages(a_hat, d, batch.mask, beta=0.2), batch.mask)
    assert torch.allclose(loss, want, atol=1e-6)
    trrd = build_algorithm(method="grpo", horizon=5, loss="trrd")
    assert "logp_teacher" in trrd.needs
    assert torch.isfinite(trrd.token_loss(logp, None, prepared)[0]).all()


def test_grpo_needs_no_teacher() -> None:
    assert "logp_teacher" not in build_algorithm(method="grpo", horizon=5).needs
