"""Paper check 04 (Self-Routing): contract, determinism, pilot seeds, the shuffled router and the smoke verdict."""

from __future__ import annotations

import dataclasses

import pytest

from posttrain.paper_checks.p04_self_routing import Config, Router, run
from tests.paper_checks._distill_contract import assert_contract, assert_first_seed_moves
from tests.paper_checks._recorded import assert_matches_recorded, smoke_misses

TINY = dataclasses.replace(Config.smoke(), per_type=4, steps=10)


def test_contract_and_determinism() -> None:
    result = assert_contract(run, TINY)
    shares = [m for m in result.metrics if m.name.startswith("Self-Routing share")]
    assert len(shares) == 4
    totals = [sum(v) for v in zip(*(m.per_seed for m in shares), strict=True)]
    assert all(abs(t - 1.0) < 1e-9 for t in totals)  # the routes partition every step's batch


def test_pilot_seeds_are_other_seeds() -> None:
    assert_first_seed_moves(run, TINY)


def test_shuffled_routes_keep_the_recipe_counts_and_drop_the_assignment() -> None:
    """One step: the shuffled router deals Self-Routing's very draw to other prompts (same shares, other prompts)."""
    one = dataclasses.replace(TINY, steps=1)
    shuffled = dataclasses.replace(one, substitute=((Router.SELF_ROUTING, Router.SHUFFLED),))
    real, dealt = ({m.name: m.per_seed for m in run(c).metrics} for c in (one, shuffled))
    shares = [k for k in real if k.startswith("Self-Routing share")]
    assert len(shares) == 4 and all(real[k] == dealt[k] for k in shares)
    assert real["SKIP share, confident failures"] != dealt["SKIP share, confident failures"]


def test_smoke_directions() -> None:
    # the spec's criteria hold in every smoke seed already (too few seeds for the harness's tests)
    assert smoke_misses(run(Config.smoke())) == []


@pytest.mark.slow
def test_full_verdict_matches_the_recorded_run() -> None:
    assert_matches_recorded("04", run(Config()))
