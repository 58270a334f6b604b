"""Spec 19 §8: the selection/improvement decomposition, the strategy-routing toy policy and its GRPO."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.simulators.strategy_routing import (
    ChainSpec,
    exact_accuracy,
    grpo_advantages_population_std,
    init_routing_params,
    routing,
    sample_rollouts,
    step_success,
    train_grpo_routing,
    train_sft,
    trajectory_loglik,
)
from posttrain.theory.select_improve import decompose, decompose_rollouts, forward_share, strategy_table

seeds = st.integers(0, 2**31 - 1)
F64 = torch.float64
SPEC = ChainSpec()


def _random_params(seed: int, runs: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "psi": torch.randn(runs, 2, 2, generator=g, dtype=F64),
        "a": 3 * torch.rand(runs, 2, generator=g, dtype=F64),
        "e": 2 + 6 * torch.rand(runs, 2, generator=g, dtype=F64),
    }


@given(seed=seeds, strategies=st.integers(1, 5), lead=st.integers(1, 4))
def test_decomposition_is_exact(seed: int, strategies: int, lead: int) -> None:
    g = torch.Generator().manual_seed(seed)
    pi0, pi1 = (torch.softmax(torch.randn(lead, strategies, generator=g, dtype=F64), -1) for _ in range(2))
    r0, r1 = (torch.rand(lead, strategies, generator=g, dtype=F64) for _ in range(2))
    d = decompose(pi0, r0, pi1, r1)
    torch.testing.assert_close(d.selection + d.improvement, (pi1 * r1).sum(-1) - (pi0 * r0).sum(-1), rtol=0, atol=1e-14)
    same = decompose(pi0, r0, pi0, r1)  # routing unchanged: all improvement
    assert float(same.selection.abs().max()) == 0.0


@given(seed=seeds, types=st.integers(1, 4))
def test_forward_share_is_a_convex_combination(seed: int, types: int) -> None:
    g = torch.Generator().manual_seed(seed)
    w = torch.softmax(torch.randn(types, generator=g, dtype=F64), 0)
    route = torch.softmax(torch.randn(types, 2, generator=g, dtype=F64), -1)
    f = float(forward_share(w, route))
    assert float(route[:, 0].min()) - 1e-12 <= f <= float(route[:, 0].max()) + 1e-12


@settings(max_examples=20)
@given(seed=seeds, b=st.integers(4, 200))
def test_measured_tables_reproduce_accuracy_and_decomposition(seed: int, b: int) -> None:
    """Acc(tau) = sum_s pi(s|tau) R(s,tau) on labelled rollouts; the rollout split sums to the accuracy change."""
    g = torch.Generator().manual_seed(seed)
    types = torch.cat([torch.tensor([0, 1]), torch.randint(0, 2, (b,), generator=g)])
    tables, accs = [], []
    for _ in range(2):
        strat = torch.randint(0, 3, types.shape, generator=g)  # label 2 = "other"
        correct = torch.rand(types.shape, generator=g) < 0.5
        t = strategy_table(types, strat, correct, n_types=2, n_strategies=3)
        torch.testing.assert_close(t.routing.sum(-1), torch.ones(2, dtype=F64))
        acc = torch.stack([correct[types == k].double().mean() for k in range(2)])
        torch.testing.assert_close((t.routing * t.success).sum(-1), acc, rtol=0, atol=1e-14)
        tables.append(t)
        accs.append(acc)
    d = decompose_rollouts(tables[0], tables[1])
    torch.testing.assert_close(d.selection + d.improvement, accs[1] - accs[0], rtol=0, atol=1e-14)


@given(seed=seeds)
def test_routing_normalised_and_lengths_monotone(seed: int) -> None:
    p = _random_params(seed)
    torch.testing.assert_close(routing(p).sum(-1), torch.ones(1, 2, dtype=F64))
    acc = exact_accuracy(p, SPEC, torch.arange(1, 16))
    assert bool((acc[..., 1:] <= acc[..., :-1] + 1e-15).all())  # longer chains are never easier


def test_exact_accuracy_matches_rollouts() -> None:
    """Exact Acc(tau, L) vs 20,000 simulated rollouts per (tau, L), within 4 standard errors."""
    p = _random_params(7)
    lengths = torch.tensor([3, 6, 9])
    exact = exact_accuracy(p, SPEC, lengths)[0]  # [tau, L]
    m = 20_000
    types = torch.arange(2).repeat_interleave(3 * m)[None]
    lens = lengths.repeat_interleave(m).repeat(2)[None]
    _, _, correct = sample_rollouts(p, SPEC, types, lens, [torch.Generator().manual_seed(1)])
    mc = correct[0].double().reshape(2, 3, m).mean(-1)
    se = (exact * (1 - exact) / m).sqrt()
    assert bool(((mc - exact).abs() <= 4 * se + 1e-12).all()), (mc, exact)


def test_trajectory_score_matches_closed_forms() -> None:
    """Autograd of the trajectory log-likelihood equals spec 19's four closed-form derivatives."""
    p = {k: v.requires_grad_(True) for k, v in _random_params(3).items()}
    types, lengths = torch.tensor([[0, 1, 1, 0]]), torch.tensor([[9, 8, 3, 7]])
    strategies, fail = torch.tensor([[0, 1, 0, 1]]), torch.tensor([[0, 7, 2, 6]])
    for i in range(4):
        ll = trajectory_loglik(
            p, SPEC, types[:, i : i + 1], lengths[:, i : i + 1], strategies[:, i : i + 1], fail[:, i : i + 1]
        )
        grads = torch.autograd.grad(ll.sum(), [p["psi"], p["a"], p["e"]])
        s, tau, n, tf = int(strategies[0, i]), int(types[0, i]), int(lengths[0, i]), int(fail[0, i])
        rho = torch.sigmoid(p["a"][0, s]).detach()
        ga, ge = torch.zeros((), dtype=F64), torch.zeros((), dtype=F64)
        for t in range(1, (tf if tf else n + 1)):
            q = (
                torch.sigmoid(p["e"][0, s] - SPEC.kappa * (t - SPEC.t0)).detach()
                if t > SPEC.t0
                else torch.tensor(1.0, dtype=F64)
            )
            ga = ga + (1 - rho)
            ge = ge + ((1 - q) if t > SPEC.t0 else 0.0)
        if tf:
            late = tf > SPEC.t0
            q = (
                torch.sigmoid(p["e"][0, s] - SPEC.kappa * (tf - SPEC.t0)).detach()
                if late
                else torch.tensor(1.0, dtype=F64)
            )
            ga = ga - rho * (1 - rho) * q / (1 - rho * q)
            ge = ge - (rho * q * (1 - q) / (1 - rho * q) if late else 0.0)
        gpsi = torch.zeros(2, 2, dtype=F64)
        gpsi[tau] = (
            torch.nn.functional.one_hot(torch.tensor(s), 2).double() - torch.softmax(p["psi"][0, tau], 0).detach()
        )
        torch.testing.assert_close(grads[0][0], gpsi, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(grads[1][0, s], ga, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(grads[2][0, s], ge, rtol=1e-10, atol=1e-12)
        assert float(grads[1][0, 1 - s]) == 0.0 and float(grads[2][0, 1 - s]) == 0.0


@given(rewards=st.lists(st.sampled_from([0.0, 1.0]), min_size=8, max_size=8), c=st.floats(-3, 3), k=st.floats(0.5, 4))
def test_grpo_advantages(rewards: list[float], c: float, k: float) -> None:
    r = torch.tensor([rewards], dtype=F64)
    adv = grpo_advantages_population_std(r)
    assert abs(float(adv.sum())) < 1e-9
    if len(set(rewards)) == 1:
        assert bool((adv == 0).all())
    else:
        torch.testing.assert_close(grpo_advantages_population_std(r + c), adv, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(grpo_advantages_population_std(k * r), adv, rtol=1e-5, atol=1e-5)


def test_single_strategy_sft_leaves_absent_strategy_rare() -> None:
    p = train_sft(
        init_routing_params(2), torch.tensor([[True, False], [False, True]]),
        [torch.Generator().manual_seed(s) for s in (0, 1)], steps=200,
    )  # fmt: skip
    route = routing(p)
    assert bool((route[0, :, 1] <= 0.01).all()) and bool((route[1, :, 0] <= 0.01).all())
    assert torch.equal(p["e"], init_routing_params(2)["e"])


def test_grpo_null_cases() -> None:
    """lr = 0 changes nothing; short RL chains (L <= T0) never move the long-chain skill e."""
    start = _random_params(5, runs=2)
    gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
    w = torch.full((2,), 0.5, dtype=F64)
    frozen, _ = train_grpo_routing(start, SPEC, gens, w_eval=w, lengths=(6, 9), steps=3, lr=0.0)
    for k in start:
        assert torch.equal(frozen[k], start[k])
    short, _ = train_grpo_routing(start, SPEC, gens, w_eval=w, lengths=(2, 5), steps=5)
    assert torch.equal(short["e"], start["e"]) and not torch.equal(short["psi"], start["psi"])
    assert step_success(start, SPEC).shape == (2, 2, SPEC.max_len)


def test_the_advantage_rule_is_a_parameter() -> None:
    """The default rule is GRPO's (passing it explicitly gives identical runs); another rule changes the run."""
    start = _random_params(7, runs=2)
    w = torch.full((2,), 0.5, dtype=F64)

    def go(**kw: object) -> dict[str, torch.Tensor]:
        gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
        return train_grpo_routing(start, SPEC, gens, w_eval=w, lengths=(6, 9), steps=4, **kw)[0]  # type: ignore[arg-type]

    default, explicit = go(), go(advantage=grpo_advantages_population_std)
    raw = go(advantage=lambda r: r)
    assert all(torch.equal(default[k], explicit[k]) for k in default)
    assert not torch.equal(default["e"], raw["e"])
