"""Spec 11 section 8: recoverability gain, recency weights, Huber controller, decision rule and budget."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.estimators import (
    controller_init,
    controller_predict,
    controller_update,
    plan_interventions,
    recoverability_gain,
)
from posttrain.estimators.selection import controller_fit, entropy_heuristic_states, huber, recency_weights

rewards = st.lists(st.floats(0, 1), min_size=1, max_size=8)
binary = st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=8)


@given(base=rewards, branch=st.lists(st.floats(0, 1), min_size=0, max_size=6))
def test_gain_is_population_variance_increase(base: list[float], branch: list[float]) -> None:
    r = torch.tensor(base, dtype=torch.float64)
    b = torch.tensor([*branch, 0.0], dtype=torch.float64)  # pad one masked slot so b = 0 is allowed
    m = torch.tensor([True] * len(branch) + [False])
    want = np.var(np.array(base + branch)) - np.var(np.array(base))
    assert abs(float(recoverability_gain(r, b, m)) - want) <= 1e-12
    if not branch:
        assert float(recoverability_gain(r, b, m)) == 0.0


@given(base=binary, n_branch=st.integers(1, 6))
def test_binary_variance_bound_and_saturated_groups(base: list[float], n_branch: int) -> None:
    r = torch.tensor(base, dtype=torch.float64)
    p = r.mean()
    assert abs(float(r.var(correction=0)) - float(p * (1 - p))) <= 1e-12 and float(p * (1 - p)) <= 0.25
    if float(p) in (0.0, 1.0):  # hopeless or saturated group: branches equal to the mean add nothing
        assert float(recoverability_gain(r, torch.full((n_branch,), float(p), dtype=torch.float64))) == 0.0


@given(
    steps=st.lists(st.integers(0, 50), min_size=1, max_size=30), gamma=st.floats(0.5, 1.0), window=st.integers(1, 40)
)
def test_recency_weights(steps: list[int], gamma: float, window: int) -> None:
    s = torch.tensor(sorted(steps))
    now = int(s.max())
    w = recency_weights(s, now, gamma=gamma, window=window)
    assert bool((w >= 0).all()) and abs(float(w.sum()) - 1.0) <= 1e-12
    inside = torch.arange(len(steps)) >= len(steps) - window
    assert bool((w[~inside] == 0).all())
    ws = w[inside]
    assert bool((ws[1:] >= ws[:-1] - 1e-15).all())  # newer (later) traces weigh at least as much


@given(e=st.floats(-5, 5), delta=st.floats(0.01, 2))
def test_huber_pieces(e: float, delta: float) -> None:
    v = float(huber(torch.tensor(e, dtype=torch.float64), delta))
    want = 0.5 * e * e if abs(e) <= delta else delta * (abs(e) - 0.5 * delta)
    assert math.isclose(v, want, rel_tol=1e-12, abs_tol=1e-15)


@settings(max_examples=20)
@given(seed=st.integers(0, 1000))
def test_fit_recovers_noise_free_linear_coefficients(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n, d, a = 200, 4, 3
    x = torch.cat([torch.ones(n, 1), torch.rand(n, d - 1, generator=g)], 1).to(torch.float64)
    beta = torch.randn(a, d, generator=g, dtype=torch.float64)
    acts = torch.randint(0, a, (n,), generator=g)
    y = (x * beta[acts]).sum(-1)
    w = torch.rand(n, generator=g, dtype=torch.float64) + 0.1
    coef = controller_fit(x, acts, y, w / w.sum(), a, delta=0.05, ridge=0.0)
    torch.testing.assert_close(coef, beta, atol=1e-6, rtol=0)


def test_controller_converges_on_a_stationary_linear_problem() -> None:
    """Online updates on noisy linear gains: prediction error on fresh contexts shrinks toward the noise level."""
    g = torch.Generator().manual_seed(0)
    d, a, noise = 4, 4, 0.01
    beta = 0.1 * torch.randn(a, d, generator=g, dtype=torch.float64)
    state = controller_init(a, d)

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.cat([torch.ones(n, 1), torch.rand(n, d - 1, generator=g)], 1).to(torch.float64)
        acts = torch.randint(0, a, (n,), generator=g)
        y = (x * beta[acts]).sum(-1) + noise * torch.randn(n, generator=g, dtype=torch.float64)
        return x, acts, y

    errors = []
    for step in range(60):
        x, acts, y = draw(32)
        pred = controller_predict(state, x).gather(-1, acts.unsqueeze(-1)).squeeze(-1)
        errors.append(float((pred - (x * beta[acts]).sum(-1)).abs().mean()))
        state = controller_update(state, x, acts, y, step, window=500, gamma=0.99, delta=0.05)
    assert state.features.shape[0] == 500
    assert np.mean(errors[-10:]) < 0.1 * np.mean(errors[:2])
    assert np.mean(errors[-10:]) < 2 * noise


def _plan(pred: torch.Tensor, **kw):  # type: ignore[no-untyped-def]
    costs = torch.tensor([2.0, 4.0, 2.0, 4.0], dtype=torch.float64)
    valid = torch.ones(pred.shape[:2], dtype=torch.bool)
    return plan_interventions(pred, costs, valid, **kw), costs


@given(
    seed=st.integers(0, 1000), p=st.integers(1, 5), s=st.integers(1, 6), budget=st.integers(0, 9), j=st.integers(0, 4)
)
def test_budget_and_per_prompt_cap(seed: int, p: int, s: int, budget: int, j: int) -> None:
    g = torch.Generator().manual_seed(seed)
    pred = torch.randn(p, s, 4, generator=g, dtype=torch.float64)
    plan, costs = _plan(pred, budget=budget, max_per_prompt=j, kappa=-1.0, explore_prob=0.3, generator=g)
    spent = torch.where(plan.active, costs[plan.action], torch.zeros((), dtype=torch.float64)).sum(-1)
    assert bool((spent <= budget).all()) and bool((plan.active.sum(-1) <= j).all())
    for row in range(p):  # a state is branched at most once
        used = plan.state[row][plan.active[row]].tolist()
        assert len(used) == len(set(used))


@given(seed=st.integers(0, 1000), p=st.integers(1, 5), s=st.integers(2, 6))
def test_gate_limits(seed: int, p: int, s: int) -> None:
    g = torch.Generator().manual_seed(seed)
    pred = torch.randn(p, s, 4, generator=g, dtype=torch.float64)
    closed, _ = _plan(pred, budget=8, max_per_prompt=4, kappa=math.inf)
    assert not bool(closed.active.any())
    const = torch.full((p, s, 4), 0.3, dtype=torch.float64)
    opened, costs = _plan(const, budget=8, max_per_prompt=4, kappa=-math.inf, cost_weight=0.0)
    spent = torch.where(opened.active, costs[opened.action], torch.zeros((), dtype=torch.float64)).sum(-1)
    # maximal: every prompt keeps intervening until no state or no affordable action is left
    assert bool(((spent == 8) | (opened.active.sum(-1) == min(s, 4))).all())


def test_utility_prefers_cheaper_actions_and_heuristic_takes_max_entropy() -> None:
    pred = torch.tensor([[[0.1, 0.1, 0.0, 0.0]]], dtype=torch.float64)
    plan, _ = _plan(pred, budget=8, max_per_prompt=1, cost_weight=0.005)
    assert plan.action.tolist() == [[0]]  # equal predicted gain: the 2-rollout action wins
    ent = torch.tensor([[0.1, 0.7, 0.3], [0.9, 0.2, 0.95]])
    valid = torch.tensor([[True, True, True], [True, True, False]])
    assert entropy_heuristic_states(ent, valid).tolist() == [1, 0]


def test_fit_rejects_bad_input_naming_the_argument() -> None:
    import pytest

    from posttrain.errors import DomainError, ShapeError

    x, acts, y, w = torch.randn(5, 2), torch.tensor([0, 1, 0, 1, 2]), torch.randn(5), torch.ones(5)
    controller_fit(x, acts, y, w, 3)  # valid
    cases = [
        ((x, acts.float(), y, w, 3), ShapeError, "actions"),
        ((x, acts[:4], y, w, 3), ShapeError, "actions"),
        ((x, acts, y[:4], w, 3), ShapeError, "gains"),
        ((x, acts, y, w.long(), 3), ShapeError, "weights"),
        ((x, acts, y, w, 2), DomainError, "actions"),
        ((x, acts, y, -w, 3), DomainError, "weights"),
        ((x, acts, y, w, 0), DomainError, "num_actions"),
    ]
    for args, error, name in cases:
        with pytest.raises(error, match=name):
            controller_fit(*args)
    with pytest.raises(DomainError, match="delta"):
        controller_fit(x, acts, y, w, 3, delta=0.0)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 1000))
def test_batched_controller_is_one_controller_per_run(seed: int) -> None:
    """Runs batched on a leading axis fit, window and predict exactly as separate controllers."""
    g = torch.Generator().manual_seed(seed)
    runs, d, a, steps, m, window = 3, 3, 4, 6, 8, 20
    batched = controller_init(a, d, runs=(runs,))
    single = [controller_init(a, d) for _ in range(runs)]
    for step in range(steps):
        x = torch.rand(runs, m, d, generator=g, dtype=torch.float64)
        acts = torch.randint(0, a, (runs, m), generator=g)
        y = torch.randn(runs, m, generator=g, dtype=torch.float64)
        keep = torch.rand(runs, m, generator=g) < 0.7  # runs add different numbers of traces
        batched = controller_update(batched, x, acts, y, step, valid=keep, window=window, ridge=1e-3)
        single = [
            controller_update(c, x[r][keep[r]], acts[r][keep[r]], y[r][keep[r]], step, window=window, ridge=1e-3)
            for r, c in enumerate(single)
        ]
    probe = torch.rand(runs, 5, d, generator=g, dtype=torch.float64)
    pred = controller_predict(batched, probe)
    for r, c in enumerate(single):
        torch.testing.assert_close(batched.coef[r], c.coef, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(pred[r], controller_predict(c, probe[r]), rtol=1e-9, atol=1e-12)
        assert int(batched.valid[r].sum()) == c.features.shape[0] <= window


def test_planner_draws_of_a_run_depend_only_on_its_generator() -> None:
    pred = torch.zeros(3, 4, 5, 4, dtype=torch.float64)  # every gain 0: the gate is closed, exploration decides
    costs = torch.tensor([2.0, 4.0, 2.0, 4.0], dtype=torch.float64)
    valid = torch.ones(3, 4, 5, dtype=torch.bool)

    def plan(seeds: list[int]):  # type: ignore[no-untyped-def]
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        n = len(seeds)
        return plan_interventions(
            pred[:n], costs, valid[:n], budget=4, max_per_prompt=2, explore_prob=0.5, generator=gens
        )

    three, two = plan([1, 2, 3]), plan([1, 2])
    for field in ("state", "action", "active", "explored"):
        assert torch.equal(getattr(three, field)[:2], getattr(two, field)), field
    assert bool(three.explored.any())
