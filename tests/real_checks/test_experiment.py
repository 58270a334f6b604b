"""Judging: the toy checks' statistics on paired records, the gate's override, negative controls, seed plans."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from posttrain.paper_checks.model import Role
from posttrain.real_checks import experiments, select_experiments
from posttrain.real_checks.card import Mediator, TransferCard, declared
from posttrain.real_checks.experiment import Contrast, RealExperiment, RealVerdict, diff, judge, retention
from posttrain.real_checks.plan import clearing_count, estimate, pilot_share, power_at, seeds_for_share
from tests.real_checks._records import record

CARD = TransferCard(("11b",), "test", (Mediator("p0", "add:p0", "", declared(0.0, 1.0, "test")),))
EXP = RealExperiment("99", "test", CARD, (Contrast("a - b", diff("accuracy", "a", "b"), Role.PRIMARY),))


def _seeds(n: int, acc_a: float, acc_b: float) -> list[dict]:
    return [{"a": record(acc_a, seed=s, prompts=200), "b": record(acc_b, seed=1000 + s, prompts=200)} for s in range(n)]


def _gate(inside: bool) -> list[dict]:
    return [{"name": "p0", "inside": inside, "value": 0.2, "toy": {"lo": 0, "hi": 1, "origin": ""}}]


def test_a_consistent_effect_is_reproduced_a_null_is_not():
    assert judge(EXP, _seeds(9, 0.6, 0.3), _gate(True))["verdict"] == RealVerdict.REPRODUCED.value
    null = judge(EXP, _seeds(9, 0.4, 0.4), _gate(True))["verdict"]
    assert null != RealVerdict.REPRODUCED.value
    assert judge(EXP, _seeds(9, 0.3, 0.6), _gate(True))["verdict"] == RealVerdict.CONTRADICTED.value


def test_a_mutant_equal_to_its_control_is_never_reproduced():
    same = [{"a": r["b"], "b": r["b"]} for r in _seeds(12, 0.5, 0.5)]  # the control in the method's place
    assert judge(EXP, same, _gate(True))["verdict"] == RealVerdict.CONTRADICTED.value  # d = 0 <= margin every seed


def test_three_seeds_cannot_give_a_verdict():
    out = judge(EXP, _seeds(3, 0.9, 0.1), _gate(True))
    assert out["verdict"] == RealVerdict.INCONCLUSIVE.value and clearing_count(3) is None


def test_the_gate_replaces_the_verdict_and_keeps_the_withheld_one():
    out = judge(EXP, _seeds(9, 0.6, 0.3), _gate(False))
    assert out["verdict"] == RealVerdict.REGIME_NOT_REACHED.value
    assert out["ungated_verdict"] == RealVerdict.REPRODUCED.value and out["gate_missed"] == ["p0"]


def test_a_bounded_contrast_also_reports_the_betting_bound():
    rows = judge(EXP, _seeds(9, 0.6, 0.3), _gate(True))["comparisons"]
    assert [r["kind"] for r in rows] == ["quantile", "mean"] and rows[1]["role"] == "context"


def test_retention_is_nan_without_a_gain():
    r = {"e": record(0.5), "t": record(0.3, seed=1), "b": record(0.4, seed=2)}
    assert math.isnan(retention("e", "t", "b").fn(r))


def test_seed_plan_matches_the_exact_binomial_power():
    for p in (0.85, 0.9, 0.95):
        n = seeds_for_share(p)
        k = clearing_count(n)
        assert power_at(n, p) == pytest.approx(float(stats.binom.sf(k - 1, n, p))) and power_at(n, p) >= 0.8
        assert all(power_at(m, p) < 0.8 for m in range(1, n))
    assert pilot_share([0.1, 0.12, 0.08], 0.0) == 0.99 and pilot_share([0.0], 0.0) == 0.95


def test_budget_counts_each_job_once_and_uses_measured_rates():
    measured = {"a": {"history": [{}, {}], "build_cpu_s": 4.0, "train_cpu_s": 24.0, "eval_cpu_s": 8.0,
                      "eval": {"generated": 16}}}  # fmt: skip
    out = estimate([("a", 0), ("a", 1), ("b", 0)], {"a": 16, "b": 16}, {"a": 800, "b": 800}, measured)
    per_job = 4.0 + 10.0 * 16 + 0.5 * 800
    assert out["per_arm_cpu_s"]["a"] == pytest.approx(2 * per_job) and out["unmeasured"] == ["b"]
    assert out["cpu_s"] == pytest.approx(3 * per_job)


def test_every_experiment_declares_a_primary_or_a_scope_and_known_arms():
    from posttrain.real_checks.arm_table import ARMS

    table = experiments()
    assert sorted(table) == [f"{i:02d}" for i in range(1, 21)]
    for e in table.values():
        assert e.scope or sum(c.role is Role.PRIMARY for c in e.contrasts) == 1, e.id
        assert all(a in ARMS for a in e.arms), e.id
        assert e.card.toy_ids, e.id
    assert [e.id for e in select_experiments(["2", "16"])] == ["02", "16"]
    with pytest.raises(KeyError, match="unknown real-model experiment"):
        select_experiments(["99"])
