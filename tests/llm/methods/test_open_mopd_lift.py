"""Open-MOPD in the LLM trainer: routed teachers, whole-batch domain weights, the top-K loss and the reward refresh."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators import AggregationMode, aggregate, topk_reverse_kl_reward
from posttrain.estimators.losses import topk_distill_loss
from posttrain.estimators.weights import (
    domain_gap_magnitudes,
    domain_token_counts,
    gap_factors,
    mopd_domain_weights,
    refreshed_reward,
    route_teacher_logprobs,
    token_share_weights,
)
from posttrain.llm.config import config_from_dict, load_config
from posttrain.llm.methods.algorithm import UpdateContext
from posttrain.llm.methods.catalog import build_algorithm
from posttrain.llm.methods.teachers import routed_filler
from posttrain.llm.methods.topk import StudentTopK, topk_logp_filler
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.tasks import Problem, make_task
from posttrain.llm.run import build_trainer, train
from posttrain.llm.train.trainer import Trainer
from tests.llm.fakes import FixedEngine, TableTask
from tests.llm.methods.test_algorithm import RESPONSES, G, K, _grads
from tests.llm.methods.test_distill_lift import _perturbed
from tests.llm.methods.test_opd2_lift import TAU, _reference_log_softmax

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "open_mopd_tiny_cpu.yaml"
DOMAINS = torch.tensor([0, 1, 0]).repeat_interleave(K)  # G = 3 prompts: domains 0, 1, 0
SUPPORT = 4


class LabelledTask(TableTask):
    """`TableTask` whose prompt ``i`` belongs to domain ``i % 2``."""

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        return [Problem(p.prompt, p.answer, domain=i % 2) for i, p in enumerate(super().sample(rng, n))]


def _setup(tiny: tuple[Any, Any], options: dict[str, Any], calls: list[int] | None = None) -> tuple[Trainer, list[Any]]:
    """A float64 trainer (micro-batches of one group, 2 updates) with two perturbed teachers routed by domain."""
    model, tok = tiny
    teachers = [_perturbed(model, 0.3, 0), _perturbed(model, 0.3, 50)]
    model.double()
    torch.manual_seed(0)
    cfg = config_from_dict({  # the config names a teacher; the two routed ones are given as fillers below
        "model": {"teacher": model.name_or_path},
        "data": {"prompts_per_step": G}, "rollout": {"group_size": K, "max_new_tokens": 8, "temperature": TAU},
        "algorithm": {"method": "open_mopd", "topk": SUPPORT, "options": options},
        "optim": {"micro_batch_size": K, "max_grad_norm": None, "updates_per_batch": 2, "lr": 1e-2},
    })  # fmt: skip
    fills = [topk_logp_filler(t, temperature=TAU, field="topk_logp_teacher") for t in teachers]
    if calls is not None:
        fills = [_counting(f, calls) for f in fills]
    student = StudentTopK(model, k=SUPPORT, temperature=TAU)
    fillers = {"topk_ids": student.ids, "topk_logp_old": student.logp,
               "topk_logp_teacher": routed_filler(fills, "topk_logp_teacher")}  # fmt: skip
    alg = build_algorithm(method="open_mopd", horizon=8, options=options)
    trainer = Trainer(cfg, model=model, tokenizer=tok, task=LabelledTask(), engine=FixedEngine(model, RESPONSES),
                      algorithm=alg, sampling=cfg.rollout.sampling(), fillers=fillers)  # fmt: skip
    return trainer, teachers


def _counting(fill: Any, calls: list[int]) -> Any:
    def counted(batch: RolloutBatch) -> torch.Tensor:
        calls.append(batch.batch_size)
        return fill(batch)

    return counted


def _student_topk(model: Any, batch: RolloutBatch) -> torch.Tensor:
    """``[B, T, K]`` log-probs of ``model`` on ``batch.topk_ids``, recomputed row by row without padding (differentiable)."""
    rows = _reference_log_softmax(model, batch)
    assert batch.topk_ids is not None
    out = []
    for i, lp in enumerate(rows):
        row = torch.zeros(batch.topk_ids.shape[1:], dtype=lp.dtype)
        m = batch.mask[i]
        out.append(row.masked_scatter(m.unsqueeze(-1), lp.gather(-1, batch.topk_ids[i][m])))
    return torch.stack(out)


def _by_hand_loss(model: Any, batch: RolloutBatch, adv: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    """`topk_distill_loss` (0.2 / 0.28, c = 3), token mean, on the reference forward: the loss and its gradients."""
    model.zero_grad(set_to_none=True)
    assert batch.topk_logp_old is not None
    loss, _ = topk_distill_loss(_student_topk(model, batch), batch.topk_logp_old, adv, batch.mask)
    want = aggregate(loss, batch.mask, AggregationMode.TOKEN_MEAN)
    want.backward()
    grads = _grads(model)
    model.zero_grad(set_to_none=True)
    return float(want.detach()), grads


def _hook(trainer: Trainer, batch: RolloutBatch, state: Any, update: int) -> tuple[RolloutBatch, Any, dict[str, Any]]:
    alg = trainer.current_algorithm
    assert alg.before_update is not None
    return alg.before_update(batch, state, UpdateContext(trainer.policy, update, 0, TAU))


def _compare(trainer: Trainer, batch: RolloutBatch, adv: torch.Tensor) -> None:
    trainer.model.zero_grad(set_to_none=True)
    stats = trainer.accumulate_gradients(batch)  # micro-batches of one group
    got = _grads(trainer.model)
    want, grads = _by_hand_loss(trainer.model, batch, adv)
    assert stats["loss"] == pytest.approx(want, rel=1e-9, abs=1e-12)
    for a, b in zip(got, grads, strict=True):  # float32 rounding of the largest gradient: transformers' norms run
        # in float32 in a float64 model, and the trainer's forward sums a group's gradients before that rounding
        # (each prompt computed once) where the row-by-row reference sums them after it
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-7 * float(b.abs().max()))


def test_loss_gradients_and_domain_weights_equal_the_estimators_by_hand(tiny: tuple[Any, Any]) -> None:
    calls: list[int] = []
    trainer, teachers = _setup(tiny, {}, calls)
    batch, _ = trainer.rollout()
    m = batch.mask
    assert batch.domain is not None and torch.equal(batch.domain, DOMAINS)  # Problem.domain -> RolloutBatch.domain
    assert sorted(calls) == [K, 2 * K]  # each teacher: one forward over its own rows only
    # routing: the routed field equals route_teacher_logprobs of both teachers on every row
    every = torch.stack([topk_logp_filler(t, temperature=TAU, field="x")(batch) for t in teachers])
    assert batch.topk_logp_teacher is not None
    torch.testing.assert_close(batch.topk_logp_teacher, route_teacher_logprobs(every, DOMAINS), rtol=0, atol=0)
    assert not torch.allclose(every[0][m], every[1][m])  # the teachers differ, so routing matters
    # the domain factors by hand, over the whole batch (12 rows), before any micro-batching
    assert batch.topk_logp_old is not None
    torch.testing.assert_close(batch.topk_logp_old, _student_topk(trainer.model, batch).detach(), rtol=0, atol=1e-9)
    r = topk_reverse_kl_reward(batch.topk_logp_old, batch.topk_logp_teacher, m)
    counts = domain_token_counts(DOMAINS, m, 2)
    share = token_share_weights(DOMAINS, m, torch.ones(2, dtype=torch.float64))
    factor = gap_factors(domain_gap_magnitudes(r, m, DOMAINS, 2), counts > 0)
    n_b = m.sum(-1).double()
    w_d = (share * factor)[DOMAINS]
    w = w_d * n_b.sum() / (w_d * n_b).sum()
    assert bool((factor != 1).all()) and bool((share != 1).all())  # both factors act in this batch
    torch.testing.assert_close((w * n_b).sum() / n_b.sum(), torch.tensor(1.0, dtype=torch.float64))
    torch.testing.assert_close(w, mopd_domain_weights(DOMAINS, m, r, targets=torch.ones(2)), rtol=0, atol=1e-15)
    torch.testing.assert_close(batch.advantages, (r * w.reshape(-1, 1, 1)).sum(-1), rtol=0, atol=1e-12)
    first, state, metrics = _hook(trainer, batch, None, 0)
    torch.testing.assert_close(state[0], w, rtol=0, atol=1e-15)
    assert first.topk_advantages is not None
    torch.testing.assert_close(first.topk_advantages, r * w.reshape(-1, 1, 1), rtol=0, atol=1e-15)
    for d in (0, 1):
        assert float(metrics[f"mopd/d{d}/weight"]) == pytest.approx(float(share[d] * factor[d] * w[0] / w_d[0]))
        assert float(metrics[f"mopd/d{d}/token_share"]) == pytest.approx(float(counts[d] / counts.sum()))
    assert float(metrics["mopd/reverse_kl"]) == pytest.approx(float(-(r.sum(-1)[m]).mean()))
    _compare(trainer, first, r * w.reshape(-1, 1, 1))  # the trainer's loss and gradients, by hand


def test_refresh_recomputes_the_reward_on_the_second_update_without_the_teacher(tiny: tuple[Any, Any]) -> None:
    calls: list[int] = []
    trainer, _ = _setup(tiny, {}, calls)
    batch, _ = trainer.rollout()
    first, state, _ = _hook(trainer, batch, None, 0)
    trainer.model.zero_grad(set_to_none=True)
    trainer.accumulate_gradients(first)
    trainer.optimizer.step()  # the student moves: the rollout-time reward is stale
    n_calls = len(calls)
    second, state2, metrics = _hook(trainer, batch, state, 1)
    assert len(calls) == n_calls  # the refresh never calls a teacher
    assert batch.topk_logp_teacher is not None and second.topk_advantages is not None
    with torch.no_grad():
        now = _student_topk(trainer.model, batch)
    want = refreshed_reward(now, batch.topk_logp_teacher, batch.mask, state[0])
    torch.testing.assert_close(second.topk_advantages, want, rtol=0, atol=1e-9)
    torch.testing.assert_close(state2[0], state[0], rtol=0, atol=0)  # the weights stay those of the rollout batch
    assert first.topk_advantages is not None
    change = (want - first.topk_advantages).abs()
    assert float(change.max()) > 1e-4 and float(metrics["mopd/refresh_change"]) > 0
    _compare(trainer, second, want)  # second update: ratio vs the rollout-time student, refreshed advantage
    stale, _ = _setup(tiny, {"refresh": False})
    same, _, _ = _hook(stale, batch, state, 1)
    assert same.topk_advantages is first.topk_advantages  # refresh off: the rollout-time advantage


def test_naive_weights_are_one_and_unlabelled_rows_form_one_domain(tiny: tuple[Any, Any]) -> None:
    trainer, _ = _setup(tiny, {"balance": False})
    batch, _ = trainer.rollout()
    _, state, _ = _hook(trainer, batch, None, 0)
    assert torch.equal(state[0], torch.ones(G * K, dtype=torch.float64))
    balanced, _ = _setup(tiny, {})
    _, state, _ = _hook(balanced, batch.replace(domain=None), None, 0)
    torch.testing.assert_close(state[0], torch.ones(G * K, dtype=torch.float64), rtol=0, atol=1e-12)


def test_routing_and_batch_fields_fail_loudly(tiny: tuple[Any, Any]) -> None:
    trainer, _ = _setup(tiny, {})
    batch, _ = trainer.rollout()
    fill = trainer.fillers["topk_logp_teacher"]
    with pytest.raises(DomainError, match=r"topk_logp_teacher: routing to one of 2 teachers needs batch\.domain"):
        fill(batch.replace(domain=None))
    with pytest.raises(DomainError, match=r"domain: unknown label; expected ids in \[0, 2\)"):
        fill(batch.replace(domain=torch.full((G * K,), 2)))
    with pytest.raises(ShapeError, match="domain: expected an integer dtype"):
        batch.replace(domain=DOMAINS.float())
    with pytest.raises(DomainError, match="domain: the samples of one prompt"):
        batch.replace(domain=torch.arange(G * K))
    with pytest.raises(ShapeError, match="topk_advantages: expected the shape of topk_ids"):
        batch.replace(topk_advantages=torch.zeros(G * K, batch.mask.shape[1], SUPPORT + 1))


def _mixture(teachers: dict[str, str], strategy: str = "ddp", **model: Any) -> dict[str, Any]:
    return {
        "model": {"teachers": teachers, **model},
        "distributed": {"strategy": strategy},
        "data": {"task": "mixture", "options": {"tasks": {"addition": "addition", "multiple": "multiple"}}},
        "algorithm": {"method": "open_mopd"},
    }


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (_mixture({"addition": "a", "multiple": "m", "code": "c"}), "model.teachers.code: unknown domain"),
        (_mixture({"addition": "a"}), "model.teachers: no teacher for domain.s. multiple"),
        (_mixture({"addition": "a", "multiple": "m"}, teacher="t"), "model.teachers: set model.teacher"),
        ({"model": {"teachers": {"x": "a"}}}, "model.teachers: data.task 'multiple' labels no domain"),
        ({"algorithm": {"method": "open_mopd", "options": {"targets": [1, -1]}}}, "algorithm.options.targets"),
        ({"algorithm": {"method": "open_mopd", "options": {"gap_reference": "divide"}}}, "options.gap_reference"),
        ({"algorithm": {"method": "open_mopd", "options": {"clip_low": 2.0}}}, "clip_low"),
        ({"algorithm": {"method": "open_mopd", "options": {"alpha": 1}}}, "algorithm.options: unknown key.s. alpha"),
        ({"data": {"task": "mixture", "options": {"tasks": {"a": "addition"}, "weights": {"b": 1}}}}, "weights"),
        (
            {"data": {"task": "mixture", "options": {"tasks": {"a": "nope"}}}},
            "data.options.tasks.a: unknown task 'nope'",
        ),
        (_mixture({"addition": "a", "multiple": "m"}, strategy="fsdp"), "model.teachers: not supported"),
    ],
)
def test_config_errors_name_the_key(raw: dict[str, Any], match: str) -> None:
    with pytest.raises(DomainError, match=match):
        config_from_dict(raw)


def test_a_teacher_with_another_tokenizer_is_refused_at_load(tmp_path: Path, tiny_dir: Path) -> None:
    from posttrain.llm.tools.tiny import ALPHABET, build_tiny

    other = build_tiny(tmp_path / "other", alphabet=ALPHABET[:-3], seed=0)
    raw = _mixture({"addition": str(tiny_dir), "multiple": str(other)})
    raw["model"]["tiny"] = {"num_hidden_layers": 1}
    raw |= {"rollout": {"group_size": 2, "max_new_tokens": 2}, "logging": {"progress": False}}
    raw["data"] |= {"prompts_per_step": 2, "sft_steps": 0}
    with pytest.raises(DomainError, match=r"model\.teachers\.multiple: its tokenizer differs from the policy's"):
        build_trainer(config_from_dict(raw), tmp_path / "run")


def test_mixture_task_labels_scores_and_solves_each_domain() -> None:
    task: Any = make_task("mixture", tasks={"add": {"task": "addition", "options": {"digits": 1}}, "mul": "multiple"},
                          weights={"add": 1, "mul": 3})  # fmt: skip
    problems = task.sample(random.Random(0), 400)
    labels = [p.domain for p in problems]
    assert task.domains == ("add", "mul") and set(labels) == {0, 1}
    assert 0.65 < labels.count(1) / 400 < 0.85  # 3:1 sampler; 400 draws: 0.75 +- 0.022 (1 s.e.)
    for p in problems[:20]:
        assert ("+" in p.prompt) == (p.domain == 0)
        assert task.reward(p, task.solution(p, random.Random(1))) == 1.0


def test_example_runs_two_steps_through_train(tmp_path: Path, tiny_dir: Path) -> None:
    """The example config through `posttrain.llm.run.train` (2 steps; teachers: perturbed tiny models)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    paths = {}
    for i, name in enumerate(("addition", "multiple")):
        teacher = _perturbed(AutoModelForCausalLM.from_pretrained(tiny_dir), 0.3, 10 * i).float()
        paths[name] = tmp_path / name
        teacher.save_pretrained(paths[name])
        AutoTokenizer.from_pretrained(tiny_dir).save_pretrained(paths[name])
    sets = [f"model.teachers.{n}={p}" for n, p in paths.items()]
    sets += ["optim.steps=2", "data.sft_steps=2", "data.prompts_per_step=8", "logging.progress=false"]
    cfg = load_config(EXAMPLE, sets)
    history = train(cfg, tmp_path / "run")
    assert [h["step"] for h in history] == [1, 2]
    for key in ("mopd/reverse_kl", "mopd/d0/weight", "mopd/d1/weight", "mopd/refresh_change", "clip_frac"):
        assert all(h.get(key) is not None for h in history), key
    assert all(h["mopd/reverse_kl"] > 0 for h in history)
    initial = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "initial")
    final = AutoModelForCausalLM.from_pretrained(
        sorted((tmp_path / "run" / "checkpoints").glob("step_*"))[-1] / "model"
    )
    moved = [not torch.equal(a, b) for a, b in zip(initial.parameters(), final.parameters(), strict=True)]
    assert any(moved)
