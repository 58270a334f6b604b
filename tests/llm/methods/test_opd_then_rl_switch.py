"""OPD-then-RL's switch driven by the validation scores (``switch_rule: plateau``): exact, permanent, logged."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import DomainError
from posttrain.estimators import broadcast_sequence_advantages, group_normalized_advantages, opd_token_advantages
from posttrain.estimators.selection import plateau_switch_step
from posttrain.llm.methods.distill import OpdThenRlOptions, opd_then_rl_algorithm
from posttrain.llm.run import build_trainer
from tests.llm._lift import count_fills, small_config
from tests.llm.methods.test_distill import _batch

SCORES = (0.10, 0.10, 0.30, 0.50, 0.51, 0.512, 0.40, 0.90)  # rises, then a plateau at index 4 (gain 0.01 < 0.05)
RULE: dict[str, Any] = {"switch_rule": "plateau", "window": 1, "min_gain": 0.05}


def _rule(scores: tuple[float, ...] | list[float], window: int, min_gain: float) -> int | None:
    return plateau_switch_step(torch.tensor(scores, dtype=torch.float64), window=window, min_gain=min_gain)


def test_switch_happens_exactly_at_the_rules_index() -> None:
    switch = _rule(SCORES, 1, 0.05)
    assert switch == 4
    alg = opd_then_rl_algorithm(8, OpdThenRlOptions(**RULE))
    assert "logp_teacher" in alg.needs  # the union over phases
    batch = _batch()
    assert batch.logp_teacher is not None and batch.logp_old is not None
    opd = opd_token_advantages(batch.logp_teacher, batch.logp_old, batch.mask)
    grpo = broadcast_sequence_advantages(group_normalized_advantages(batch.grouped_rewards()), batch.mask)
    for n in range(len(SCORES) + 1):  # n evaluations logged so far (eval_every = 1: step n + 1)
        phase = alg.at(n + 1, SCORES[:n])
        teacher = n <= switch  # the plateau is visible once score `switch` is logged
        assert ("logp_teacher" in phase.needs) is teacher
        torch.testing.assert_close(phase.advantage(batch), opd if teacher else grpo, rtol=0, atol=0)
        assert phase.before_update is not None
        _, _, metrics = phase.before_update(batch, None, None)  # type: ignore[arg-type]
        assert float(metrics["opd_then_rl/teacher_phase"]) == float(teacher)


@settings(max_examples=60)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=0, max_size=12),
    st.integers(1, 3),
    st.floats(0.0, 0.3),
)
def test_rule_is_monotone_on_prefixes_so_the_switch_is_permanent(scores: list[float], window: int, gain: float) -> None:
    """For any score curve: the rule's answer on a prefix is None up to its index and that index after it."""
    full = _rule(scores, window, gain)
    alg = opd_then_rl_algorithm(8, OpdThenRlOptions(switch_rule="plateau", window=window, min_gain=gain))
    phases = []
    for n in range(len(scores) + 1):
        got = _rule(scores[:n], window, gain)
        assert got == (None if full is None or n <= full else full)
        phases.append("logp_teacher" in alg.at(n + 1, tuple(scores[:n])).needs)
    assert phases == sorted(phases, reverse=True)  # OPD ... OPD, then RL for good


def test_switch_options_are_checked() -> None:
    with pytest.raises(DomainError, match="give exactly one"):
        OpdThenRlOptions()
    with pytest.raises(DomainError, match="give exactly one"):
        OpdThenRlOptions(switch_step=3, switch_rule="plateau")
    with pytest.raises(DomainError, match="switch_rule"):
        OpdThenRlOptions(switch_rule="best")  # type: ignore[arg-type]
    with pytest.raises(DomainError, match="window"):
        OpdThenRlOptions(switch_rule="plateau", window=0)


def test_run_switches_at_the_rule_on_its_logged_eval_scores(tmp_path: Path, tiny_dir: Path) -> None:
    """eval_every = 2: score j is logged after step 2(j+1); the OPD phase ends with the step that logs the plateau.

    The 2-SFT-step tiny model scores reward 0 on every held-out prompt, so the validation score here is
    the held-out mean token entropy (``logging.eval_metric: entropy``; the rule reads any metric).
    """
    every, window, gain = 2, 1, 0.05
    algorithm = {"method": "opd_then_rl", "options": {"switch_rule": "plateau", "window": window, "min_gain": gain}}
    cfg = small_config(algorithm=algorithm, steps=12, model={"teacher": str(tiny_dir)})
    cfg = dataclasses.replace(cfg, logging=dataclasses.replace(cfg.logging, eval_every=every, eval_metric="entropy"))
    trainer = build_trainer(cfg, tmp_path / "run")
    teacher_steps = count_fills(trainer, "logp_teacher")
    history = trainer.fit()
    scores = [h["eval/entropy"] for h in history if h["step"] % every == 0]
    assert scores == trainer.val_scores
    index = _rule(scores, window, gain)
    assert index is not None, f"no plateau in the logged scores {scores}: the run shows no switch"
    last_opd = every * (index + 1)
    phases = [h["opd_then_rl/teacher_phase"] for h in history]
    print("eval scores", scores, "-> switch after step", last_opd)
    assert phases == [1.0 if s <= last_opd else 0.0 for s in range(1, len(history) + 1)]
    assert teacher_steps == list(range(1, last_opd + 1))
