"""Paper check 05 (ES keeps coverage): contract and determinism on small configs, the mutants' hooks, the power
plan; verdict on the full config (slow)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from posttrain.errors import DomainError
from posttrain.paper_checks.p05_es_coverage import Config, run
from posttrain.simulators.es_toys import run_bandit_arms
from tests.paper_checks._es_contract import CheckContract
from tests.paper_checks._plans import quantile_power


class TestP05(CheckContract):
    check_id = "05"
    config_type = Config
    run = staticmethod(run)
    tiny: ClassVar[dict[str, Any]] = {"seeds": 2, "n_train": 128, "n_test": 64, "steps": 6, "lemma_draws": 50}


def test_a_substituted_arm_is_trained_as_its_stand_in() -> None:
    """The mutants' hook: ``("es", "grpo")`` gives the ES arm GRPO's own parameters; unknown arms raise."""
    small: dict[str, Any] = {"n_train": 64, "n_test": 32, "steps": 3}
    arms = run_bandit_arms([0, 1], arms=("base", "grpo", "es"), substitute=(("es", "grpo"),), **small)
    assert all(torch.equal(arms.arms["es"][n], arms.arms["grpo"][n]) for n in ("b", "W"))
    plain = run_bandit_arms([0, 1], arms=("grpo", "es"), **small)
    assert all(torch.equal(plain.arms["grpo"][n], arms.arms["grpo"][n]) for n in ("b", "W"))
    assert not torch.equal(plain.arms["es"]["b"], arms.arms["es"]["b"])
    with pytest.raises(DomainError, match="substitute"):
        run_bandit_arms([0], arms=("es",), substitute=(("es", "ppo"),), **small)


def test_one_member_es_does_not_move_and_thresholding_is_a_no_op() -> None:
    result = run(dataclasses.replace(Config.smoke(), population=1, **TestP05.tiny))
    metric = {m.name: m.per_seed for m in result.metrics}
    assert metric["es pass@1"] == metric["base pass@1"] == metric["es thresholded pass@1"]
    assert np.all(np.asarray(result.primary.differences) < 0)  # no Pass@1 gain over the base


def test_seed_count_has_the_planned_power() -> None:
    """12 seeds at a true share 0.9 (the spec's "in every seed", one seed in ten may miss)."""
    assert quantile_power(Config().seeds, 0.9, 0.5) >= 0.8
