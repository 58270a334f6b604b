"""Distillation bundles from a config: OPD-then-RL's switch (a pure function of the step; no teacher after it), ExOPD."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from posttrain.errors import DomainError
from posttrain.estimators import (
    AggregationMode,
    aggregate,
    clipped_ratio_loss,
    exopd_advantages,
    group_normalized_advantages,
    opd_then_rl_advantages,
    opd_token_advantages,
)
from posttrain.llm.config import load_config
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.run import build_trainer
from tests.llm._lift import count_fills, small_config
from tests.llm.methods.test_algorithm import G, K, _grads, _trainer

SWITCH = 2


def _perturbed(model: Any, scale: float, seed: int) -> Any:
    """A float64 copy of ``model`` with Gaussian noise on every weight (a stand-in teacher or reference)."""
    other = type(model).from_pretrained(model.name_or_path).double()
    with torch.no_grad():
        for i, p in enumerate(other.parameters()):
            p.add_(scale * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed + i), dtype=p.dtype))
    return other


def _filler(model: Any, calls: list[int] | None = None) -> Any:
    def fill(batch: Any) -> torch.Tensor:
        if calls is not None:
            calls.append(batch.batch_size)
        return token_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask)[0]

    return fill


def test_switch_at_the_configured_step_and_loss_equals_the_estimator(tiny: tuple[Any, Any]) -> None:
    calls: list[int] = []
    fill_teacher = _filler(_perturbed(tiny[0], 0.1, 0), calls)
    trainer = _trainer(tiny, {"method": "opd_then_rl", "options": {"switch_step": SWITCH}},
                       fillers={"logp_teacher": fill_teacher})  # fmt: skip
    assert "logp_teacher" in trainer.algorithm.needs  # checked against the fillers at construction
    for step in (1, 2, 3, 4):  # the weights stay fixed; only the step counter moves
        trainer.step = step - 1
        batch, _ = trainer.rollout()
        assert (batch.logp_teacher is not None) == (step <= SWITCH)
        trainer.model.zero_grad(set_to_none=True)
        stats = trainer.accumulate_gradients(batch)
        got = _grads(trainer.model)
        trainer.model.zero_grad(set_to_none=True)
        assert batch.logp_old is not None
        a_hat = group_normalized_advantages(batch.rewards.reshape(G, K)).reshape(-1)
        lt = batch.logp_teacher
        d = opd_token_advantages(lt, batch.logp_old, batch.mask) if lt is not None else None
        adv = opd_then_rl_advantages(a_hat, d, batch.mask, step=step, switch_step=SWITCH)
        logp, _ = token_logprobs(trainer.model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask,
                                 group_size=batch.group_size)  # fmt: skip
        tok, _ = clipped_ratio_loss(logp, batch.logp_old, adv, batch.mask)
        want = aggregate(tok, batch.mask, AggregationMode.SEQ_MEAN_TOKEN_MEAN)
        want.backward()
        assert stats["loss"] == pytest.approx(float(want.detach()), rel=1e-9, abs=1e-12)
        for a, b in zip(got, _grads(trainer.model), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-10)
    assert calls == [G * K] * SWITCH  # one batched teacher forward per OPD step, none after the switch


def test_config_run_calls_the_teacher_only_before_the_switch(tmp_path: Path, tiny_dir: Path) -> None:
    """``method: opd_then_rl`` through ``build_trainer``: teacher forwards at steps 1..S, none after; no teacher, no run."""
    algorithm = {"method": "opd_then_rl", "options": {"switch_step": 2}}
    with pytest.raises(DomainError, match=r"^model\.teacher: method 'opd_then_rl' reads logp_teacher"):
        small_config(algorithm=algorithm)  # at load, before a model or a run directory
    cfg = small_config(algorithm=algorithm, steps=3, model={"teacher": str(tiny_dir)})
    trainer = build_trainer(cfg, tmp_path / "run")
    steps = count_fills(trainer, "logp_teacher")
    history = trainer.fit()
    assert steps == [1, 2] and [h["step"] for h in history] == [1, 2, 3]


def test_exopd_loss_equals_the_estimator_by_hand(tiny: tuple[Any, Any]) -> None:
    """``method: exopd``: PPO-clip on exopd_advantages(logp_old, teacher, reference) with token-mean aggregation."""
    options = {"lam": 1.5, "scale": 0.2}
    trainer = _trainer(tiny, {"method": "exopd", "options": options},
                       fillers={"logp_teacher": _filler(_perturbed(tiny[0], 0.1, 0))})  # fmt: skip
    batch, _ = trainer.rollout()  # logp_ref: _trainer's perturbed reference (the teacher-base's role)
    stats = trainer.accumulate_gradients(batch)
    got = _grads(trainer.model)
    trainer.model.zero_grad(set_to_none=True)
    assert batch.logp_old is not None and batch.logp_teacher is not None and batch.logp_ref is not None
    adv = exopd_advantages(batch.logp_old, batch.logp_teacher, batch.logp_ref, batch.mask, **options)
    assert float(adv.abs().sum()) > 0
    logp, _ = token_logprobs(trainer.model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask,
                             group_size=batch.group_size)  # fmt: skip
    tok, _ = clipped_ratio_loss(logp, batch.logp_old, adv, batch.mask)
    want = aggregate(tok, batch.mask, AggregationMode.TOKEN_MEAN)
    want.backward()
    assert stats["loss"] == pytest.approx(float(want.detach()), rel=1e-9, abs=1e-12)
    for a, b in zip(got, _grads(trainer.model), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-10)


def test_model_reference_sets_the_reference_model(tmp_path: Path, tiny_dir: Path) -> None:
    """``model.reference`` (ExOPD's teacher-base) replaces the initial policy as the source of ``logp_ref``."""
    refs = {}
    for reference in (None, str(tiny_dir)):
        run = small_config(algorithm={"method": "exopd"}, model={"teacher": str(tiny_dir), "reference": reference})
        batch, _ = build_trainer(run, tmp_path / str(reference is None)).rollout()
        assert batch.logp_ref is not None and batch.logp_teacher is not None
        refs[reference is None] = torch.equal(batch.logp_ref, batch.logp_teacher)
    assert refs == {True: False, False: True}  # the SFT'd initial policy differs from the teacher's weights


@pytest.mark.slow
def test_opd_then_rl_distils_then_keeps_training(tmp_path: Path) -> None:
    """Teacher = the tiny model after 60 SFT steps; student = the same init after 5; OPD for 10 steps, GRPO for 10.

    Held-out mean reward over 64 prompts x 8 samples (standard error ~0.01 near 0.05); the same margin
    as the OPD test in test_distill_algorithm.py (>= 0.03, about 3 standard errors).
    """
    example = Path(__file__).resolve().parents[3] / "examples" / "tiny_cpu.yaml"
    base = ["seed=0", "checkpoint.every=0", "logging.progress=false"]
    teacher = build_trainer(load_config(example, [*base, "data.sft_steps=60", "optim.steps=1"]), tmp_path / "teacher")
    teacher_reward = teacher.evaluate()["reward_mean"]
    overrides = [*base, "data.sft_steps=5", "optim.steps=20", f"model.teacher={tmp_path / 'teacher' / 'initial'}",
                 "algorithm.method=opd_then_rl", "algorithm.options={switch_step: 10}"]  # fmt: skip
    student = build_trainer(load_config(example, overrides), tmp_path / "student")
    calls = count_fills(student, "logp_teacher")
    before = student.evaluate()["reward_mean"]
    student.fit()
    after = student.evaluate()["reward_mean"]
    print("OPD-then-RL: teacher", teacher_reward, "student", before, "->", after)
    assert calls == list(range(1, 11))
    assert teacher_reward > before + 0.05
    assert after - before >= 0.03
