"""Spec 07 section 8: OraRL's oracle-free baseline, gain, oracle advantage, selection, correction."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from posttrain.errors import DomainError
from posttrain.estimators import (
    drgrpo_advantages,
    group_normalized_advantages,
    naive_injection_advantages,
    orarl_advantages,
)
from posttrain.estimators.advantages import (
    orarl_oracle_advantage,
    orarl_policy_advantages,
    post_selection_correction,
    sign_balanced_selection,
)
from posttrain.testing import grouped_rewards, token_tensors

F64 = torch.float64


@st.composite
def oracle_groups(draw: st.DrawFn, binary: bool = False, min_n: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    rewards = draw(grouped_rewards(groups=(1, 4), k=(min_n, 16), binary=binary, low=0.0, high=1.0))
    r_star = (
        draw(token_tensors((rewards.shape[0],), low=0.01, high=1.0))
        if not binary
        else torch.ones(rewards.shape[0], dtype=F64)
    )
    return rewards, r_star


@given(oracle_groups())
def test_gamma_zero_is_the_oracle_free_baseline(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    rewards, r_star = batch
    a, g = orarl_policy_advantages(rewards, r_star, gamma=0.0)
    assert torch.equal(g, torch.ones_like(g))
    assert torch.allclose(a, rewards - rewards.mean(-1, keepdim=True), atol=1e-12)
    a2, _ = orarl_policy_advantages(rewards, r_star * 0.5, gamma=0.0)
    assert torch.equal(a, a2)  # r* does not enter without the gain


@given(oracle_groups())
def test_gain_range_and_stage_two_structure(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    rewards, r_star = batch
    a, g = orarl_policy_advantages(rewards, r_star)
    assert bool(((g >= 1) & (g <= 4)).all())
    assert torch.allclose(a.sum(-1), torch.zeros_like(g), atol=1e-6)
    c = rewards - rewards.mean(-1, keepdim=True)
    # order preserving; negatives stay negative; the largest positive stays positive
    order = rewards.argsort(-1)
    assert bool((a.gather(-1, order).diff(dim=-1) >= -1e-12).all())
    assert bool((a[c < 0] < 0).all())
    has_pos = (c > 1e-9).any(-1)
    top = a.max(-1).values
    assert bool((top[has_pos] > 0).all())


@given(grouped_rewards(groups=1, k=(2, 10), low=0.0, high=0.9, constant_groups=False), st.floats(0.0, 1.0))
def test_gain_monotone_in_oracle_reward_and_affine_invariant(rewards: torch.Tensor, shift: float) -> None:
    assume(float(rewards.std()) > 1e-2)
    mu = float(rewards.mean())
    r1 = torch.tensor([max(mu, 0.0) + 0.05], dtype=F64)
    r2 = r1 + 0.1
    _, g1 = orarl_policy_advantages(rewards, r1)
    _, g2 = orarl_policy_advantages(rewards, r2)
    assert float(g2) >= float(g1) - 1e-12
    _, g_shift = orarl_policy_advantages(rewards + shift, r1 + shift)
    _, g_scale = orarl_policy_advantages(3.0 * rewards, 3.0 * r1)
    assert torch.allclose(g_shift, g1, rtol=1e-4) and torch.allclose(g_scale, g1, rtol=1e-4)


@given(oracle_groups(binary=True))
def test_binary_rewards_keep_every_sign(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    rewards, r_star = batch
    a, _ = orarl_policy_advantages(rewards, r_star)
    c = rewards - rewards.mean(-1, keepdim=True)
    assert torch.equal(torch.sign(a[c != 0]), torch.sign(c[c != 0]))


@given(oracle_groups(), st.floats(0.1, 10.0))
def test_oracle_advantage_range_zero_set_and_scale_invariance(
    batch: tuple[torch.Tensor, torch.Tensor], lam: float
) -> None:
    rewards, r_star = batch
    a, _ = orarl_policy_advantages(rewards, r_star)
    a_star = orarl_oracle_advantage(rewards, r_star, a)
    assert not a_star.requires_grad
    assert bool(((a_star >= 0) & (a_star <= 1)).all())
    mu = rewards.mean(-1)
    assert torch.equal(a_star == 0, r_star <= mu)
    pos_max = torch.where(a > 0, a, torch.zeros((), dtype=F64)).max(-1).values
    assert bool((a_star <= torch.clamp(1.2 * pos_max, min=0.05) + 1e-12).all())
    # with kappa = 1 and the cap fixed at 1, A* = w^beta: invariant to (r, r*) -> (lam r, lam r*) up to eps / r*
    uncapped = {"kappa": 1.0, "cap_low": 1.0, "cap_high": 1.0}
    w1 = orarl_oracle_advantage(rewards, r_star, a, **uncapped)
    w2 = orarl_oracle_advantage(lam * rewards, lam * r_star, lam * a, **uncapped)
    assert torch.allclose(w1, w2, rtol=1e-5 / (min(lam, 1.0) * float(r_star.min())), atol=1e-12)


@given(st.integers(0, 10_000), st.integers(4, 12))
def test_selection_quota_fill_and_permutation(seed: int, m: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(3, m, generator=gen, dtype=F64)
    a[:, : m // 3] = torch.where(torch.rand(3, m // 3, generator=gen) < 0.5, 0.0, a[:, : m // 3])
    orc = torch.zeros(3, m, dtype=torch.bool)
    orc[torch.arange(3), torch.randint(0, m, (3,), generator=gen)] = True
    keep = sign_balanced_selection(a, orc)
    assert torch.equal(keep.sum(-1), torch.full((3,), 4)) and torch.equal(
        (keep & orc).sum(-1), torch.ones(3, dtype=torch.long)
    )
    for gi in range(3):  # reference: the rule written as a slow loop
        rows = [i for i in range(m) if not orc[gi, i]]
        pos = sorted((i for i in rows if a[gi, i] > 0), key=lambda i: (-abs(float(a[gi, i])), i))
        neg = sorted((i for i in rows if a[gi, i] < 0), key=lambda i: (-abs(float(a[gi, i])), i))
        chosen = pos[:1] + neg[:2]
        rest = sorted((i for i in rows if a[gi, i] != 0 and i not in chosen), key=lambda i: (-abs(float(a[gi, i])), i))
        zeros = [i for i in rows if a[gi, i] == 0]
        chosen = (chosen + rest + zeros)[:3]
        assert sorted(chosen) == sorted(i for i in range(m) if keep[gi, i] and not orc[gi, i])
    perm = torch.randperm(m, generator=gen)
    keep_p = sign_balanced_selection(a[:, perm], orc[:, perm])
    if bool((a.abs().unsqueeze(-1) != a.abs().unsqueeze(-2)).sum() == 3 * m * (m - 1)):  # distinct |A|
        assert torch.equal(keep_p, keep[:, perm])


def test_selection_raises_on_bad_groups() -> None:
    a = torch.randn(1, 5, dtype=F64)
    with pytest.raises(DomainError, match="is_oracle"):
        sign_balanced_selection(a, torch.zeros(1, 5, dtype=torch.bool))
    with pytest.raises(DomainError, match="q_pos"):
        sign_balanced_selection(a, torch.eye(5, dtype=torch.bool)[:1], q_pos=2)
    with pytest.raises(DomainError, match="keep"):
        sign_balanced_selection(a[:, :3], torch.eye(3, dtype=torch.bool)[:1])


@given(
    token_tensors((2, 4), low=-1.0, high=1.0),
    token_tensors((2,), low=0.0, high=1.0),
    token_tensors((2,), low=0.0, high=0.1),
)
def test_post_selection_correction(active: torch.Tensor, rms_ref: torch.Tensor, sigma: torch.Tensor) -> None:
    orc = torch.zeros(2, 4, dtype=torch.bool)
    orc[:, -1] = True
    out = post_selection_correction(active, orc, rms_ref, sigma)
    assert torch.allclose(out.mean(-1), torch.zeros(2, dtype=F64), atol=1e-6)
    assert bool((out[:, -1] >= -1e-12).all())
    plain = post_selection_correction(active, orc, rms_ref, sigma, rms_match=False)
    ratio = out.norm(dim=-1) / plain.norm(dim=-1).clamp(min=1e-12)
    nonzero = plain.norm(dim=-1) > 1e-6
    assert bool(((ratio[nonzero] >= 0.25 - 1e-9) & (ratio[nonzero] <= 1 + 1e-9)).all())
    small = sigma < 1e-3
    assert torch.allclose(out[small], plain[small])


def test_binary_exhaustive_no_sign_flip() -> None:
    patterns = torch.tensor(list(itertools.product([0.0, 1.0], repeat=8)), dtype=F64)  # [256, 8]
    out = orarl_advantages(patterns, torch.ones(256, dtype=F64))
    assert int(out.flips.sum()) == 0
    assert bool((out.advantages[:, -1] >= 0).all())
    pre, _ = orarl_policy_advantages(patterns, torch.ones(256, dtype=F64))
    c = patterns - patterns.mean(-1, keepdim=True)
    assert torch.equal(torch.sign(pre[c != 0]), torch.sign(c[c != 0]))
    fail = out.advantages[0][out.keep[0]]
    assert torch.allclose(fail, torch.tensor([-0.0125, -0.0125, -0.0125, 0.0375], dtype=F64), atol=1e-6)
    assert torch.equal(out.advantages[-1], torch.zeros(9, dtype=F64))


@given(oracle_groups())
def test_naive_inversion_characterisation(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    rewards, r_star = batch
    n = rewards.shape[1]
    naive = naive_injection_advantages(rewards, r_star)[:, :-1]
    c = rewards - rewards.mean(-1, keepdim=True)
    bound = ((r_star - rewards.mean(-1)) / (n + 1)).unsqueeze(-1)
    predicted = (c > 0) & (c <= bound)
    inverted = (c > 0) & (naive <= 0)
    clear = ((c - bound).abs() > 1e-9) & (c.abs() > 1e-9)  # away from float ties
    assert torch.equal(inverted[clear], predicted[clear])


def test_spec_example_and_reductions() -> None:
    r = torch.tensor([[0.2] * 7 + [0.28]], dtype=F64)
    out = orarl_advantages(r, torch.ones(1, dtype=F64))
    assert round(float(out.gain), 3) == 1.749
    kept = out.advantages[0][out.keep[0]]
    assert torch.allclose(kept, torch.tensor([-0.0435, -0.0435, 0.0365, 0.0505], dtype=F64), atol=1e-4)
    a, _ = orarl_policy_advantages(r, torch.ones(1, dtype=F64), gamma=0.0)
    assert torch.allclose(a, drgrpo_advantages(r))
    naive = naive_injection_advantages(r, torch.ones(1, dtype=F64))
    assert torch.allclose(naive, group_normalized_advantages(torch.cat([r, torch.ones(1, 1, dtype=F64)], -1)))
