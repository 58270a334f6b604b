"""Paper check 11 (RAIL): contracts, determinism, shadow phase, the closed-gate limit and matched budgets."""

from __future__ import annotations

import dataclasses
import math

import torch

from posttrain.paper_checks._p11_branching import Env, Method, matched_sizes, train, uniform_sizes
from posttrain.paper_checks._plans import seeds_for_share
from posttrain.paper_checks.p11_rail import AdaptivityConfig, Config, Predictor, run, run_adaptivity

TINY = dataclasses.replace(Config.smoke(), steps=6, shadow_steps=3)


def test_adaptivity_smoke_contract_and_determinism() -> None:
    cfg = dataclasses.replace(AdaptivityConfig.smoke(), steps=60, freeze_step=10)
    a, b = run_adaptivity(cfg), run_adaptivity(cfg)
    assert all(math.isfinite(x) for m in a.metrics for x in m.per_seed)
    assert [m.per_seed for m in a.metrics] == [m.per_seed for m in b.metrics]
    frozen = run_adaptivity(dataclasses.replace(cfg, substitute=((Predictor.ONLINE, Predictor.FROZEN),)))
    assert all(x == 1.0 for x in next(m.per_seed for m in frozen.metrics if m.name == "MAE ratio online/frozen"))


def test_end_to_end_contract_and_determinism() -> None:
    a, b = run(TINY), run(TINY)
    assert all(math.isfinite(x) for m in a.metrics for x in m.per_seed)
    assert [m.per_seed for m in a.metrics] == [m.per_seed for m in b.metrics]
    per = {m.name: m.per_seed for m in a.metrics}
    assert all(4.0 <= x <= 8.0 for x in per["rollouts/prompt RAIL"])  # base 4 + at most the extra budget of 4
    # the matched arm spends exactly RAIL's rollouts, seed by seed
    assert per["rollouts/prompt GRPO at RAIL's budget"] == per["rollouts/prompt RAIL"]
    series = a.extra["series"]["success against rollouts"]
    assert len(series["x"]) == len(series["lines"]["uniform GRPO"]) == len(series["lines"]["RAIL"])


def test_matched_sizes_spread_the_budget_evenly() -> None:
    sizes = torch.tensor([[[4, 8, 6, 8, 4, 4]], [[8, 8, 8, 8, 8, 8]]])
    out = matched_sizes(sizes)
    assert torch.equal(out.sum(-1), sizes.sum(-1))
    assert int((out.amax(-1) - out.amin(-1)).max()) <= 1


def test_uniform_arm_at_eight_is_grpo8() -> None:
    env = Env(TINY)
    a, b = train(TINY, env, Method.GRPO8), train(TINY, env, Method.UNIFORM, uniform_sizes(TINY, 8))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_shadow_phase_ignores_the_controller() -> None:
    """Before S_shadow the controller's fit (here: its ridge) cannot change any action or outcome."""
    cfg = dataclasses.replace(TINY, steps=3, shadow_steps=3)
    env = Env(cfg)
    a = train(cfg, env, Method.RAIL)
    b = train(dataclasses.replace(cfg, ridge=10.0, delta=1.0), env, Method.RAIL)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_closed_gate_is_grpo_with_base_group() -> None:
    """kappa = +inf, no exploration, no shadow: no intervention, the step is GRPO with G0 = 4 rollouts."""
    cfg = dataclasses.replace(TINY, kappa=math.inf, explore=0.0, shadow_steps=0)
    env = Env(cfg)
    rail = train(cfg, env, Method.RAIL)
    grpo4 = train(cfg, env, Method.GRPO4)
    assert torch.equal(rail["rollouts"], torch.full_like(rail["rollouts"], 4.0))
    torch.testing.assert_close(rail["success"], grpo4["success"], rtol=0, atol=1e-12)


def test_group_is_the_base_rollouts_plus_every_active_branch() -> None:
    """The regression of two b = 2 interventions (slots 6-7) whose second branch lost its last rollout."""
    cfg = dataclasses.replace(TINY, seeds=3)
    env = Env(cfg)
    for method in (Method.RAIL, Method.HEURISTIC):
        out = train(cfg, env, method)
        assert torch.equal(out["group_size"], out["planned"]), method
    rail = train(cfg, env, Method.RAIL)
    two = rail["interventions"] == 2
    assert bool(two.any())  # the case is exercised
    assert bool((rail["group_size"][two] == 4 + 2 + 2).all())  # two interventions fit only as b = 2 + 2


def test_each_seed_is_its_own_run() -> None:
    """Adding seeds, or starting the range later, changes no seed's trajectory."""
    small, large = dataclasses.replace(TINY, seeds=2), dataclasses.replace(TINY, seeds=3)
    shifted = dataclasses.replace(TINY, seeds=1, first_seed=1)
    for method in (Method.RAIL, Method.GRPO8):
        a, b, c = (train(cfg, Env(cfg), method) for cfg in (small, large, shifted))
        for key in a:
            sel = lambda x, i: x[..., i] if x.ndim == 1 else x[:, i]  # noqa: E731
            assert torch.equal(sel(a[key], slice(0, 2)), sel(b[key], slice(0, 2))), (method, key)
            assert torch.equal(sel(a[key], slice(1, 2)), sel(c[key], slice(0, 1))), (method, key)


def test_seed_counts_follow_the_power_plans() -> None:
    assert Config().seeds == seeds_for_share(0.8)
    assert AdaptivityConfig().seeds == seeds_for_share(0.9)
