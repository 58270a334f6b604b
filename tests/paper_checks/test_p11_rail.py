"""Paper check 11 (RAIL): contracts, determinism, shadow phase and the closed-gate limit."""

from __future__ import annotations

import dataclasses
import math

import torch

from posttrain.paper_checks.p11_rail import AdaptivityConfig, Config, _Env, _train, run, run_adaptivity

TINY = dataclasses.replace(Config.smoke(), steps=6, shadow_steps=3)


def test_adaptivity_smoke_contract_and_determinism() -> None:
    cfg = dataclasses.replace(AdaptivityConfig.smoke(), steps=60, freeze_step=10)
    a, b = run_adaptivity(cfg), run_adaptivity(cfg)
    assert all(math.isfinite(x) for m in a.metrics for x in m.per_seed)
    assert [m.per_seed for m in a.metrics] == [m.per_seed for m in b.metrics]


def test_end_to_end_contract_and_determinism() -> None:
    a, b = run(TINY), run(TINY)
    assert all(math.isfinite(x) for m in a.metrics for x in m.per_seed)
    assert [m.per_seed for m in a.metrics] == [m.per_seed for m in b.metrics]
    rollouts = {m.name: m.per_seed for m in a.metrics}["rollouts/prompt rail"]
    assert all(4.0 <= x <= 8.0 for x in rollouts)  # base 4 + at most the extra budget of 4


def test_shadow_phase_ignores_the_controller() -> None:
    """Before S_shadow the controller's fit (here: its ridge) cannot change any action or outcome."""
    cfg = dataclasses.replace(TINY, steps=3, shadow_steps=3)
    env = _Env(cfg)
    a = _train(cfg, env, "rail")
    b = _train(dataclasses.replace(cfg, ridge=10.0, delta=1.0), env, "rail")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_closed_gate_is_grpo_with_base_group() -> None:
    """kappa = +inf, no exploration, no shadow: no intervention, the step is GRPO with G0 = 4 rollouts."""
    cfg = dataclasses.replace(TINY, kappa=math.inf, explore=0.0, shadow_steps=0)
    env = _Env(cfg)
    rail = _train(cfg, env, "rail")
    grpo4 = _train(cfg, env, "grpo4")
    assert torch.equal(rail["rollouts"], torch.full_like(rail["rollouts"], 4.0))
    torch.testing.assert_close(rail["success"], grpo4["success"], rtol=0, atol=1e-12)


def test_group_is_the_base_rollouts_plus_every_active_branch() -> None:
    """The regression of two b = 2 interventions (slots 6-7) whose second branch lost its last rollout."""
    cfg = dataclasses.replace(TINY, seeds=3)
    env = _Env(cfg)
    for method in ("rail", "heuristic"):
        out = _train(cfg, env, method)
        assert torch.equal(out["group_size"], out["planned"]), method
    rail = _train(cfg, env, "rail")
    two = rail["interventions"] == 2
    assert bool(two.any())  # the case is exercised
    assert bool((rail["group_size"][two] == 4 + 2 + 2).all())  # two interventions fit only as b = 2 + 2


def test_each_seed_is_its_own_run() -> None:
    """Adding seeds changes no seed's trajectory: one controller and one generator set per seed."""
    small, large = dataclasses.replace(TINY, seeds=2), dataclasses.replace(TINY, seeds=3)
    for method in ("rail", "grpo8"):
        a, b = _train(small, _Env(small), method), _train(large, _Env(large), method)
        for key in a:
            assert torch.equal(
                a[key][..., :2] if a[key].ndim == 1 else a[key][:, :2],
                b[key][..., :2] if b[key].ndim == 1 else b[key][:, :2],
            ), (method, key)
