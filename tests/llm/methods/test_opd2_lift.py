"""OPD² in the LLM trainer: the top-K batch fields, their fillers (one forward per model) and the bundle's loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators import AggregationMode, aggregate, clipped_ratio_loss, opd2_advantages
from posttrain.estimators.advantages import topk_support
from posttrain.llm.config import load_config
from posttrain.llm.methods import topk as topk_fill
from posttrain.llm.methods.topk import StudentTopK, topk_logp_filler
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.rollout.tasks import make_task
from posttrain.llm.run import build_trainer
from posttrain.llm.train.sft import sft_warmup
from tests.llm._lift import small_config
from tests.llm.methods.test_algorithm import _grads, _trainer
from tests.llm.methods.test_distill import _batch as distill_batch
from tests.llm.methods.test_distill_lift import _perturbed

K_SUPPORT = 4  # below the tiny vocabulary, so the sampled id is sometimes forced into the last column
TAU = 0.7


def _batch(k: int = 3, **fields: Any) -> RolloutBatch:
    """test_distill_algorithm's [4, 5] batch with a random top-``k`` support and student log-probs on it."""
    g = torch.Generator().manual_seed(1)
    b, t = 4, 5
    support = {
        "topk_ids": torch.randint(4, 20, (b, t, k), generator=g),
        "topk_logp_old": -torch.rand(b, t, k, generator=g),
    }
    return distill_batch().replace(**{**support, **fields})


def test_topk_fields_are_validated_and_sliced() -> None:
    batch = _batch()
    part = batch.rows(2, 4)
    assert part.topk_ids is not None and part.topk_logp_old is not None
    assert torch.equal(part.topk_logp_old, batch.topk_logp_old[2:4])  # type: ignore[index]
    with pytest.raises(ShapeError, match="topk_ids: expected an integer dtype"):
        _batch().replace(topk_ids=torch.zeros(4, 5, 3))
    with pytest.raises(ShapeError, match="topk_logp_ref: expected shape \\[4, 5, 3\\]"):
        _batch(topk_logp_ref=torch.zeros(4, 5, 2))
    with pytest.raises(ShapeError, match="topk_ids: expected shape \\[4, 5, K\\]"):
        _batch().replace(topk_ids=torch.zeros(4, 6, 3, dtype=torch.long), topk_logp_old=None)
    with pytest.raises(ShapeError, match="topk_logp_teacher"):
        _batch(topk_logp_teacher=torch.zeros(4, 5))
    bad = torch.zeros(4, 5, 3)
    bad[0, 0, 1] = float("nan")
    with pytest.raises(DomainError, match="topk_logp_teacher: expected finite"):
        _batch(topk_logp_teacher=bad)
    bad[0, 0, 1], bad[1, 4, 0] = 0.0, float("inf")  # row 1 is padded from position 3: not checked there
    assert _batch(topk_logp_teacher=bad).topk_logp_teacher is bad


def _reference_log_softmax(model: Any, batch: RolloutBatch) -> list[torch.Tensor]:
    """Per row, unpadded prompt + response through ``model``: ``[n_i, V]`` log-softmax at TAU (a loop, no padding)."""
    out = []
    for i in range(batch.batch_size):
        prompt = batch.prompt_ids[i][batch.prompt_mask[i]]
        resp = batch.response_ids[i][batch.mask[i]]
        logits = model(input_ids=torch.cat([prompt, resp]).unsqueeze(0)).logits[0]
        out.append(torch.log_softmax(logits[prompt.numel() - 1 : -1] / TAU, dim=-1))
    return out


def test_opd2_loss_equals_the_estimator_by_hand(tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """float64 tiny models; the reference recomputes every log-prob row by row without padding."""
    options: dict[str, Any] = {"scale": 0.5, "bias": 0.01}
    teacher, base = _perturbed(tiny[0], 0.2, 0), _perturbed(tiny[0], 0.1, 100)
    tiny[0].double()
    student = StudentTopK(tiny[0], k=K_SUPPORT, temperature=TAU)
    fillers = {
        "topk_ids": student.ids,
        "topk_logp_old": student.logp,
        "topk_logp_teacher": topk_logp_filler(teacher, temperature=TAU, field="topk_logp_teacher"),
        "topk_logp_ref": topk_logp_filler(base, temperature=TAU, field="topk_logp_ref"),
    }
    trainer = _trainer(tiny, {"method": "opd2", "options": options}, fillers=fillers)
    forwards: list[int] = []
    vocab_log_softmax = topk_fill.vocab_log_softmax

    def counting(model: Any, batch: RolloutBatch, *, temperature: float) -> torch.Tensor:
        forwards.append(id(model))
        return vocab_log_softmax(model, batch, temperature=temperature)

    monkeypatch.setattr(topk_fill, "vocab_log_softmax", counting)
    batch, _ = trainer.rollout()
    assert sorted(forwards) == sorted(map(id, (tiny[0], teacher, base)))  # one batched forward per model
    stats = trainer.accumulate_gradients(batch)
    got = _grads(trainer.model)
    trainer.model.zero_grad(set_to_none=True)

    m = batch.mask
    with torch.no_grad():
        full = [_reference_log_softmax(x, batch) for x in (tiny[0], teacher, base)]
    ids = torch.zeros(batch.topk_ids.shape, dtype=torch.long)  # type: ignore[union-attr]
    by_hand = [torch.zeros(ids.shape, dtype=torch.float64) for _ in full]
    sampled = [torch.zeros(m.shape, dtype=torch.float64) for _ in full]
    for i in range(batch.batch_size):
        resp = batch.response_ids[i][m[i]]
        ids[i, m[i]] = topk_support(full[0][i].unsqueeze(0), resp.unsqueeze(0), k=K_SUPPORT)[0]
        for j, rows in enumerate(full):
            by_hand[j][i, m[i]] = rows[i].gather(-1, ids[i, m[i]])
            sampled[j][i, m[i]] = rows[i].gather(-1, resp.unsqueeze(-1)).squeeze(-1)
    assert torch.equal(batch.topk_ids[m], ids[m])  # type: ignore[index]
    assert bool((ids[m] == batch.response_ids[m].unsqueeze(-1)).any(-1).all())
    for field, want in zip(("topk_logp_old", "topk_logp_teacher", "topk_logp_ref"), by_hand, strict=True):
        torch.testing.assert_close(getattr(batch, field)[m], want[m], rtol=0, atol=1e-9)
    adv = opd2_advantages(sampled[0], sampled[1], sampled[2], by_hand[0], by_hand[1], by_hand[2], m, **options)
    torch.testing.assert_close(batch.advantages, adv, rtol=0, atol=1e-9)
    assert float(adv.abs().sum()) > 0 and bool((adv[m] == -options["scale"] * options["bias"]).any())  # gate closes
    logp, _ = token_logprobs(trainer.model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, m,
                             group_size=batch.group_size)  # fmt: skip
    assert batch.logp_old is not None
    tok, _ = clipped_ratio_loss(logp, batch.logp_old, adv, m)
    want = aggregate(tok, m, AggregationMode.TOKEN_MEAN)
    want.backward()
    assert stats["loss"] == pytest.approx(float(want.detach()), rel=1e-9, abs=1e-12)
    for a, b in zip(got, _grads(trainer.model), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-10)


def test_student_fillers_share_one_forward_only_for_their_own_support(tiny: tuple[Any, Any]) -> None:
    model = tiny[0].double()
    student = StudentTopK(model, k=3, temperature=1.0)
    batch = _batch(k=3).replace(topk_ids=None, topk_logp_old=None)
    with pytest.raises(DomainError, match=r"topk_logp_old: needs batch\.topk_ids"):
        student.logp(batch)
    with torch.no_grad():
        ids = student.ids(batch)
        shared = student.logp(batch.replace(topk_ids=ids))
        other = student.logp(batch.replace(topk_ids=ids.clone()))  # not the memoised tensor: its own forward
    assert shared is not other
    torch.testing.assert_close(shared, other, rtol=0, atol=0)


def test_config_run_needs_teacher_and_fills_a_clamped_support(tmp_path: Path, tiny_dir: Path) -> None:
    algorithm = {"method": "opd2"}
    with pytest.raises(DomainError, match=r"^model\.teacher: method 'opd2' reads topk_logp_teacher"):
        small_config(algorithm=algorithm)  # at load, before a model or a run directory
    cfg = small_config(algorithm=algorithm, model={"teacher": str(tiny_dir), "reference": str(tiny_dir)})
    trainer = build_trainer(cfg, tmp_path / "run")
    batch, _ = trainer.rollout()
    vocab = trainer.policy.config.vocab_size
    assert cfg.algorithm.topk > vocab and batch.topk_ids is not None
    assert batch.topk_ids.shape == (*batch.mask.shape, vocab)  # K = min(algorithm.topk, V): every id
    assert batch.advantages is not None and float(batch.advantages.abs().sum()) == 0.0  # teacher == base: no delta


@pytest.mark.slow
def test_opd2_distils_the_teacher_delta(tmp_path: Path) -> None:
    """Teacher-base = the tiny model after 20 SFT steps; teacher = it after 40 more; student = the init after 5.

    Spec-13 defaults (scale 0.1, gate and centering on, token-mean); K = the whole 54-token vocabulary (algorithm.topk clamped).

    Held-out mean reward over 64 prompts x 8 samples (standard error ~0.01 near 0.05); the same
    margin as the OPD test in test_distill_algorithm.py (>= 0.03, about 3 standard errors).
    """
    example = Path(__file__).resolve().parents[3] / "examples" / "tiny_cpu.yaml"
    base = ["seed=0", "checkpoint.every=0", "logging.progress=false"]
    base_run = build_trainer(load_config(example, [*base, "data.sft_steps=20", "optim.steps=1"]), tmp_path / "base")
    base_dir, teacher_dir = tmp_path / "base" / "initial", tmp_path / "teacher"
    base_reward = base_run.evaluate()["reward_mean"]
    cfg = base_run.cfg
    sft_warmup(base_run.policy, base_run.tokenizer, make_task(cfg.data.task, **cfg.data.options), steps=40,
               batch_size=cfg.data.sft_batch_size, lr=cfg.data.sft_lr, seed=1)  # fmt: skip
    base_run.policy.save_pretrained(teacher_dir)
    base_run.tokenizer.save_pretrained(teacher_dir)
    teacher_reward = base_run.evaluate()["reward_mean"]
    overrides = [*base, "data.sft_steps=5", "optim.steps=20", f"model.teacher={teacher_dir}",
                 f"model.reference={base_dir}", "algorithm.method=opd2"]  # fmt: skip
    student = build_trainer(load_config(example, overrides), tmp_path / "student")
    before = student.evaluate()["reward_mean"]
    student.fit()
    after = student.evaluate()["reward_mean"]
    print("OPD2: teacher", teacher_reward, "teacher-base", base_reward, "student", before, "->", after)
    assert teacher_reward > before + 0.05
    assert after - before >= 0.03
