""" "Is it learning?": zero-variance groups, excluded groups, tokens in the loss, advantage spread, flat steps."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from rich.console import Console

from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.train.progress import run_progress
from posttrain.llm.train.step_log import learning_diagnostics

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")


def _batch(rewards: list[float], advantages: list[float], judged: list[bool] | None = None) -> RolloutBatch:
    b = len(rewards)
    mask = torch.tensor([[True, True, t < 1] for t in range(b)])  # rows of 3 or 2 tokens
    adv = torch.tensor(advantages, dtype=torch.float32).unsqueeze(-1).expand(b, 3) * mask
    return RolloutBatch(
        prompt_ids=torch.ones(b, 1, dtype=torch.long), prompt_mask=torch.ones(b, 1, dtype=torch.bool),
        response_ids=torch.ones(b, 3, dtype=torch.long), mask=mask, rewards=torch.tensor(rewards, dtype=torch.float32), group_size=2,
        advantages=adv, judged=None if judged is None else torch.tensor(judged),
    )  # fmt: skip


def test_diagnostics_by_hand() -> None:
    # groups: (1, 1) constant, (0, 1) not, (0, 0) constant but unjudged -> excluded
    d = learning_diagnostics(_batch([1, 1, 0, 1, 0, 0], [0, 0, -1, 1, 0, 0], judged=[True] * 4 + [False, True]))
    assert d["groups"] == 3 and d["zero_variance_groups"] == 0.5  # one of the two judged groups
    assert d["loss_tokens"] == 3 + 2 + 2 + 2  # the excluded group's 4 tokens are not in the loss
    adv = torch.tensor([0.0] * 5 + [-1.0] * 2 + [1.0] * 2, dtype=torch.float64)
    assert d["advantage_std"] == pytest.approx(float(adv.std(correction=0)))
    assert d["advantage_abs_mean"] == pytest.approx(4 / 9) and d["flat_step"] is False


def test_a_step_with_every_group_constant_and_zero_advantages_is_flat() -> None:
    assert learning_diagnostics(_batch([1, 1, 0, 0], [0, 0, 0, 0]))["flat_step"] is True
    # constant groups but a method whose advantages are not 0 there (no group baseline): not flat
    assert learning_diagnostics(_batch([1, 1, 0, 0], [0.5, 0.5, -0.5, -0.5]))["flat_step"] is False
    # no judged group at all: no update is made, nothing to warn about
    d = learning_diagnostics(_batch([0, 0, 0, 0], [0, 0, 0, 0], judged=[False] * 4))
    assert d["flat_step"] is False and d["zero_variance_groups"] is None and d["loss_tokens"] == 0


def test_the_progress_display_warns_once_per_flat_step() -> None:
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=False, width=200)
    with run_progress(steps=2, console=console, interval_s=0.0) as progress:
        progress.ready(0)
        progress.train_step({"step": 1, "reward_mean": 0.0, "entropy": 0.5, "zero_variance_groups": 1.0,
                             "flat_step": True})  # fmt: skip
        progress.train_step({"step": 2, "reward_mean": 0.5, "entropy": 0.5, "zero_variance_groups": 0.25,
                             "flat_step": False})  # fmt: skip
    text = stream.getvalue()
    assert "zero-var 1.00" in text and "zero-var 0.25" in text
    warnings = [line for line in text.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and "step 1: every group's rewards were equal" in warnings[0]


@pytest.mark.slow
def test_a_run_logs_the_diagnostics_and_eval_reports_zero_variance_prompts(tmp_path: Path) -> None:
    from posttrain.llm.run import build_trainer
    from tests.llm._lift import small_config

    trainer = build_trainer(small_config(), tmp_path / "run")
    row = trainer.fit()[0]
    for key in ("groups", "zero_variance_groups", "loss_tokens", "advantage_std", "advantage_abs_mean", "flat_step"):
        assert key in row
    assert row["loss_tokens"] > 0 and row["groups"] == 4
    scores = trainer.evaluate(ks=(1, 2))
    assert 0.0 <= scores["zero_variance_prompts"] <= 1.0
