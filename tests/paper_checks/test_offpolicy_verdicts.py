"""Slow: the full-config outcomes of the off-policy and replay checks (02, 11a, 11b, 14, 16) equal the recorded run's."""

from __future__ import annotations

import pytest

from posttrain.paper_checks.p02_hdr import Config as HDRConfig
from posttrain.paper_checks.p02_hdr import run as run_hdr
from posttrain.paper_checks.p11_rail import AdaptivityConfig, run_adaptivity
from posttrain.paper_checks.p11_rail import Config as RAILConfig
from posttrain.paper_checks.p11_rail import run as run_rail
from posttrain.paper_checks.p14_gflowrl import Config as GFlowConfig
from posttrain.paper_checks.p14_gflowrl import run as run_gflowrl
from posttrain.paper_checks.p16_sis import Config as SISConfig
from posttrain.paper_checks.p16_sis import run as run_sis
from tests.paper_checks._recorded import assert_matches_recorded

pytestmark = pytest.mark.slow


def test_hdr_matches_the_recorded_run() -> None:
    assert_matches_recorded("02", run_hdr(HDRConfig()))


def test_rail_controller_adaptivity_matches_the_recorded_run() -> None:
    assert_matches_recorded("11a", run_adaptivity(AdaptivityConfig()))


def test_rail_matched_budget_matches_the_recorded_run() -> None:
    assert_matches_recorded("11b", run_rail(RAILConfig()))


def test_gflowrl_matches_the_recorded_run() -> None:
    assert_matches_recorded("14", run_gflowrl(GFlowConfig()))


def test_sis_matches_the_recorded_run() -> None:
    assert_matches_recorded("16", run_sis(SISConfig()))
