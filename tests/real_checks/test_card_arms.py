"""Transfer cards read the toy checks; arms build checked configs; the cache key follows config, code and version."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from posttrain.llm.config import config_from_dict
from posttrain.real_checks.arm_table import ARMS
from posttrain.real_checks.arms import PROFILES, Arm, arm_config, run_key
from posttrain.real_checks.card import toy_metric_range, toy_primary


def test_toy_ranges_come_from_the_stored_per_seed_values(tmp_path: Path):
    path = tmp_path / "results.json"
    metrics = [{"name": "a", "per_seed": [0.1, 0.3]}, {"name": "b", "per_seed": [0.05, 0.1]}]
    path.write_text(json.dumps({"checks": [{"id": "77", "metrics": metrics}]}))
    r = toy_metric_range("77", "a", path=path)()
    assert (r.lo, r.hi) == (0.1, 0.3) and "toy 77" in r.origin
    d = toy_metric_range("77", "a", "b", combine=lambda x, y: x - y, path=path)()
    assert (d.lo, d.hi) == pytest.approx((0.05, 0.2))
    missing = toy_metric_range("77", "zz", path=path)()
    assert math.isnan(missing.lo) and "not found" in missing.origin


def test_the_card_reads_the_registered_toy_check():
    from posttrain.paper_checks import CHECKS, load_all

    load_all()
    t = toy_primary("16")
    assert t["abstract"] == CHECKS.get("16").abstract and t["claim"] == CHECKS.get("16").claim


def test_every_mediator_finds_its_toy_range_in_the_stored_toy_results():
    """A mediator whose toy metric is misnamed would gate its experiment out as *regime not reached* (NaN range)."""
    from posttrain.real_checks import select_experiments

    unfound = [
        (e.id, m.name, r.origin)
        for e in select_experiments([])
        for m in e.card.mediators
        if not (math.isfinite((r := m.toy()).lo) and math.isfinite(r.hi))
    ]
    assert unfound == []


def test_overrides_tasks_and_teachers_resolve():
    tree = arm_config(PROFILES["full"], ARMS["opd_then_rl"], 3, {"teacher_add": "/t"})
    assert tree["seed"] == 3 and tree["model"]["teacher"] == "/t"
    assert tree["algorithm"]["options"] == {"switch_step": 8}  # half the profile's 16 steps
    assert tree["data"]["task"] == "chat_addition"
    assert arm_config(PROFILES["full"], ARMS["teacher_add"], 0)["optim"]["steps"] == 32
    assert arm_config(PROFILES["smoke"], ARMS["rail"], 0)["rollout"]["branching"]["branches"] == 2


@pytest.mark.parametrize("profile", [pytest.param("full", marks=pytest.mark.slow), "smoke"])
def test_every_arm_builds_a_checked_config(profile: str):
    for arm in ARMS.values():
        models = {d: "/tmp/teacher" for d in arm.dependencies()}
        config_from_dict(arm_config(PROFILES[profile], arm, 0, models))


def test_run_key_is_stable_and_tracks_config_and_evaluation():
    arm = Arm("x")
    tree = arm_config(PROFILES["smoke"], arm, 0)
    key = run_key(tree, arm, depends={}, evaluation={"prompts": 8, "samples": 4})
    assert key == run_key(tree, Arm("y"), depends={}, evaluation={"prompts": 8, "samples": 4})  # content, not name
    assert key != run_key(
        arm_config(PROFILES["smoke"], arm, 1), arm, depends={}, evaluation={"prompts": 8, "samples": 4}
    )
    assert key != run_key(tree, arm, depends={}, evaluation={"prompts": 8, "samples": 16})
    assert key != run_key(tree, arm, depends={"t": "k"}, evaluation={"prompts": 8, "samples": 4})
