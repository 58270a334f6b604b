"""Paper check 16 (SIS): structural contract, determinism, the N = 1 identity and the seed plan."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from posttrain.paper_checks._plans import seeds_for_share
from posttrain.paper_checks.p16_sis import Config, Method, run
from posttrain.paper_checks.stats import Outcome, compare, share_detectable

TINY = dataclasses.replace(Config.smoke(), seeds=3, grad_steps=16)


def test_smoke_contract_and_on_policy_identity() -> None:
    result = run(TINY)
    assert result.metrics and result.comparisons
    assert all(math.isfinite(x) for m in result.metrics for x in m.per_seed)
    by_name = {c.name: c for c in result.comparisons}
    # at N = 1 every token is accepted and SIS is bit-identical to clipped token IS
    assert compare(by_name["SIS == PPO bit-identical at N=1 (1 = yes)"]).outcome is Outcome.HOLDS
    assert result.primary.name == "SIS - PPO, N=16"
    accept = {m.name: m.per_seed for m in result.metrics if m.name.startswith("accept")}
    assert all(x == 1.0 for x in accept["accept sis N=1"])
    assert all(x < 1.0 for x in accept["accept sis N=16"])


def test_same_seed_same_numbers_whatever_the_seed_count() -> None:
    a, b = run(TINY), run(TINY)
    assert [m.per_seed for m in a.metrics] == [m.per_seed for m in b.metrics]
    # seed s is the same run inside any seed range that contains it (the pilot seeds are separate runs)
    wide = run(dataclasses.replace(TINY, seeds=4))
    shifted = run(dataclasses.replace(TINY, seeds=2, first_seed=2))
    reward = "reward sis N=16"
    per = {r: next(m.per_seed for m in res.metrics if m.name == reward) for r, res in (("w", wide), ("s", shifted))}
    assert np.allclose(per["w"][2:], per["s"], rtol=0, atol=1e-12)


def test_exact_reward_of_the_initial_policy() -> None:
    # zero steps: the decoy-sharp start, E[r] = mean over positions of mu(target) + q mu(decoy)
    cfg = dataclasses.replace(TINY, grad_steps=0, degrees=(16,))
    reward = next(m.per_seed for m in run(cfg).metrics if m.name == "reward ppo N=16")
    z = math.exp(cfg.decoy_logit) + cfg.vocab - 1
    expected = (1.0 + cfg.decoy_reward * math.exp(cfg.decoy_logit)) / z
    assert np.allclose(reward, expected, rtol=0, atol=1e-12)


def test_power_plan_is_the_first_count_that_keeps_power() -> None:
    n = seeds_for_share(0.8)
    assert Config().seeds == n
    assert all(share_detectable(m, 0.5) <= 0.3 for m in range(n, n + 20))
    assert share_detectable(n - 1, 0.5) > 0.3


def test_context_arms_do_not_change_the_compared_ones() -> None:
    base = run(TINY)
    more = run(dataclasses.replace(TINY, context=(Method.NO_CORRECTION,)))
    shared = {m.name: m.per_seed for m in base.metrics}
    assert all(shared[m.name] == m.per_seed for m in more.metrics if m.name in shared)
