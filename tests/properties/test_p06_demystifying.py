"""Spec 06 section 8: rewards, edit distance, GRPO advantages, entropy lens, prior mass (hypothesis).

Monte Carlo statements are checked within Z = 4 standard errors.
"""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.estimators import entropy_lens, group_normalized_advantages, token_entropy
from posttrain.simulators.demystify import (
    PRM_WEIGHTS,
    TargetTask,
    dense_edit_reward,
    edit_distance,
    prior_mass,
    process_reward,
    sparse_target_reward,
)
from posttrain.simulators.tabular import sample_sequences

Z = 4.0
strings = st.lists(st.integers(0, 3), min_size=0, max_size=7)


def _lev(a: list[int], b: list[int]) -> int:
    """Textbook dynamic programme (the reference)."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return d[len(a)][len(b)]


def _pad(xs: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    toks = torch.tensor([x + [9] * (width - len(x)) for x in xs], dtype=torch.long).reshape(len(xs), width)
    return toks, torch.tensor([len(x) for x in xs], dtype=torch.long)


def _dist(a: list[int], b: list[int]) -> int:
    (ta, la), (tb, lb) = _pad([a], 8), _pad([b], 8)
    return int(edit_distance(ta, la, tb, lb)[0])


@given(a=strings, b=strings, c=strings)
def test_edit_distance_is_a_metric_and_matches_the_reference(a: list[int], b: list[int], c: list[int]) -> None:
    d_ab = _dist(a, b)
    assert d_ab == _lev(a, b)
    assert _dist(a, a) == 0
    assert d_ab == _dist(b, a)
    assert _dist(a, c) <= d_ab + _dist(b, c)
    assert abs(len(a) - len(b)) <= d_ab <= max(len(a), len(b))


@settings(max_examples=20)
@given(batch=st.lists(st.tuples(strings, strings), min_size=1, max_size=6))
def test_edit_distance_batched_equals_one_at_a_time(batch: list[tuple[list[int], list[int]]]) -> None:
    (ta, la), (tb, lb) = _pad([x for x, _ in batch], 7), _pad([y for _, y in batch], 7)
    assert edit_distance(ta, la, tb, lb).tolist() == [_lev(x, y) for x, y in batch]


@given(y=strings, tau=st.lists(st.integers(0, 3), min_size=1, max_size=4))
def test_dense_and_sparse_reward_ranges(y: list[int], tau: list[int]) -> None:
    ty, ly = _pad([y], 8)
    target = torch.tensor(tau)
    dense = float(dense_edit_reward(ty, ly, target)[0])
    assert 0.0 <= dense <= 1.0
    assert (dense == 1.0) == (y == tau)
    sparse = float(sparse_target_reward(ty, ly, target, max_len=8)[0])
    contains = any(y[i : i + len(tau)] == tau for i in range(len(y) - len(tau) + 1))
    assert (sparse > 0) == contains
    assert sparse == 0.0 or 0.5 <= sparse <= 1.0
    assert (sparse == 1.0) == (y == tau)


@given(tau=st.lists(st.integers(0, 3), min_size=1, max_size=3), extra=st.lists(st.integers(0, 3), max_size=5))
def test_sparse_reward_non_increasing_in_extra_tokens(tau: list[int], extra: list[int]) -> None:
    ys = [tau + extra[:i] for i in range(len(extra) + 1)]
    ty, ly = _pad(ys, 8)
    r = sparse_target_reward(ty, ly, torch.tensor(tau), max_len=8)
    assert bool((r.diff() <= 0).all()) and float(r[0]) == 1.0


@given(
    m=st.lists(st.booleans(), min_size=5, max_size=5),
    i=st.integers(0, 4),
    answer=st.integers(100, 120),
    looped=st.booleans(),
    boxed=st.booleans(),
)
def test_process_reward_properties(m: list[bool], i: int, answer: int, looped: bool, boxed: bool) -> None:
    assert math.isclose(sum(PRM_WEIGHTS), 0.6)
    kw = {"looped": torch.tensor(looped), "boxed": torch.tensor(boxed)}
    r = float(process_reward(torch.tensor(m), torch.tensor(answer), **kw))
    assert 0.0 <= r <= 1.0
    raised = list(m)
    raised[i] = True
    assert float(process_reward(torch.tensor(raised), torch.tensor(answer), **kw)) >= r
    clean = {"looped": torch.tensor(False), "boxed": torch.tensor(True)}
    assert float(process_reward(torch.tensor(m), torch.tensor(117), **clean)) == 1.0
    assert float(process_reward(torch.tensor(m), torch.tensor(118), **clean)) == 0.6


@given(seed=st.integers(0, 2**31 - 1), a=st.floats(0.1, 10), b=st.floats(-5, 5))
def test_grpo_advantages_zero_mean_affine_invariant_and_zero_for_ties(seed: int, a: float, b: float) -> None:
    r = torch.rand(4, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    adv = group_normalized_advantages(r)
    torch.testing.assert_close(adv.sum(-1), torch.zeros(4, dtype=torch.float64), rtol=0, atol=1e-10)
    # affine maps change only the eps in sigma + eps: compare with a relative tolerance of that size
    torch.testing.assert_close(group_normalized_advantages(a * r + b), adv, rtol=1e-4, atol=1e-4)
    assert bool((group_normalized_advantages(torch.full((2, 8), b, dtype=torch.float64)) == 0).all())


def test_random_rewards_give_zero_conditional_advantage_and_zero_expected_update() -> None:
    """E[A | y] = 0 and the unclipped REINFORCE logit update has mean zero (two-way softmax)."""
    g = torch.Generator().manual_seed(5)
    n, k, p = 40_000, 8, 0.7
    picks = torch.rand(n, k, generator=g, dtype=torch.float64) < p
    adv = group_normalized_advantages(torch.rand(n, k, generator=g, dtype=torch.float64))
    sel = adv[picks]
    assert abs(float(sel.mean())) <= Z * float(sel.std()) / math.sqrt(sel.numel())
    update = (adv * (picks.to(torch.float64) - p)).mean(-1)  # d log pi / d theta = 1[A] - p(A)
    assert abs(float(update.mean())) <= Z * float(update.std()) / math.sqrt(n)


@given(seed=st.integers(0, 2**31 - 1), v=st.integers(2, 9), scale=st.floats(0.0, 20.0))
def test_entropy_lens_bounds_and_loop(seed: int, v: int, scale: float) -> None:
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(3, 5, v, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, v, (3, 5), generator=g)
    mask = torch.rand(3, 5, generator=g) < 0.7
    mask[:, 0] = True
    out = entropy_lens(logits, tokens, mask)
    assert bool((out.entropy >= -1e-12).all()) and bool((out.entropy <= math.log(v) + 1e-12).all())
    assert bool((out.loglik <= 1e-12).all())
    h = token_entropy(logits)
    logp = torch.log_softmax(logits, -1)
    for b in range(3):
        pos = [t for t in range(5) if bool(mask[b, t])]
        assert math.isclose(float(out.entropy[b]), sum(float(h[b, t]) for t in pos) / len(pos), abs_tol=1e-12)
        ll = sum(float(logp[b, t, tokens[b, t]]) for t in pos) / len(pos)
        assert math.isclose(float(out.loglik[b]), ll, abs_tol=1e-12)
    one_hot = torch.full((1, 2, v), -1e4, dtype=torch.float64)
    one_hot[..., 0] = 0.0
    assert (
        float(entropy_lens(one_hot, torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool)).entropy[0])
        < 1e-12
    )


def test_prior_mass_estimate_is_within_binomial_se_of_the_exact_probability() -> None:
    task = TargetTask.make(3, (2, 0, 1, 1))
    table = torch.randn(1, 1, task.spec.num_nodes, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    exact = float(task.target_logp(table).exp()[0])
    tokens, _, _ = sample_sequences(task.spec, table, 40_000, torch.Generator().manual_seed(2))
    m, se = prior_mass((tokens == task.target).all(-1)[0, 0])
    assert abs(float(m) - exact) <= Z * math.sqrt(exact * (1 - exact) / 40_000)
    assert float(se) > 0
