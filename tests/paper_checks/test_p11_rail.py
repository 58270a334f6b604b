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
