"""Tabular autoregressive policy: enumeration is a distribution, sampling matches it (z = 5 SE)."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.errors import DomainError, ShapeError
from posttrain.simulators._base import SeedRNG
from posttrain.simulators.tabular import (
    HammingVerifier,
    TabularEnv,
    TabularSpec,
    TargetVerifier,
    boost_sequences,
    enumerate_sequences,
    sample_sequences,
    sequence_logp,
    token_logp,
)

Z = 5.0

SPECS = [
    TabularSpec(vocab=3, horizon=3),
    TabularSpec(vocab=4, horizon=3, eos=2),
    TabularSpec(vocab=3, horizon=4, eos=0, context="markov"),
]


def _table(spec: TabularSpec, g: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(
        g, spec.num_nodes, spec.vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_enumerated_probabilities_sum_to_one(spec: TabularSpec) -> None:
    tokens, _ = enumerate_sequences(spec)
    assert len({tuple(r) for r in tokens.tolist()}) == tokens.shape[0]  # distinct canonical rows
    probs = sequence_logp(spec, _table(spec)).exp()
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, dtype=torch.float64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_sampled_frequencies_match_enumeration(spec: TabularSpec) -> None:
    table = _table(spec, seed=1)
    n = 20_000
    tokens, mask, logp = sample_sequences(spec, table, n, torch.Generator().manual_seed(2))
    all_tokens, _ = enumerate_sequences(spec)
    hit = (tokens.unsqueeze(-2) == all_tokens).all(-1)  # [G, N, N_seq]
    assert bool((hit.sum(-1) == 1).all())  # every sample is one canonical sequence
    freq = hit.to(torch.float64).mean(-2)
    probs = sequence_logp(spec, table).exp()
    se = torch.sqrt(probs * (1 - probs) / n)
    assert bool(((freq - probs).abs() <= Z * se + 1e-12).all())
    # behaviour log-probs are the table's log-probs of the drawn tokens, 0 off the mask
    torch.testing.assert_close(logp, token_logp(spec, table, tokens))
    assert bool((logp[~mask] == 0).all())
    assert torch.equal(mask, spec.response_mask(tokens))


def test_expected_reward_gradient_matches_score_function_estimate() -> None:
    spec = TabularSpec(vocab=3, horizon=3)
    ver = TargetVerifier.random(spec, num_prompts=1, num_correct=3, generator=torch.Generator().manual_seed(0))
    env = TabularEnv(spec, ver)
    table = _table(spec, g=1, seed=3)
    theta = table.clone().requires_grad_(True)
    env.expected_reward(theta).sum().backward()
    assert theta.grad is not None
    n = 40_000
    roll = env.sample(table, n, torch.Generator().manual_seed(4))
    # per-sample score via one-hot counts of (node, token) visits: d log pi / d table = onehot - softmax rows
    nodes = spec.prefix_nodes(roll.tokens)  # [1, N, T]
    probs = torch.softmax(table, -1)  # [1, Nn, V]
    visits = torch.zeros(n, spec.num_nodes, spec.vocab, dtype=torch.float64)
    rows = torch.arange(n).unsqueeze(-1).expand(n, spec.horizon)
    visits.index_put_(
        (rows, nodes[0], roll.tokens[0]), torch.ones(n, spec.horizon, dtype=torch.float64), accumulate=True
    )
    node_counts = visits.sum(-1, keepdim=True)
    score = visits - node_counts * probs[0]
    samples = roll.rewards[0].reshape(n, 1, 1) * score
    mean, se = samples.mean(0), samples.std(0) / math.sqrt(n)
    assert bool(((mean - theta.grad[0]).abs() <= Z * se + 1e-10).all())


def test_metrics_targets_teacher_and_kl() -> None:
    spec = TabularSpec(vocab=4, horizon=3, eos=3)
    g = torch.Generator().manual_seed(0)
    ver = TargetVerifier.random(spec, num_prompts=2, num_correct=2, generator=g)
    env = TabularEnv(spec, ver)
    student = torch.zeros(2, spec.num_nodes, spec.vocab, dtype=torch.float64)
    teacher = boost_sequences(spec, student, ver.targets, 4.0)
    m_s, m_t = env.exact_metrics(student), env.exact_metrics(teacher)
    assert float(m_t["success"]) > float(m_s["success"])
    torch.testing.assert_close(m_s["success"], m_s["reward"])  # binary verifier
    assert bool((env.kl(student, student).abs() < 1e-12).all())
    rev, fwd = env.kl(student, teacher), env.kl(student, teacher, direction="forward")
    assert bool((rev > 0).all()) and bool((fwd > 0).all()) and not torch.allclose(rev, fwd)
    # pass@k is 1 - (1 - p)^k of the exact success probability
    p = env.success_prob(teacher)
    torch.testing.assert_close(env.exact_metrics(teacher)["pass@8"], (1 - (1 - p) ** 8).mean())


def test_hamming_reward_is_fraction_matched() -> None:
    ver = HammingVerifier(torch.tensor([[1, 2, 0]]))
    r = ver(torch.tensor([[[1, 2, 0], [1, 0, 0], [2, 0, 1]]]), torch.ones(1, 3, 3, dtype=torch.bool))
    assert r.tolist() == [[1.0, 2 / 3, 0.0]]


def test_seed_batching_and_bad_inputs() -> None:
    spec = SPECS[1]
    table = _table(spec).expand(2, 2, spec.num_nodes, spec.vocab)
    both = sample_sequences(spec, table, 5, SeedRNG.from_seeds([1, 2]))[0]
    alone = sample_sequences(spec, table[1:], 5, SeedRNG.from_seeds([2]))[0]
    assert torch.equal(both[1], alone[0])
    with pytest.raises(ShapeError, match="table"):
        token_logp(spec, table[..., :2], both)
    with pytest.raises(DomainError, match="V\\^T"):
        enumerate_sequences(TabularSpec(vocab=20, horizon=5))


def test_exact_kl_and_entropy_match_monte_carlo() -> None:
    spec = TabularSpec(vocab=3, horizon=3, eos=2)
    env = TabularEnv(
        spec, TargetVerifier.random(spec, num_prompts=2, num_correct=1, generator=torch.Generator().manual_seed(0))
    )
    student, teacher = _table(spec, seed=5), _table(spec, seed=6)
    n = 20_000
    tokens, _, logp = sample_sequences(spec, student, n, torch.Generator().manual_seed(7))
    seq_s = logp.sum(-1)
    seq_t = token_logp(spec, teacher, tokens).sum(-1)
    for samples, exact in ((seq_s - seq_t, env.kl(student, teacher)), (-seq_s, env.entropy(student))):
        mean, se = samples.mean(-1), samples.std(-1) / math.sqrt(n)
        assert bool(((mean - exact).abs() <= Z * se).all())
