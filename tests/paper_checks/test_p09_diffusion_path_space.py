"""Paper check 09 (diffusion RL in path space): structural contract on the smoke config; verdict on the full one."""

from __future__ import annotations

import dataclasses
import math

import pytest

from posttrain.paper_checks import CHECKS
from posttrain.paper_checks.model import Role
from posttrain.paper_checks.p09_diffusion_path_space import Config, Estimator, run
from tests.paper_checks._recorded import assert_matches_recorded


@pytest.fixture(scope="module")
def smoke_result():
    return run(Config.smoke())


def test_registered() -> None:
    assert CHECKS.get("09").config_type is Config


def test_smoke_is_finite_and_complete(smoke_result) -> None:
    cfg = Config.smoke()
    for m in smoke_result.metrics:
        assert m.per_seed and all(math.isfinite(v) for v in m.per_seed), m.name
    assert len([m for m in smoke_result.metrics if len(m.per_seed) == cfg.seeds]) >= 10
    assert sum(c.role is not Role.CONTEXT for c in smoke_result.comparisons) == 14  # TOSTs: two criteria each
    assert smoke_result.primary.name.endswith("vs exact g*")
    for c in smoke_result.comparisons:
        assert c.differences and all(math.isfinite(v) for v in c.differences), c.name
        assert c.margin_reason
    series = smoke_result.extra["series"]
    (curves,) = series.values()
    assert set(curves["lines"]) == {"Ito-full", "Ito-sub(10)", "Det(10)", "KDE(16)"}
    assert all(len(v) == len(curves["x"]) for v in curves["lines"].values())


def test_same_seed_same_numbers() -> None:
    tiny = dataclasses.replace(
        Config.smoke(),
        rollouts=512,
        side_rollouts=512,
        baseline_samples=2048,
        steps=20,
        steps_sweep=(10, 20),
        plot_batches=(16, 64),
    )
    a, b = run(tiny), run(tiny)
    assert a.metrics == b.metrics and a.comparisons == b.comparisons


def test_a_bias_mutant_scales_only_its_family() -> None:
    """``Config.bias`` multiplies one family's estimates (Itô-full and Itô-sub, or Det) by the factor."""
    tiny = dataclasses.replace(Config.smoke(), seeds=1, rollouts=256, side_rollouts=256, steps_sweep=(10, 20))
    plain = {m.name: m.per_seed for m in run(tiny).metrics}
    biased = {m.name: m.per_seed for m in run(dataclasses.replace(tiny, bias=((Estimator.ITO, 1.05),))).metrics}
    assert biased["mean Ito-full"][0] == pytest.approx(1.05 * plain["mean Ito-full"][0], rel=1e-12)
    assert biased["var Ito-sub(10)"][0] == pytest.approx(1.05**2 * plain["var Ito-sub(10)"][0], rel=1e-12)
    assert biased["mean Det(10)"] == plain["mean Det(10)"]


@pytest.mark.slow
def test_full_verdict_matches_the_recorded_run() -> None:
    assert_matches_recorded("09", run(Config()))
