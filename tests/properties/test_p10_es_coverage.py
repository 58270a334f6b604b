"""Spec 10 §8: ES gradient consistency from seeded noise, coverage metrics, and the multi-path bandit toy."""

from __future__ import annotations

import itertools
import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.estimators import (
    accuracy_bins,
    answer_entropy,
    antithetic_population,
    es_gradient,
    es_step,
    majority_vote_correct,
    pass_at_k,
    population_noise,
)
from posttrain.simulators.es_toys import init_params, make_bandit, train_es
from posttrain.theory.es_coverage import exact_pass_at_k, regression_progression, zero_bin_fraction

seeds = st.integers(0, 2**31 - 1)
F64 = torch.float64


@settings(max_examples=4)
@given(seed=seeds, log_sigma=st.floats(-4, 0))
def test_antithetic_seeded_gradient_consistency(seed: int, log_sigma: float) -> None:
    """Quadratic F, d = 50, 1e4 mirrored pairs from seeds: cosine >= 0.99, relative error <= 0.1, any sigma."""
    g = torch.Generator().manual_seed(seed)
    d, n, sigma = 50, 10_000, 10.0**log_sigma
    m = torch.randn(d, d, generator=g, dtype=F64)
    a, b, theta = (
        (m + m.T) / (2 * math.sqrt(d)),
        torch.randn(d, generator=g, dtype=F64),
        torch.randn(d, generator=g, dtype=F64),
    )
    pop = antithetic_population(torch.randint(0, 2**31 - 1, (n,), generator=g))
    noise = population_noise(pop, "theta", (d,), dtype=F64)  # [2n, d], signs applied
    x = theta + sigma * noise
    rewards = 0.5 * torch.einsum("pi,ij,pj->p", x, a, x) + x @ b
    grad = a @ theta + b
    est = es_gradient(rewards, noise, sigma=sigma)
    cos = float(est @ grad / (est.norm() * grad.norm()))
    assert cos >= 0.99 and float((est - grad).norm() / grad.norm()) <= 0.1
    step = es_step({"theta": theta}, pop, rewards, lr=1.0)["theta"]  # z-scored: direction only
    assert float(step @ grad / (step.norm() * grad.norm())) >= 0.99


@given(n=st.integers(1, 40), data=st.data())
def test_pass_at_k_estimator_properties(n: int, data: st.DataObject) -> None:
    c = data.draw(st.integers(0, n))
    ks = list(range(1, n + 1))
    vals = pass_at_k(n, c, ks)
    assert abs(vals[0] - c / n) < 1e-12 and vals[-1] == (1.0 if c > 0 else 0.0)
    assert all(0 <= v <= 1 for v in vals) and all(x <= y + 1e-12 for x, y in itertools.pairwise(vals))
    if c < n:
        assert all(pass_at_k(n, c + 1, k) >= v - 1e-12 for k, v in zip(ks, vals, strict=True))


def test_pass_at_k_tends_to_the_exact_formula() -> None:
    for frac, k in ((0.1, 5), (0.37, 20), (0.8, 3)):
        c = int(frac * 100_000)
        assert abs(float(pass_at_k(100_000, c, k)) - float(exact_pass_at_k(torch.tensor(frac, dtype=F64), k=k))) < 1e-3


@given(seed=seeds, x=st.integers(1, 50), n=st.integers(1, 64))
def test_regression_progression_and_bins(seed: int, x: int, n: int) -> None:
    g = torch.Generator().manual_seed(seed)
    p0, p = torch.rand(x, generator=g, dtype=F64), torch.rand(x, generator=g, dtype=F64)
    reg, prog, w = regression_progression(p0, p, n=n)
    assert float(reg) >= 0 and float(prog) >= 0 and bool((w >= 0).all())
    self_reg, self_prog, _ = regression_progression(p, p, n=n)
    assert abs(float(self_reg - self_prog)) < 1e-12
    reg_back, prog_back, _ = regression_progression(p, p0, n=n)  # swapping the roles swaps the counts
    assert abs(float(reg - prog_back)) < 1e-12 and abs(float(prog - reg_back)) < 1e-12
    assert 0 <= float(zero_bin_fraction(p, n=n)) <= 1 and float(zero_bin_fraction(torch.ones(x, dtype=F64), n=n)) == 0


def test_bandit_exact_success_matches_monte_carlo() -> None:
    """Exact p(x) of the multi-path bandit vs 20,000 sampled paths per prompt, within 4 standard errors."""
    env = make_bandit([3], n_prompts=16)
    params = {"b": torch.randn(1, 8, dtype=F64), "W": torch.randn(1, 8, 16, dtype=F64)}
    exact = env.success(params, temperature=0.6)[0]  # [X]
    probs = torch.softmax(env.logits(params)[0] / 0.6, -1)
    draws = torch.multinomial(probs, 20_000, replacement=True, generator=torch.Generator().manual_seed(0))
    mc = env.correct[0].gather(-1, draws).double().mean(-1)
    se = (exact * (1 - exact) / 20_000).sqrt()
    assert bool(((mc - exact).abs() <= 4 * se + 1e-12).all())


def test_bandit_types_and_base_policy() -> None:
    env = make_bandit([0, 1], n_prompts=4000)
    first, second = env.correct[..., :4].any(-1), env.correct[..., 4:].any(-1)
    assert not bool((first & second).any())  # a prompt is solvable by one path family only
    frac_a = (~env.correct[..., 4:].any(-1) & env.correct[..., :4].any(-1)).double().mean()
    assert abs(float(frac_a) - 0.8 * (1 - 0.4**4)) < 0.03  # P(A) * P(some type-A path correct)
    base = init_params(env)
    torch.testing.assert_close(env.logits(base), env.zeta)


def test_es_training_is_seedwise_and_batched_equals_alone() -> None:
    """Seed 1 trained alone equals seed 1 trained batched with seed 0 (independent generators per seed)."""
    both = make_bandit([0, 1], n_prompts=64)
    alone = make_bandit([1], n_prompts=64)

    def gens(seeds: list[int]) -> list[torch.Generator]:
        return [torch.Generator().manual_seed(100 + s) for s in seeds]

    p_both = train_es(both, init_params(both), [0, 1], gens([0, 1]), steps=3, batch=8, population=6)
    p_alone = train_es(alone, init_params(alone), [1], gens([1]), steps=3, batch=8, population=6)
    for k in p_both:
        torch.testing.assert_close(p_both[k][1], p_alone[k][0], rtol=0, atol=0)
    assert float(p_both["b"].abs().sum()) > 0


@given(seed=seeds, x=st.integers(1, 30), n=st.integers(1, 16), width=st.sampled_from([0.1, 0.25, 0.5, 1.0]))
def test_accuracy_bins(seed: int, x: int, n: int, width: float) -> None:
    g = torch.Generator().manual_seed(seed)
    correct = torch.rand(x, n, generator=g) < torch.rand(x, 1, generator=g)
    bins = accuracy_bins(correct, width=width)
    assert int(bins.sum()) == x and int(bins[0]) == int((correct.sum(-1) == 0).sum())
    assert int(bins[-1]) == int(correct.all(-1).sum())


@given(seed=seeds, x=st.integers(1, 10), n=st.integers(1, 12), labels=st.integers(1, 6))
def test_answer_entropy_bounds(seed: int, x: int, n: int, labels: int) -> None:
    g = torch.Generator().manual_seed(seed)
    answers = torch.randint(-1, labels, (x, n), generator=g)
    h = answer_entropy(answers)
    for row, hx in zip(answers, h.tolist(), strict=True):
        uniq = set(row[row >= 0].tolist())
        assert -1e-12 <= hx <= math.log(max(len(uniq), 1)) + 1e-12
        assert (abs(hx) < 1e-12) == (len(uniq) <= 1)


@given(seed=seeds, x=st.integers(1, 10), n=st.integers(1, 12), data=st.data())
def test_majority_vote_relabelling_and_all_correct(seed: int, x: int, n: int, data: st.DataObject) -> None:
    g = torch.Generator().manual_seed(seed)
    answers = torch.randint(-1, 5, (x, n), generator=g)
    gold = torch.randint(0, 5, (x,), generator=g)
    k = data.draw(st.integers(1, n))
    base = majority_vote_correct(answers, gold, k=k)
    perm = torch.randperm(100, generator=g) + 10  # wrong answers -> new distinct labels, gold kept
    relabelled = torch.where((answers >= 0) & (answers != gold[:, None]), perm[answers.clamp_min(0)], answers)
    assert torch.equal(majority_vote_correct(relabelled, gold, k=k), base)
    assert bool(majority_vote_correct(gold[:, None].expand(x, n).contiguous(), gold, k=k).all())
