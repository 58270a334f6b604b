"""Spec 02 section 8: headroom, drift, Proposition 2, ingress, FIFO buffer and the gated scan."""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from posttrain.estimators import headroom, policy_drift, replay_add, replay_init, replay_select
from posttrain.estimators.selection import REPLAY_RULES, ReplayBuffer, ReplayRule, mixed_outcome


class Groups:
    """C groups of K responses, T tokens: generating and current log-probs, advantages with zeros, masks."""

    def __init__(self, seed: int, c: int, k: int, t: int, drift: float):
        g = torch.Generator().manual_seed(seed)
        self.logp_gen = torch.log(torch.rand(c, k, t, generator=g, dtype=torch.float64).clamp(min=1e-6))
        self.logp = (self.logp_gen + drift * torch.randn(c, k, t, generator=g, dtype=torch.float64)).clamp(max=0.0)
        self.adv = torch.randint(-1, 2, (c, k), generator=g).to(torch.float64) * torch.rand(c, k, generator=g)
        lengths = torch.randint(1, t + 1, (c, k), generator=g)
        self.mask = torch.arange(t) < lengths.unsqueeze(-1)
        self.rewards = (torch.rand(c, k, generator=g) < 0.5).to(torch.float64)


groups = st.builds(
    Groups, seed=st.integers(0, 10_000), c=st.integers(1, 6), k=st.integers(1, 4), t=st.integers(1, 5),
    drift=st.floats(0.0, 1.0),
)  # fmt: skip


@given(x=groups)
def test_proposition_2_headroom_moves_at_most_sqrt_drift(x: Groups) -> None:
    h_cur = headroom(x.logp, x.adv, x.mask)
    h_gen = headroom(x.logp_gen, x.adv, x.mask)
    bound = policy_drift(x.logp, x.logp_gen, x.mask).sqrt()
    assert bool(((h_cur - h_gen).abs() <= bound + 1e-12).all())


@given(x=groups)
def test_corollary_2_1_ranking_preserved(x: Groups) -> None:
    h_ref = headroom(x.logp_gen, x.adv, x.mask)
    h_cur = headroom(x.logp, x.adv, x.mask)
    root = policy_drift(x.logp, x.logp_gen, x.mask).sqrt()
    premise = (h_ref.unsqueeze(1) - h_ref.unsqueeze(0)) > root.unsqueeze(1) + root.unsqueeze(0)
    conclusion = h_cur.unsqueeze(1) > h_cur.unsqueeze(0)
    assert bool((~premise | conclusion).all())


def test_corollary_premise_is_exercised() -> None:
    x = Groups(1, 6, 3, 4, drift=0.01)
    h_ref = headroom(x.logp_gen, x.adv, x.mask)
    root = policy_drift(x.logp, x.logp_gen, x.mask).sqrt()
    assert bool(((h_ref.unsqueeze(1) - h_ref.unsqueeze(0)) > root.unsqueeze(1) + root.unsqueeze(0)).any())


@given(x=groups)
def test_ranges_and_zero_cases(x: Groups) -> None:
    h = headroom(x.logp, x.adv, x.mask)
    assert bool(((h >= 0) & (h <= 1)).all())
    d = policy_drift(x.logp, x.logp_gen, x.mask)
    assert bool((d >= 0).all())
    same = torch.where(x.mask, x.logp_gen, x.logp)  # equal on valid tokens only
    assert bool((policy_drift(same, x.logp_gen, x.mask) == 0).all())
    moved = ((x.logp != x.logp_gen) & x.mask).flatten(1).any(-1)
    assert bool((d[moved] > 0).all())
    assert bool((headroom(x.logp, torch.zeros_like(x.adv), x.mask) == 0).all())


@given(x=groups)
def test_masked_tokens_never_change_scores(x: Groups) -> None:
    junk = torch.where(x.mask, torch.zeros_like(x.logp), torch.full_like(x.logp, -3.0))
    assert torch.equal(headroom(x.logp + junk, x.adv, x.mask), headroom(x.logp, x.adv, x.mask))
    assert torch.equal(policy_drift(x.logp + junk, x.logp_gen, x.mask), policy_drift(x.logp, x.logp_gen, x.mask))


@given(r=st.lists(st.lists(st.sampled_from([0.0, 0.5, 0.95, 1.0]), min_size=2, max_size=5), min_size=1, max_size=5))
def test_ingress_rule(r: list[list[float]]) -> None:
    k = min(len(row) for row in r)
    rew = torch.tensor([row[:k] for row in r], dtype=torch.float64)
    single = mixed_outcome(rew)
    assert torch.equal(single, ((rew > 0).any(-1) & (rew <= 0).any(-1)))
    equal = (rew == rew[:, :1]).all(-1)
    assert not bool((single & equal).any())  # all-equal groups never enter
    multi = mixed_outcome(rew, success_threshold=0.9)
    assert torch.equal(multi, ((rew >= 0.9).any(-1) & (rew < 0.9).any(-1)))


def _fill(steps: int, per_step: int, capacity: int, seed: int) -> ReplayBuffer:
    buf = replay_init(3, 2, dtype=torch.float64)
    for s in range(steps):
        x = Groups(seed + s, per_step, 3, 2, drift=0.0)
        buf = replay_add(
            buf, tokens=torch.zeros(per_step, 3, 2, dtype=torch.long), mask=x.mask, rewards=x.rewards,
            advantages=x.adv, logp_gen=x.logp_gen, prompt=torch.arange(per_step), step=s, capacity=capacity,
        )  # fmt: skip
        assert buf.size <= capacity
    return buf


@given(steps=st.integers(1, 6), per_step=st.integers(1, 5), capacity=st.integers(1, 8), seed=st.integers(0, 1000))
def test_buffer_fifo_and_capacity(steps: int, per_step: int, capacity: int, seed: int) -> None:
    buf = _fill(steps, per_step, capacity, seed)
    assert buf.size <= capacity
    assert bool((buf.t_gen[1:] >= buf.t_gen[:-1]).all())  # oldest first
    # Evicted groups are strictly the oldest: everything admitted after the oldest kept entry is kept.
    full = _fill(steps, per_step, 10_000, seed)
    torch.testing.assert_close(buf.h_ref, full.h_ref[full.size - buf.size :])
    assert torch.equal(buf.t_gen, full.t_gen[full.size - buf.size :])
    assert bool(mixed_outcome(full.rewards).all())


def _scan_reference(buf: ReplayBuffer, logp: torch.Tensor, k_rep: int, tau: float, rule: ReplayRule):  # type: ignore[no-untyped-def]
    """The paper's Algorithm 1 phases B-C as an obviously-correct Python walk."""
    keys = buf.h_cache.tolist()
    order = (
        sorted(range(buf.size), key=lambda i: -keys[i])
        if rule.order.value == "headroom"
        else list(range(buf.size))[::-1]
    )
    admitted, scanned = [], []
    for i in order:
        if len(admitted) >= k_rep:
            break
        scanned.append(i)
        if float(policy_drift(logp[i], buf.logp_gen[i], buf.mask[i])) <= tau:
            admitted.append(i)
    return admitted, scanned


@given(
    seed=st.integers(0, 1000), k_rep=st.integers(0, 6), log_tau=st.floats(-4, 0), drift=st.floats(0.0, 0.2),
    rule=st.sampled_from(["hdr", "naive_recency", "headroom_only", "drift_only"]),
)  # fmt: skip
def test_selection_matches_the_walk(seed: int, k_rep: int, log_tau: float, drift: float, rule: str) -> None:
    buf = _fill(3, 4, 10, seed)
    g = torch.Generator().manual_seed(seed)
    logp = (buf.logp_gen + drift * torch.randn(buf.logp_gen.shape, generator=g, dtype=torch.float64)).clamp(max=0)
    r: ReplayRule = REPLAY_RULES.get(rule)  # type: ignore[assignment]
    tau = r.threshold(10**log_tau)
    sel, new = replay_select(buf, logp, k_rep=k_rep, tau=tau, order=r.order)
    admitted, scanned = _scan_reference(buf, logp, k_rep, tau, r)
    assert sel.rows.tolist() == admitted
    assert sorted(torch.nonzero(sel.scanned).flatten().tolist()) == sorted(scanned)
    assert len(admitted) <= k_rep
    assert bool((sel.drift[sel.rows] <= tau).all())
    if r.order.value == "headroom":
        keys = buf.h_cache[sel.rows]
        assert bool((keys[1:] <= keys[:-1]).all())  # non-increasing pre-scan H_cache
    torch.testing.assert_close(new.h_cache[sel.scanned], headroom(logp, buf.advantages, buf.mask)[sel.scanned])
    assert torch.equal(new.h_cache[~sel.scanned], buf.h_cache[~sel.scanned])
    assert torch.equal(new.advantages, buf.advantages) and torch.equal(new.h_ref, buf.h_ref)  # immutable


@given(seed=st.integers(0, 1000), k_rep=st.integers(0, 6))
def test_infinite_tau_is_headroom_only_and_gate_is_monotone(seed: int, k_rep: int) -> None:
    buf = _fill(3, 4, 10, seed)
    g = torch.Generator().manual_seed(seed)
    logp = (buf.logp_gen + 0.1 * torch.randn(buf.logp_gen.shape, generator=g, dtype=torch.float64)).clamp(max=0)
    hdr, _ = replay_select(buf, logp, k_rep=k_rep, tau=math.inf)
    only = REPLAY_RULES.get("headroom_only")
    h_only, _ = replay_select(buf, logp, k_rep=k_rep, tau=only.threshold(1e-3), order=only.order)  # type: ignore[attr-defined]
    assert torch.equal(hdr.rows, h_only.rows)
    # Monotone in drift: raising every group's drift (scaling the deviation) never admits more groups.
    few, _ = replay_select(buf, buf.logp_gen + 2.0 * (logp - buf.logp_gen), k_rep=100, tau=1e-3)
    many, _ = replay_select(buf, logp, k_rep=100, tau=1e-3)
    assert bool((few.admitted <= many.admitted).all())


def test_same_step_groups_are_never_replayed() -> None:
    buf = _fill(2, 4, 10, 0)  # steps 0 and 1
    sel, _ = replay_select(buf, buf.logp_gen, k_rep=100, tau=math.inf, step=1)
    assert bool((buf.t_gen[sel.rows] < 1).all()) and sel.rows.numel() == int((buf.t_gen < 1).sum())


def test_empty_buffer_and_zero_budget_select_nothing() -> None:
    empty = replay_init(3, 2, dtype=torch.float64)
    sel, new = replay_select(empty, empty.logp_gen, k_rep=4, tau=1.0)
    assert sel.rows.numel() == 0 and new.size == 0
    buf = _fill(2, 4, 10, 0)
    sel, new = replay_select(buf, buf.logp_gen, k_rep=0, tau=1.0)
    assert sel.rows.numel() == 0 and not bool(sel.scanned.any()) and torch.equal(new.h_cache, buf.h_cache)
