"""Paper check 01 (OPD-then-RL): contract, determinism, method stacking, pilot seeds, no teacher after the switch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from torch import Tensor

from posttrain.paper_checks.model import Role
from posttrain.paper_checks.p01_opd_then_rl import ASSERTED, SHARED, Config, run
from tests.paper_checks._distill_contract import assert_contract, assert_first_seed_moves
from tests.paper_checks._recorded import assert_matches_recorded

TINY = dataclasses.replace(Config.smoke(), num_prompts=4, steps=12, switch=5, shared_prompts=3, shared_dim=16)


def test_contract_and_determinism() -> None:
    result = assert_contract(run, TINY)
    names = {m.name for m in result.metrics}
    assert {f"p@1 {m}" for m in ASSERTED} <= names
    assert {f"shared: p@1 {m}" for m in SHARED} <= names
    assert result.primary.name.startswith("shared: ") and result.primary.headline  # judged on shared parameters
    tabular_d = [c for c in result.comparisons if c.name.startswith("tabular D")]
    assert len(tabular_d) == 1 and tabular_d[0].role is Role.CONTEXT  # the tabular headline is reported only


def test_pilot_seeds_are_other_seeds() -> None:
    assert_first_seed_moves(run, TINY)


def test_stacked_methods_are_independent_of_their_block_order() -> None:
    alone = run(dataclasses.replace(TINY, methods=ASSERTED))
    p1 = {m.name: m.per_seed for m in alone.metrics}
    reordered = run(dataclasses.replace(TINY, methods=tuple(reversed(ASSERTED))))
    assert {m.name: m.per_seed for m in reordered.metrics} == p1


@pytest.mark.slow
def test_full_verdict_matches_the_recorded_run() -> None:
    assert_matches_recorded("01", run(Config()))


def test_opd_then_rl_runs_the_teacher_only_before_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    import posttrain.paper_checks.p01_opd_then_rl as p01
    from posttrain.simulators.teacher_tabular import train_methods

    calls: list[int] = []
    original = p01.fixed_token_logp

    def counting(*args: Any, **kwargs: Any) -> Callable[[Tensor], Tensor]:
        forward = original(*args, **kwargs)

        def counted(tokens: Tensor) -> Tensor:
            calls.append(1)
            return forward(tokens)

        return counted

    monkeypatch.setattr(p01, "fixed_token_logp", counting)  # the check's only teacher forward
    cfg = dataclasses.replace(TINY, steps=9, switch=4)
    env = p01._make_env(cfg, cfg.num_prompts)
    train_methods(
        env.spec, env.student, env.targets, [p01._method(p01.Method.OPD_THEN_RL, cfg, env)], steps=9, k=4, lr=0.05
    )
    assert len(calls) == 4  # steps 1..S only
