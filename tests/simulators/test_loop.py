"""The toy loop: determinism, seed independence, agreement with a hand-written step, learning."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from posttrain.errors import DomainError
from posttrain.estimators import group_normalized_advantages
from posttrain.simulators import SeedRNG
from posttrain.simulators.bandits import SoftmaxBandit
from posttrain.simulators.loop import bundle, train
from posttrain.simulators.tabular import TabularEnv, TabularSpec, TargetVerifier


def _bandit() -> SoftmaxBandit:
    return SoftmaxBandit.with_correct_arms(
        num_prompts=4, num_arms=8, num_correct=2, generator=torch.Generator().manual_seed(0)
    )


def _sgd(lr: float) -> Callable[[list[torch.Tensor]], torch.optim.Optimizer]:
    return lambda ps: torch.optim.SGD(ps, lr=lr)


def test_same_seed_same_numbers_alone_or_batched() -> None:
    env = _bandit()
    p0 = torch.zeros(3, 4, 8, dtype=torch.float64)
    a = train(env, p0, bundle("grpo"), _sgd(0.5), steps=10, k=4, seeds=[0, 1, 2])
    b = train(env, p0, bundle("grpo"), _sgd(0.5), steps=10, k=4, seeds=[0, 1, 2])
    c = train(env, p0[:1], bundle("grpo"), _sgd(0.5), steps=10, k=4, seeds=[2])
    assert torch.equal(a.params, b.params)
    assert torch.equal(a.params[2], c.params[0])
    assert not torch.equal(a.params[0], a.params[1])


def test_one_step_equals_the_estimators_applied_by_hand() -> None:
    env = _bandit()
    p0 = torch.randn(1, 4, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    lr, k = 0.3, 6
    log = train(env, p0, bundle("grpo", "ppo_clip", "token-mean"), _sgd(lr), steps=1, k=k, seeds=[7])
    roll = env.sample(p0, k, SeedRNG.from_seeds([7], stream=0))
    adv = group_normalized_advantages(roll.rewards[0])  # [G, K]
    # token-mean of the on-policy PPO loss: gradient of -mean_{g,k} A log pi
    theta = p0.clone().requires_grad_(True)
    logp = env.token_logp(theta, roll.tokens)[0, ..., 0]
    (-(adv * logp).mean()).backward()
    assert theta.grad is not None
    torch.testing.assert_close(log.params, p0 - lr * theta.grad, rtol=1e-12, atol=1e-12)


def test_grpo_improves_exact_success_and_stop_when_records_first_hit() -> None:
    spec = TabularSpec(vocab=3, horizon=3, eos=2)
    env = TabularEnv(
        spec, TargetVerifier.random(spec, num_prompts=3, num_correct=2, generator=torch.Generator().manual_seed(0))
    )
    p0 = torch.zeros(2, 3, spec.num_nodes, 3, dtype=torch.float64)
    log = train(
        env,
        p0,
        bundle("rloo"),
        lambda ps: torch.optim.Adam(ps, lr=0.1),
        steps=200,
        k=8,
        seeds=2,
        stop_when=lambda m: m["success"] >= 0.8,
    )
    start, end = log.metrics["success"][0], log.metrics["success"][-1]
    assert bool((end > start + 0.3).all())
    assert bool((log.first_hit > 0).all()) and log.steps_run == int(log.first_hit.max())
    hits = log.metrics["success"][log.first_hit, torch.arange(2)]
    assert bool((hits >= 0.8).all())


def test_aggregate_per_seed_equals_aggregate_on_each_seed() -> None:
    from posttrain.estimators import AggregationMode, aggregate
    from posttrain.simulators.loop import aggregate_per_seed

    g = torch.Generator().manual_seed(3)
    values = torch.randn(3, 5, 4, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 5, 4, generator=g) < 0.6
    mask[:, 0, 0] = True
    mask[1, 2] = False  # an empty row
    for mode in AggregationMode:
        batched = aggregate_per_seed(values, mask, mode)
        looped = torch.stack([aggregate(values[s], mask[s], mode) for s in range(3)])
        torch.testing.assert_close(batched, looped, rtol=1e-12, atol=1e-12)


def test_grpo_surrogate_is_the_group_normalised_policy_gradient() -> None:
    from posttrain.estimators import clipped_ratio_loss
    from posttrain.simulators.loop import grpo_surrogate

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(
        3, 12, dtype=torch.float64, generator=gen, requires_grad=True
    )  # R=3 runs, N=12 = 3 groups of 4
    logp = torch.log_softmax(logits, -1)
    rewards = (torch.rand(3, 12, generator=gen) > 0.5).to(torch.float64)
    loss = grpo_surrogate(logp, rewards, group=4)
    adv = group_normalized_advantages(rewards.reshape(-1, 4)).reshape(3, 12)
    assert torch.allclose(loss, -adv)  # ratio 1: the loss value is -A
    ref, _ = clipped_ratio_loss(logp.reshape(-1, 1), logp.detach().reshape(-1, 1), adv.reshape(-1),
                                torch.ones(36, 1, dtype=torch.bool))  # fmt: skip
    assert torch.equal(loss.reshape(-1, 1), ref)
    (g,) = torch.autograd.grad(loss.mean(-1).sum(), logits, retain_graph=True)
    (g_ref,) = torch.autograd.grad(-(adv * logp).mean(-1).sum(), logits)  # REINFORCE with GRPO advantages
    assert torch.allclose(g, g_ref)
    given = grpo_surrogate(logp, advantages=adv, group=4)
    assert torch.equal(given, loss)
    with pytest.raises(DomainError, match="rewards"):
        grpo_surrogate(logp, rewards[:, :10], group=4)
