"""Properties of the RACE FLOP accounting and fit (spec 15, section 8)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from posttrain.theory.race_fit import race_fit
from posttrain.theory.race_flops import (
    FlopSplit,
    PolicyCost,
    RewardCost,
    RewardKind,
    flops_per_step,
    learning_flops,
    search_flops,
    train_flops_per_token,
)

seeds = st.integers(0, 2**31 - 1)
policies = st.builds(
    lambda n, nl, lora, ckpt: PolicyCost(
        n, n_lora=nl if lora else 0.0, lora=lora, gradient_checkpointing=ckpt, n_layer=4, d_model=64
    ),
    st.floats(1e3, 1e10),
    st.floats(0, 1e7),
    st.booleans(),
    st.booleans(),
)
rewards = st.sampled_from(
    [
        RewardCost(),
        RewardCost(RewardKind.MODEL, n_params=7e9),
        RewardCost(RewardKind.PRM_STEPS, n_params=1e9, steps=4),
        RewardCost(RewardKind.JUDGE, n_params=3e9, judge_output_tokens=20),
    ]
)


def _batch(seed: int, g: int = 3, k: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 200, g).astype(float), rng.integers(0, 300, (g, k)).astype(float), rng.random((g, k)) < 0.6


def _step(tp, tr, trained, policy, reward, **kw):  # type: ignore[no-untyped-def]
    return flops_per_step(tp, tr, trained, policy=policy, reward=reward, **kw)


@given(seed=seeds, policy=policies, reward=rewards, att=st.booleans())
def test_additive_over_prompts_and_steps(seed: int, policy: PolicyCost, reward: RewardCost, att: bool) -> None:
    tp, tr, trained = _batch(seed)
    whole = _step(tp, tr, trained, policy, reward, count_attention=att, ref_forward=True)
    parts = FlopSplit.sum(
        _step(tp[i : i + 1], tr[i : i + 1], trained[i : i + 1], policy, reward, count_attention=att, ref_forward=True)
        for i in range(tp.size)
    )
    for a, b in ((whole.search, parts.search), (whole.learning, parts.learning), (whole.reward, parts.reward)):
        assert a == pytest.approx(b, rel=1e-12)
    assert whole.total == whole.search + whole.learning + whole.reward
    assert FlopSplit.sum([whole, whole]).total == pytest.approx(whole.scaled(2).total, rel=1e-15)


@given(seed=seeds, policy=policies, reward=rewards)
def test_fractions(seed: int, policy: PolicyCost, reward: RewardCost) -> None:
    tp, tr, trained = _batch(seed)
    s = _step(tp, tr, trained, policy, reward)
    assert 0 <= s.p <= 1 and 0 <= s.s <= 1 and 0 <= s.f <= 1
    assert s.p + s.s + s.f == pytest.approx(1.0)
    if RewardKind(reward.kind) is RewardKind.RULE:
        assert s.f == 0.0


@given(seed=seeds, policy=policies, reward=rewards, which=st.integers(0, 2), extra=st.integers(1, 50))
def test_monotone_in_token_counts(seed: int, policy: PolicyCost, reward: RewardCost, which: int, extra: int) -> None:
    tp, tr, trained = _batch(seed)
    base = _step(tp, tr, trained, policy, reward, count_attention=True)
    tp2, tr2 = tp.copy(), tr.copy()
    if which == 0:
        tp2[0] += extra
    else:
        tr2[0, which] += extra
    more = _step(tp2, tr2, trained, policy, reward, count_attention=True)
    assert more.search >= base.search and more.learning >= base.learning and more.reward >= base.reward


@given(seed=seeds, reward=rewards, factor=st.floats(1.01, 10))
def test_monotone_in_sizes_and_epochs(seed: int, reward: RewardCost, factor: float) -> None:
    tp, tr, trained = _batch(seed)
    small, big = PolicyCost(1e8, n_lora=1e5, lora=True), PolicyCost(1e8 * factor, n_lora=1e5 * factor, lora=True)
    a, b = _step(tp, tr, trained, small, reward), _step(tp, tr, trained, big, reward)
    assert b.search >= a.search and b.learning >= a.learning
    assert _step(tp, tr, trained, small, reward, epochs=2).learning >= a.learning
    if RewardKind(reward.kind) is not RewardKind.RULE:
        bigger_rm = RewardCost(
            reward.kind,
            n_params=reward.n_params * factor,
            steps=reward.steps,
            judge_output_tokens=reward.judge_output_tokens,
        )
        c = _step(tp, tr, trained, small, bigger_rm)
        assert c.reward >= a.reward and c.p <= a.p


@given(seed=seeds, policy=policies, epochs=st.integers(1, 4), old=st.booleans(), ref=st.booleans())
def test_one_more_trained_rollout_adds_exactly_its_tokens(
    seed: int, policy: PolicyCost, epochs: int, old: bool, ref: bool
) -> None:
    tp, tr, trained = _batch(seed)
    trained[0, 0] = False
    kw = dict(policy=policy, epochs=epochs, old_logp=old, ref_forward=ref)
    before = learning_flops(tp, tr, trained, **kw)  # type: ignore[arg-type]
    trained[0, 0] = True
    after = learning_flops(tp, tr, trained, **kw)  # type: ignore[arg-type]
    aux = (2 * policy.n_params + 2 * policy.n_lora) * old + 2 * policy.n_params * ref
    assert after - before == pytest.approx(
        (tp[0] + tr[0, 0]) * (epochs * train_flops_per_token(policy) + aux), rel=1e-9
    )


@given(seed=seeds, policy=policies, reward=rewards)
def test_doubling_tokens(seed: int, policy: PolicyCost, reward: RewardCost) -> None:
    tp, tr, trained = _batch(seed)
    tp, tr = tp + 1, tr + 1
    one = _step(tp, tr, trained, policy, reward)
    two = _step(2 * tp, 2 * tr, trained, policy, reward)
    assert two.search == pytest.approx(2 * one.search, rel=1e-12)
    assert two.learning == pytest.approx(2 * one.learning, rel=1e-12)
    one_a = _step(tp, tr, trained, policy, reward, count_attention=True)
    two_a = _step(2 * tp, 2 * tr, trained, policy, reward, count_attention=True)
    assert two_a.search > 2 * one_a.search
    if trained.any():
        assert two_a.learning > 2 * one_a.learning


@given(n=st.floats(1e3, 1e10), seed=seeds)
def test_conventions(n: float, seed: int) -> None:
    assert train_flops_per_token(PolicyCost(n, lora=True)) == 4 * n
    assert train_flops_per_token(PolicyCost(n)) == 6 * n
    tp, tr, _ = _batch(seed)
    k = tr.shape[1]
    shared = search_flops(tp, tr, policy=PolicyCost(n))
    separate = search_flops(tp, tr, policy=PolicyCost(n), prefix_sharing=False)
    assert separate - shared == pytest.approx(2 * n * tp.sum() * (k - 1), rel=1e-9)


@given(seed=seeds, policy=policies, reward=rewards)
def test_permutation_invariance(seed: int, policy: PolicyCost, reward: RewardCost) -> None:
    tp, tr, trained = _batch(seed)
    rng = np.random.default_rng(seed + 1)
    rows, cols = rng.permutation(tp.size), rng.permutation(tr.shape[1])
    a = _step(tp, tr, trained, policy, reward, count_attention=True)
    b = _step(tp[rows], tr[rows][:, cols], trained[rows][:, cols], policy, reward, count_attention=True)
    assert (a.search, a.learning, a.reward) == pytest.approx((b.search, b.learning, b.reward), rel=1e-12)


@given(seed=seeds, p0=st.floats(0.3, 0.9), curvature=st.floats(0.5, 3))
def test_race_quadratic_vertex_recovers_the_optimum(seed: int, p0: float, curvature: float) -> None:
    rng = np.random.default_rng(seed)
    p = np.repeat(np.linspace(0.2, 1.0, 9), 2)
    y = 1.0 - curvature * (p - p0) ** 2 + 0.002 * rng.standard_normal(p.size)
    fit = race_fit(p, y, groups=np.tile([8, 64], 9), p_thr=0.6)
    assert abs(fit.p_opt - p0) < 0.05
    if abs(p0 - 0.6) > 0.05:
        assert fit.regime == ("high-update" if p0 >= 0.6 else "low-update")
    assert set(fit.rmse_group) == set(fit.rmse_loo)
