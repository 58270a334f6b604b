"""Paper check 08 (Open-MOPD): contract, determinism, pilot seeds, the no-reallocation variant."""

from __future__ import annotations

import dataclasses

import pytest

from posttrain.paper_checks.p08_open_mopd import Config, Variant, run
from tests.paper_checks._distill_contract import assert_contract, assert_first_seed_moves
from tests.paper_checks._recorded import assert_matches_recorded

TINY = dataclasses.replace(Config.smoke(), rollout_batches=3)


def test_contract_and_determinism() -> None:
    assert_contract(run, TINY)


def test_pilot_seeds_are_other_seeds() -> None:
    assert_first_seed_moves(run, TINY)


def test_refresh_only_is_naive_on_the_first_inner_update() -> None:
    """Without reallocation the weights are naive's, and refresh equals the stored reward on the first
    (on-policy) inner mini-batch: one rollout batch with one inner update gives naive's numbers."""
    one = dataclasses.replace(TINY, rollout_batches=1, inner_updates=1)
    real = {m.name: m.per_seed for m in run(one).metrics}
    swapped = run(dataclasses.replace(one, substitute=((Variant.OPEN_MOPD, Variant.REFRESH_ONLY),)))
    assert {m.name: m.per_seed for m in swapped.metrics}["macro recovery open_mopd"] == real["macro recovery naive"]


@pytest.mark.slow
def test_full_verdict_matches_the_recorded_run() -> None:
    assert_matches_recorded("08", run(Config()))
