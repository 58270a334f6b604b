"""Self-Routing in the LLM trainer (``algorithm.method: self_routing``): routes, routed loss and gradients by hand."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators import (
    AggregationMode,
    aggregate,
    broadcast_sequence_advantages,
    clipped_ratio_loss,
    group_normalized_advantages,
    k3_kl,
    masked_mean,
    self_routing_probabilities,
)
from posttrain.estimators.losses import routed_loss
from posttrain.estimators.selection import RECIPES, Recipe, sample_routes
from posttrain.llm.config import config_from_dict, load_config
from posttrain.llm.methods.catalog import build_algorithm
from posttrain.llm.methods.routing import RoutingStage, queue_filler, route_batch, route_seed, teacher_contexts
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.rollout.tasks import Problem
from posttrain.llm.run import build_trainer, train
from tests.llm._lift import record_rollouts, small_config

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "self_routing_tiny_cpu.yaml"
G, K, T = 4, 4, 5


def _by_hand_losses(batch: RolloutBatch, logp: torch.Tensor, beta: float) -> torch.Tensor:
    """``[4, B, T]`` per-token losses of GRPO, OPSD, REG and SKIP on every row, from the estimators."""
    assert batch.logp_old is not None and batch.logp_teacher is not None and batch.logp_ref is not None
    a_grpo = broadcast_sequence_advantages(group_normalized_advantages(batch.grouped_rewards()), batch.mask)
    a_grpo = a_grpo.to(batch.logp_old.dtype)  # float32 from float32 rewards
    a_opsd = torch.where(batch.mask, batch.logp_teacher - batch.logp_old, 0.0)
    grpo = clipped_ratio_loss(logp, batch.logp_old, a_grpo, batch.mask)[0]
    opsd = clipped_ratio_loss(logp, batch.logp_old, a_opsd, batch.mask)[0]
    reg = beta * k3_kl(logp, batch.logp_ref)
    return torch.stack([grpo, opsd, torch.where(batch.mask, reg, 0.0), torch.zeros_like(grpo)])


def _hand_batch(seed: int) -> tuple[RolloutBatch, torch.Tensor]:
    """A float64 batch of four prompt states (mixed; all wrong, unsure; all right, sure; all wrong, sure)."""
    gen = torch.Generator().manual_seed(seed)
    b = G * K
    lengths = torch.randint(1, T + 1, (b,), generator=gen)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, *[0.0] * 4, *[1.0] * 4, *[0.0] * 4])
    mean_entropy = torch.tensor([1.0] * 4 + [3.0] * 4 + [0.1] * 4 + [0.0] * 4, dtype=torch.float64)
    mean_entropy = mean_entropy + 0.05 * torch.rand(b, generator=gen, dtype=torch.float64)

    def logps(shift: float) -> torch.Tensor:
        return torch.where(mask, -1.0 - torch.rand(b, T, generator=gen, dtype=torch.float64) + shift, 0.0)

    batch = RolloutBatch(
        prompt_ids=torch.ones(b, 2, dtype=torch.long), prompt_mask=torch.ones(b, 2, dtype=torch.bool),
        response_ids=torch.ones(b, T, dtype=torch.long), mask=mask, rewards=rewards, group_size=K,
        logp_old=logps(0.0), logp_teacher=logps(0.3), logp_ref=logps(-0.2),
    )  # fmt: skip
    return batch, mean_entropy


@pytest.mark.parametrize("seed", range(6))
def test_routed_loss_and_gradients_equal_the_estimators_by_hand(seed: int) -> None:
    """Routes from the seeded uniforms; the bundle's token loss, token-mean aggregated over the kept rows,
    equals `routed_loss` of the four recipes' losses built by hand, value and gradient (float64)."""
    batch, mean_entropy = _hand_batch(seed)
    uniforms = torch.rand(G, generator=torch.Generator().manual_seed(route_seed(seed)), dtype=torch.float64)
    routed, logs = route_batch(batch, mean_entropy, uniforms)
    probs = self_routing_probabilities(batch.grouped_rewards().double(), mean_entropy.reshape(G, K))
    routes = sample_routes(probs, uniforms)
    assert routed.route is not None and routed.route.tolist() == routes.repeat_interleave(K).tolist()
    assert [logs[f"routing/n_{r.name.lower()}"] for r in RECIPES] == [float((routes == r).sum()) for r in RECIPES]
    assert routed.kept is not None and routed.kept.tolist() == (routes != Recipe.SKIP).repeat_interleave(K).tolist()

    alg = build_algorithm(method="self_routing", horizon=T, options={"beta_reg": 0.3})
    routed = routed.replace(advantages=alg.advantage(routed))
    noise = torch.randn(batch.mask.shape, generator=torch.Generator().manual_seed(100 + seed), dtype=torch.float64)
    logp = (batch.logp_old + 0.1 * noise).requires_grad_(True)
    tok, _ = alg.token_loss(logp, None, routed)
    loss = aggregate(tok, routed.loss_mask(), AggregationMode.TOKEN_MEAN)
    want = routed_loss(_by_hand_losses(batch, logp, 0.3), routes, batch.mask)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-14)
    got_grad, want_grad = torch.autograd.grad(loss, logp)[0], torch.autograd.grad(want, logp)[0]
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-12, atol=1e-14)
    assert float(got_grad.abs().sum()) > 0 or bool((routes == Recipe.SKIP).all())


def test_every_recipe_is_routed_over_the_seeds() -> None:
    """The four prompt states of `_hand_batch` reach all four recipes (the state each is built for most often)."""
    seen = torch.zeros(G, len(RECIPES))
    for seed in range(20):
        batch, h = _hand_batch(seed)
        u = torch.rand(G, generator=torch.Generator().manual_seed(route_seed(seed)), dtype=torch.float64)
        routes = route_batch(batch, h, u)[0].route
        assert routes is not None
        seen[torch.arange(G), routes[::K]] += 1
    assert seen.argmax(dim=1).tolist() == [Recipe.GRPO, Recipe.OPSD, Recipe.REG, Recipe.SKIP]


def test_unjudged_groups_are_skipped() -> None:
    batch, h = _hand_batch(0)
    judged = torch.ones(G * K, dtype=torch.bool)
    judged[1] = False  # group 0 has an unjudged sample
    routed, logs = route_batch(batch.replace(judged=judged), h, torch.full((G,), 0.5, dtype=torch.float64))
    assert routed.route is not None and routed.route[:K].tolist() == [Recipe.SKIP] * K
    assert sum(logs[f"routing/n_{r.name.lower()}"] for r in RECIPES) == G - 1


def test_teacher_context_logp_equals_a_plain_forward_on_the_concatenated_ids(tiny: tuple[Any, Any]) -> None:
    """OPSD rows: the self-teacher scores the student's response ids right after the privileged prompt."""
    model, tok = tiny
    model.double()
    problems = [Problem("3+4=", "7"), Problem("12+9=", "21")]

    def encode(texts: list[str]) -> list[list[int]]:
        return [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]

    contexts = teacher_contexts(encode, "answer:{answer};{prompt}", lambda p: p.answer)
    stage = RoutingStage(contexts=contexts, pad_id=tok.pad_token_id)
    student = encode([p.prompt for p in problems])
    width = max(map(len, student))
    prompt_ids = torch.zeros(4, width, dtype=torch.long)
    prompt_mask = torch.zeros(4, width, dtype=torch.bool)
    for row in range(4):
        ids = student[row // 2]
        prompt_ids[row, width - len(ids) :] = torch.tensor(ids)
        prompt_mask[row, width - len(ids) :] = True
    responses = [[10, 11, 3], [12, 3, 0], [9, 3, 0], [5, 6, 7]]
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    batch = RolloutBatch(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=torch.tensor(responses), mask=mask,
        rewards=torch.zeros(4), group_size=2, route=torch.tensor([3, 3, 1, 1]),
    )  # fmt: skip
    with pytest.raises(DomainError, match="context_ids"):  # no contexts on the batch: refused, not the own prompt
        queue_filler(lambda b: torch.zeros(b.mask.shape), Recipe.OPSD, in_context=True)(batch)
    with pytest.raises(DomainError, match="problems"):
        stage._with_contexts(batch, problems[:1])
    batch = stage._with_contexts(batch, problems)  # what after_rollout adds from StepContext.problems

    def fill(b: RolloutBatch) -> torch.Tensor:
        return token_logprobs(model, b.prompt_ids, b.prompt_mask, b.response_ids, b.mask)[0]

    got = queue_filler(fill, Recipe.OPSD, in_context=True)(batch)
    assert bool((got[:2] == 0).all())  # rows routed elsewhere: no forward
    for row in (2, 3):
        teacher = encode([f"answer:{problems[1].answer};{problems[1].prompt}"])[0]
        resp = [t for t, m in zip(responses[row], mask[row].tolist(), strict=True) if m]
        ids = torch.tensor([teacher + resp])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].double()
        want = torch.log_softmax(logits, -1)[len(teacher) - 1 : -1].gather(-1, torch.tensor(resp)[:, None])[:, 0]
        torch.testing.assert_close(got[row, : len(resp)], want, rtol=1e-10, atol=1e-12)


def test_trainer_step_routes_and_gradients_equal_the_estimators_by_hand(tmp_path: Path) -> None:
    """One float64 step of the real run (micro-batches of one group): the stage's routes from the policy's
    entropies and the seeded uniforms, and the trainer's loss and gradients = `routed_loss` by hand."""
    cfg = small_config(
        algorithm={"method": "self_routing", "options": {"context_template": "answer:{answer};{prompt}"}},
        micro_batch_size=4, max_grad_norm=None,
    )  # fmt: skip
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype="float64"))
    trainer = build_trainer(cfg, tmp_path / "run")
    batches = record_rollouts(trainer)
    model, original = trainer.model, trainer.accumulate_gradients
    checked: list[dict[str, Any]] = []

    def by_hand(batch: RolloutBatch) -> dict[str, float]:
        rollout = batches[-1]
        stats = original(batch)
        got = [p.grad.detach().clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            _, ent = token_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids,
                                    rollout.mask, with_entropy=True)  # fmt: skip
        assert trainer.context is not None and ent is not None
        h = masked_mean(ent, rollout.mask, dim=-1).reshape(-1, rollout.group_size)
        u = torch.rand(h.shape[0], generator=torch.Generator().manual_seed(route_seed(trainer.context.seed)),
                       dtype=torch.float64)  # fmt: skip
        routes = sample_routes(self_routing_probabilities(rollout.grouped_rewards().double(), h), u)
        assert rollout.route is not None and rollout.route[:: rollout.group_size].tolist() == routes.tolist()
        logp, _ = token_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids, rollout.mask,
                                 group_size=rollout.group_size)  # fmt: skip
        want = routed_loss(_by_hand_losses(rollout, logp, 0.1), routes, rollout.mask)
        want.backward()
        assert stats["loss"] == pytest.approx(float(want.detach()), rel=1e-10, abs=1e-12)
        for g_got, p in zip(got, model.parameters(), strict=True):
            torch.testing.assert_close(g_got, p.grad, rtol=1e-9, atol=1e-12)
        checked.append({"routes": routes.tolist()})
        return stats

    trainer.accumulate_gradients = by_hand  # type: ignore[method-assign]
    metrics = trainer.train_step()
    assert len(checked) == 1
    counts = [metrics[f"routing/n_{r.name.lower()}"] for r in RECIPES]
    assert counts == [float(checked[0]["routes"].count(int(r))) for r in RECIPES]


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"beta_reg": -1.0}, "algorithm.options.beta_reg"),
        ({"sigma_m": 0.0}, "algorithm.options.sigma_m"),
        ({"delta_mode": "softmax"}, "algorithm.options.delta_mode"),
        ({"context_template": "{answer}"}, "algorithm.options.context_template"),
        ({"context_template": "{prompt}{gold}"}, "algorithm.options.context_template"),
        ({"context_template": "{prompt"}, "algorithm.options.context_template"),
        ({"clip_low": "wide"}, "algorithm.options.clip_low"),
        ({"router": "random"}, "algorithm.options"),
    ],
)
def test_bad_options_fail_at_load_naming_the_key(options: dict[str, Any], key: str) -> None:
    with pytest.raises(DomainError, match=key.replace(".", r"\.")):
        config_from_dict({"algorithm": {"method": "self_routing", "options": options}})


def test_batch_route_fields_are_validated() -> None:
    batch, _ = _hand_batch(0)
    with pytest.raises(ShapeError, match="route"):
        batch.replace(route=torch.zeros(G * K))
    with pytest.raises(ShapeError, match="route"):
        batch.replace(route=torch.zeros(3, dtype=torch.long))
    with pytest.raises(DomainError, match="route_weight"):
        batch.replace(route_weight=-torch.ones(G * K))


def test_example_trains_two_steps_through_run_train(tmp_path: Path) -> None:
    """The example config, shrunk, through `posttrain.llm.run.train`: it runs, weights move, routes are logged."""
    from safetensors.torch import load_file

    sets = ["optim.steps=2", "data.prompts_per_step=4", "data.sft_steps=2", "data.eval_prompts=4",
            "model.tiny.num_hidden_layers=1", "rollout.group_size=4", "rollout.max_new_tokens=3",
            "checkpoint.every=0", "logging.progress=false"]  # fmt: skip
    out = tmp_path / "run"
    history = train(load_config(EXAMPLE, sets), out)
    assert [h["step"] for h in history] == [1, 2]
    for h in history:
        assert sum(h[f"routing/n_{r.name.lower()}"] for r in RECIPES) == 4
        assert sum(h[f"routing/p_{r.name.lower()}"] for r in RECIPES) == pytest.approx(1.0, abs=1e-6)
    before = load_file(str(out / "initial" / "model.safetensors"))
    after = load_file(str(next((out / "checkpoints").glob("step_*")) / "model" / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)
