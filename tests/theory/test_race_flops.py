"""Unit tests of the RACE accounting: the spec's hand-computed cases and the `posttrain flops` command."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.errors import DomainError, ShapeError
from posttrain.llm.tools.flops import load_plan, plan_flops, plan_from_mapping
from posttrain.theory.race_flops import (
    PolicyCost,
    RewardCost,
    RewardKind,
    flops_per_step,
    reward_flops,
    search_flops,
)

TP, TR = np.full(2, 100.0), np.full((2, 4), 50.0)


def test_spec_cases_exact() -> None:
    full = flops_per_step(TP, TR, policy=PolicyCost(1e9))
    assert (full.search, full.learning, full.reward) == (1.2e12, 7.2e12, 0.0)
    assert abs(full.p - 7.2 / 8.4) < 1e-15
    lora = flops_per_step(TP, TR, policy=PolicyCost(1e9, n_lora=1e7, lora=True), ref_forward=True)
    assert lora.learning == 7.272e12
    prm = flops_per_step(TP, TR, policy=PolicyCost(1e9), reward=RewardCost(RewardKind.MODEL, n_params=7e9))
    assert prm.reward == 1.68e13


def test_prm_steps_and_judge_by_hand() -> None:
    tp, tr = np.array([10.0]), np.array([[8.0]])
    steps = reward_flops(tp, tr, reward=RewardCost(RewardKind.PRM_STEPS, n_params=1.0, steps=4))
    assert steps == 2.0 * (12 + 14 + 16 + 18)
    judge = reward_flops(tp, tr, reward=RewardCost(RewardKind.JUDGE, n_params=1.0, judge_output_tokens=5))
    assert judge == 2.0 * 23


def test_attention_generation_by_hand() -> None:
    policy = PolicyCost(1.0, n_layer=1, d_model=1)
    # prefill 4*(3*4/2) = 24; generate 2 tokens after 3: 4*(3*2 + 2*3/2) = 36; linear 2*(3 + 2)
    assert search_flops([3], [[2]], policy=policy, count_attention=True) == 24 + 36 + 10


def test_bad_inputs_name_the_argument() -> None:
    with pytest.raises(ShapeError, match="response_tokens"):
        search_flops([1, 2], [1, 2], policy=PolicyCost(1.0))
    with pytest.raises(DomainError, match="n_lora"):
        PolicyCost(1e9, n_lora=5.0)
    with pytest.raises(DomainError, match="n_params"):
        RewardCost(RewardKind.MODEL)
    with pytest.raises(ShapeError, match="trained"):
        flops_per_step(TP, TR, np.ones((2, 3), dtype=bool), policy=PolicyCost(1.0))


def test_plan_from_own_schema_and_llm_config(tmp_path: Path) -> None:
    own = plan_from_mapping(
        {
            "flops": {
                "n_params": "3e9",
                "group_size": 2,
                "prompts_per_step": 4,
                "prompt_tokens": 100,
                "response_tokens": 50,
                "steps": 10,
            }
        }
    )
    step, run = plan_flops(own)
    by_hand = flops_per_step(np.full(4, 100.0), np.full((4, 2), 50.0), policy=PolicyCost(3e9))
    assert step == by_hand and run.total == pytest.approx(10 * by_hand.total)
    llm = plan_from_mapping(
        {"rollout": {"group_size": 4}, "optim": {"steps": 3}, "algorithm": {"kl": "k3", "kl_coef": 0.01}}
    )
    assert llm.group_size == 4 and llm.steps == 3 and llm.ref_forward and llm.n_params > 0
    with pytest.raises(DomainError, match="unknown key"):
        plan_from_mapping({"flops": {"n_params": 1.0, "bogus": 1}})
    with pytest.raises(DomainError, match="n_params"):
        plan_from_mapping({"flops": {"group_size": 2}})
    path = tmp_path / "c.yaml"
    path.write_text("flops:\n  n_params: 1.0e9\n  reward: {kind: model, n_params: 7e9}\n")
    assert load_plan(path).reward["kind"] == "model"


def test_flops_command_prints_the_split(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("flops:\n  n_params: 1.0e9\n  group_size: 4\n  prompts_per_step: 2\n")
    out = CliRunner().invoke(app, ["flops", str(path)])
    assert out.exit_code == 0, out.output
    assert "learning" in out.output and "update fraction p" in out.output
