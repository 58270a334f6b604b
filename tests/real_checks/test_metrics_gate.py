"""Metrics read from run records, the probe's mediators and the regime gate."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from posttrain.estimators import pass_at_k
from posttrain.real_checks.card import Mediator, Source, ToyRange, declared
from posttrain.real_checks.gate import gate_rows, run_mediator
from posttrain.real_checks.metrics import metric
from posttrain.real_checks.probe import probe_intervals, reward_metrics
from tests.real_checks._records import record


def test_accuracy_and_pass_at_k_match_the_estimator():
    rec = record(0.3, prompts=50, samples=8, seed=1)
    c = np.array([sum(r >= 1 for r in row) for row in rec["eval"]["rewards"]])
    assert metric(rec, "accuracy") == pytest.approx(float((c / 8).mean()))
    for k in (1, 4, 8):
        assert metric(rec, f"pass@{k}") == pytest.approx(float(np.mean(pass_at_k(8, c, k))))
    assert math.isnan(metric(rec, "pass@16"))  # k above the samples per prompt
    assert metric(rec, "zero_coverage") == pytest.approx(float((c == 0).mean()))
    with pytest.raises(KeyError, match="unknown metric"):
        metric(rec, "accuracy@3")


def test_escape_step_is_right_censored_and_domain_accuracy_selects_rows():
    hist = [{"step": s, "reward_mean": r} for s, r in enumerate([0.0, 0.1, 0.3, 0.2], start=1)]
    assert metric(record(0.5, history=hist), "escape@0.25") == 3.0
    assert metric(record(0.5, history=hist), "escape@0.5") == 5.0  # never: steps + 1
    rec = record(0.5, prompts=4, samples=2, domains=[0, 1, 0, 1])
    rec["eval"]["rewards"] = [[1, 1], [0, 0], [1, 0], [0, 0]]
    assert metric(rec, "accuracy[0]") == 0.75 and metric(rec, "accuracy[1]") == 0.0


def test_answer_entropy_is_the_entropy_of_the_answer_distribution():
    rec = record(0.5, prompts=1, samples=4)
    rec["eval"]["answers"] = [["1", "1", "2", ""]]
    p = np.array([0.5, 0.25, 0.25])
    assert metric(rec, "answer_entropy") == pytest.approx(float(-(p * np.log(p)).sum()))


def test_reward_metrics_by_hand():
    r = np.array([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.5, 0.5, 0.0, 1.0]])
    m = reward_metrics(r)
    assert m["p0"] == pytest.approx(6 / 16)
    assert m["zero_variance_groups"] == pytest.approx(0.5)
    assert m["all_wrong_groups"] == pytest.approx(0.25)
    ties = (3 + 6 + 6 + 1) / 24  # equal-reward pairs out of 6 per group
    assert m["tie_rate"] == pytest.approx(ties)
    # pass@4 - pass@1 over groups with 1, 0, 4, 1 correct of 4
    assert m["coverage_gap"] == pytest.approx((1 + 0 + 1 + 1) / 4 - (1 / 4 + 0 + 1 + 1 / 4) / 4)


def test_inversion_rate_of_a_partial_credit_group():
    # one group: the appended gold row (reward 1) lifts the mean above the 0.5 samples' rewards
    r = np.array([[0.5, 0.5, 0.5, 0.0]])
    assert reward_metrics(r)["inversion_rate"] == pytest.approx(1.0)
    assert reward_metrics(np.array([[1.0, 0.0, 0.0, 0.0]]))["inversion_rate"] == 0.0  # binary: no inversion
    assert torch.is_tensor(torch.as_tensor(r))


def test_gate_rows_inside_outside_and_run_mediators():
    inside = Mediator("p0", "add:p0", "", declared(0.1, 0.3, "test"))
    outside = Mediator("zv", "add:zero_variance_groups", "", declared(0.0, 0.1, "test"))
    rms = Mediator("rms", "rms_ratio:a:b", "", declared(2.0, 20.0, "test"), Source.RUN)
    runs = {"a": record(0.5, rms=3e-6), "b": record(0.5, rms=1e-6)}
    rows = gate_rows([inside, outside, rms], {"add": {"p0": 0.2, "zero_variance_groups": 0.5}}, runs)
    assert [r["inside"] for r in rows] == [True, False, True]
    assert rows[2]["value"] == pytest.approx(3.0)
    assert math.isnan(run_mediator("no_such:x", runs))
    assert not ToyRange(math.nan, math.nan, "missing").contains(0.5)


def test_a_run_mediator_without_runs_is_not_measured_rather_than_missed():
    p0 = Mediator("p0", "add:p0", "", declared(0.1, 0.3, "test"))
    gap = Mediator("gap", "accuracy_gap:a:b", "", declared(0.1, 1.0, "test"), Source.RUN)
    rows = gate_rows([p0, gap], {"add": {"p0": 0.9}}, {})
    assert rows[0]["inside"] is False and rows[1]["inside"] is None and math.isnan(rows[1]["value"])
    measured = gate_rows([gap], {}, {"a": record(0.15), "b": record(0.1)})
    assert measured[0]["inside"] is False and measured[0]["value"] == pytest.approx(0.05)


def test_lagged_mean_reads_only_lagged_steps():
    hist = [{"rollout/lag": 0, "sis/accept_rate": 1.0}, {"rollout/lag": 2, "sis/accept_rate": 0.8},
            {"rollout/lag": 2, "sis/accept_rate": 0.6}]  # fmt: skip
    assert run_mediator("lagged_mean:s:sis/accept_rate", {"s": record(0.5, history=hist)}) == pytest.approx(0.7)


def test_probe_intervals_cover_the_point_value_and_the_gate_needs_exclusion():
    rng = np.random.default_rng(0)
    r = (rng.random((16, 8)) < 0.2).astype(float)
    iv = probe_intervals(r, [None] * 16, np.full(16, 10.0), reps=200)
    point = reward_metrics(r)
    for key in ("p0", "zero_variance_groups", "tie_rate", "coverage_gap"):
        assert iv[key][0] <= point[key] <= iv[key][1], key
    near = Mediator("p0", "add:p0", "", declared(point["p0"] + 0.01, 0.9, "test"))
    far = Mediator("p0", "add:p0", "", declared(0.9, 1.0, "test"))
    rows = gate_rows([near, far], {"add": {**point, "interval": iv}}, {})
    assert rows[0]["inside"] and not rows[1]["inside"]  # inside when the interval reaches the toy's range
