"""Softmax bandit: exact quantities against Monte Carlo (z = 5 standard errors) and autograd."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators import pass_at_k
from posttrain.simulators import bandits as bd
from posttrain.simulators._base import SeedRNG
from posttrain.simulators.bandits import success_prob
from posttrain.theory.es_coverage import exact_pass_at_k

Z = 5.0  # tolerance in standard errors for every Monte Carlo comparison in this file


def _env_and_logits(seed: int = 0) -> tuple[bd.SoftmaxBandit, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    env = bd.SoftmaxBandit.with_correct_arms(num_prompts=3, num_arms=6, num_correct=2, generator=g)
    return env, torch.randn(3, 6, generator=g, dtype=torch.float64)


def test_success_and_reward_match_monte_carlo() -> None:
    env, logits = _env_and_logits()
    n = 20_000
    roll = env.sample(logits, n, torch.Generator().manual_seed(1))
    p = bd.success_prob(logits, env.correct)
    mc = roll.rewards.mean(-1)
    se = torch.sqrt(p * (1 - p) / n)
    assert bool(((mc - p).abs() <= Z * se).all())
    assert torch.allclose(bd.expected_reward(logits, env.rewards), p)


def test_arm_frequencies_match_softmax() -> None:
    _, logits = _env_and_logits(2)
    n = 20_000
    arms = bd.sample_arms(logits, n, torch.Generator().manual_seed(3))
    freq = torch.nn.functional.one_hot(arms, 6).to(torch.float64).mean(-2)
    probs = torch.softmax(logits, -1)
    se = torch.sqrt(probs * (1 - probs) / n)
    assert bool(((freq - probs).abs() <= Z * se + 1e-12).all())


def test_exact_gradient_matches_autograd_and_score_function_estimate() -> None:
    env, logits = _env_and_logits(4)
    theta = logits.clone().requires_grad_(True)
    bd.expected_reward(theta, env.rewards).sum().backward()
    exact = bd.reward_gradient(logits, env.rewards)
    assert theta.grad is not None
    torch.testing.assert_close(theta.grad, exact, rtol=1e-12, atol=1e-12)
    # REINFORCE estimate r (e_a - pi), averaged over n draws, per coordinate within Z standard errors
    n = 40_000
    roll = env.sample(logits, n, torch.Generator().manual_seed(5))
    score = torch.nn.functional.one_hot(roll.tokens[..., 0], 6).to(torch.float64) - torch.softmax(logits, -1).unsqueeze(
        -2
    )
    samples = roll.rewards.unsqueeze(-1) * score
    mean, se = samples.mean(-2), samples.std(-2) / math.sqrt(n)
    assert bool(((mean - exact).abs() <= Z * se + 1e-12).all())


def test_exact_pass_at_k_matches_unbiased_estimator_mean() -> None:
    env, logits = _env_and_logits(6)
    k, n, reps = 4, 16, 2_000
    roll = env.sample(logits.expand(reps, 3, 6), n, SeedRNG.from_seeds(reps))
    c = roll.rewards.sum(-1).to(torch.long)
    est = torch.as_tensor(pass_at_k(n, c, k))
    exact = exact_pass_at_k(bd.success_prob(logits, env.correct).clamp(max=1.0), k=k)
    se = est.std(0) / math.sqrt(reps)
    assert bool(((est.mean(0) - exact).abs() <= Z * se + 1e-12).all())


def test_entropy_and_kl_limits() -> None:
    uniform_logits = torch.zeros(2, 5, dtype=torch.float64)
    torch.testing.assert_close(bd.bandit_entropy(uniform_logits), torch.full((2,), math.log(5), dtype=torch.float64))
    _, logits = _env_and_logits(7)
    assert bool((bd.bandit_kl(logits, logits).abs() < 1e-12).all())
    # KL(pi || uniform) = log A - H(pi)
    torch.testing.assert_close(bd.bandit_kl(logits, torch.zeros_like(logits)), math.log(6) - bd.bandit_entropy(logits))


def test_seeds_are_independent_of_batching() -> None:
    env, logits = _env_and_logits(8)
    both = env.sample(logits.expand(2, 3, 6), 7, SeedRNG.from_seeds([10, 11]))
    alone = env.sample(logits.expand(1, 3, 6), 7, SeedRNG.from_seeds([11]))
    assert torch.equal(both.tokens[1], alone.tokens[0])
    again = env.sample(logits.expand(2, 3, 6), 7, SeedRNG.from_seeds([10, 11]))
    assert torch.equal(both.tokens, again.tokens)


def test_zero_probability_arms_are_never_sampled() -> None:
    logits = torch.tensor([[0.0, -math.inf, 0.0, -math.inf]], dtype=torch.float64)
    arms = bd.sample_arms(logits, 5_000, torch.Generator().manual_seed(0))
    assert set(arms.unique().tolist()) <= {0, 2}


def test_bad_inputs_raise() -> None:
    env, logits = _env_and_logits()
    with pytest.raises(ShapeError, match="logits"):
        bd.success_prob(logits[:, :4], env.correct)
    with pytest.raises(DomainError, match="k"):
        bd.sample_arms(logits, 0, torch.Generator())
    with pytest.raises(DomainError, match="rewards"):
        bd.SoftmaxBandit(torch.full((1, 2), 2.0, dtype=torch.float64))


def test_prior_logits_raise_success_with_boost() -> None:
    env, _ = _env_and_logits(9)
    cold = env.prior_logits(scale=0.3, generator=torch.Generator().manual_seed(0))
    warm = env.prior_logits(scale=0.3, generator=torch.Generator().manual_seed(0), boost=3.0)
    assert bool((success_prob(warm, env.correct) > success_prob(cold, env.correct)).all())
    assert env.prior_logits(scale=1.0, generator=torch.Generator(), seeds=4).shape == (4, 3, 6)
