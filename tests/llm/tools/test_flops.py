"""``posttrain flops``: plans from a config's own ``flops:`` section or from an llm run config, and the command."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.errors import DomainError
from posttrain.llm.tools.flops import load_plan, plan_flops, plan_from_mapping
from posttrain.llm.tools.tiny import char_tokenizer
from posttrain.theory.race_flops import Accounting, PolicyCost, flops_per_step


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
    shared = plan_flops(own, accounting=Accounting.SHARED_PROMPT)[0]
    shared_by_hand = flops_per_step(
        np.full(4, 100.0), np.full((4, 2), 50.0), policy=PolicyCost(3e9), accounting=Accounting.SHARED_PROMPT
    )
    assert shared == shared_by_hand and shared.total < step.total
    llm = plan_from_mapping(
        {"rollout": {"group_size": 4}, "optim": {"steps": 3}, "algorithm": {"kl": "k3", "kl_coef": 0.01}}
    )
    assert llm.group_size == 4 and llm.steps == 3 and llm.ref_forward and llm.n_params > 0
    assert llm.n_head == len(char_tokenizer()) * 128  # the tiny model's LM head: V d
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
    assert "per token" in out.output and "prompt once" in out.output  # the paper's count and the executed one
