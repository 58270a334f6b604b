"""The planted estimators get the findings they must: a correct RLOO written differently is equal to
``rloo`` and unbiased; a leave-one-out baseline that keeps the sample is biased by the analytic
amount; whitening over padding breaks the contract; a clip on the wrong side breaks it too.

Gradient statistics use 20,000 draws per (toy, group size); "within Monte Carlo error" is 4
standard errors of the scale, and the bias flag is the arena's (Hotelling, p < 1e-4).
"""

from __future__ import annotations

import pytest

from posttrain.arena.contract import run_contract
from posttrain.arena.conventions import run_conventions
from posttrain.arena.exact import Budget, default_toys, gradient_stats
from posttrain.arena.kinds import Kind, registered, subject
from tests.arena import planted

TOYS = default_toys()
BUDGET = Budget(draws=20_000)
Z = 4.0


def test_rloo_written_differently_equals_rloo_and_is_unbiased() -> None:
    s = subject("rloo_by_matrix", planted.rloo_by_matrix)
    conv = run_conventions(s)
    assert [m.name for m in conv.equal] == ["rloo"]
    drgrpo = next(m for m in conv.matches if m.name == "drgrpo")
    assert drgrpo.relation == "proportional"
    assert all(abs(c - k / (k - 1)) < 1e-9 for k, c in drgrpo.factor.items())  # RLOO = K/(K-1) Dr.GRPO
    stats, _ = gradient_stats(s, TOYS, independent=True, budget=BUDGET)
    assert not any(g.biased for g in stats), [(g.toy, g.k, g.p_value) for g in stats]
    for g in stats:
        assert abs(g.scale - 1.0) < Z * g.scale_se, (g.toy, g.k, g.scale, g.scale_se)


def test_loo_baseline_keeping_the_sample_is_flagged_with_the_analytic_bias() -> None:
    """``A = R - sum_j R_j / (K - 1)``: E[A grad log pi] = (1 - 1/(K - 1)) grad J, so the scale is (K-2)/(K-1)."""
    s = subject("loo_with_self", planted.loo_with_self)
    stats, _ = gradient_stats(s, TOYS, independent=True, budget=BUDGET)
    assert all(g.biased for g in stats), [(g.toy, g.k, g.p_value) for g in stats]
    for g in stats:
        analytic = (g.k - 2) / (g.k - 1)
        assert abs(g.scale - analytic) < Z * g.scale_se, (g.toy, g.k, g.scale, analytic, g.scale_se)
        assert abs(g.scale - 1.0) > 10 * g.scale_se  # measured bias, far outside the error bars
    conv = run_conventions(s)
    assert not conv.equal and conv.closest is not None
    assert "rewards=[[1.0, 1.0]]" in conv.departure  # a constant group gets non-zero advantages
    props = {p.id: p.holds for p in run_contract(s, max_examples=30).properties}
    assert props["shift"] is False and props["zero-sum"] is False and props["constant-zero"] is False


def test_drgrpo_scale_is_the_known_k_minus_one_over_k() -> None:
    """The exact toys against a known closed form of the package's own estimator."""
    stats, _ = gradient_stats(registered(Kind.ADVANTAGE, "drgrpo"), TOYS, independent=True, budget=BUDGET)
    for g in stats:
        assert abs(g.scale - (g.k - 1) / g.k) < Z * g.scale_se, (g.toy, g.k, g.scale)


def test_whitening_over_padding_breaks_the_contract_on_masked_rows() -> None:
    s = subject("whitened_over_padding", planted.whitened_over_padding)
    report = run_contract(s, max_examples=30)
    defects = {f.item: f for f in report.defects}
    assert "padding" in defects, [f.line() for f in report.findings]
    assert "mask=" in defects["padding"].example


def test_clip_on_the_wrong_side_is_caught() -> None:
    s = subject("ppo_clip_wrong_side", planted.ppo_clip_wrong_side)
    report = run_contract(s, max_examples=30)
    restoring = next(f for f in report.defects if f.item == "restoring")
    assert "logp=" in restoring.example and "advantages=" in restoring.example
    conv = run_conventions(s)
    assert not conv.equal and "ratio" in conv.departure
    ppo = next(m for m in conv.matches if m.name == "ppo_clip")
    assert ppo.relation == "differs"


def test_the_correct_estimators_break_no_contract_property() -> None:
    for kind, name in ((Kind.ADVANTAGE, "rloo"), (Kind.LOSS, "cispo"), (Kind.KL, "k3")):
        report = run_contract(registered(kind, name), max_examples=25)
        assert not report.defects, (name, [f.line() for f in report.findings])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "name"),
    [
        (Kind.ADVANTAGE, n) for n in ("grpo", "drgrpo", "rloo", "reinforce_pp", "reinforce_pp_baseline")
    ] + [(Kind.LOSS, n) for n in ("ppo_clip", "gspo", "cispo", "no_is_correction", "truncated_is")]
    + [(Kind.KL, n) for n in ("k1", "k2", "k3")],
)  # fmt: skip
def test_every_registered_baseline_passes_the_arena_contract(kind: Kind, name: str) -> None:
    report = run_contract(registered(kind, name), max_examples=60)
    assert not report.defects, [f.line() for f in report.findings]


def test_the_bias_test_does_not_flag_unbiased_estimators() -> None:
    """Calibration at the draw count of estimators called draw by draw (2,000): RLOO (unbiased for the
    policy gradient) and k2 on the bandit (unbiased for the KL gradient there) over five seeds, 30
    tests each at level 1e-4: none flagged, and the p-values are not piled up near 0."""
    ps = []
    for kind, name in ((Kind.ADVANTAGE, "rloo"), (Kind.KL, "k2")):
        for seed in range(5):
            stats, _ = gradient_stats(
                registered(kind, name), TOYS, independent=True, budget=Budget(draws=2000, seed=seed)
            )
            ps += [g.p_value for g in stats if not (name == "k2" and g.toy == "tabular")]
    assert min(ps) >= 1e-4, sorted(ps)[:3]
    assert sum(p < 0.01 for p in ps) <= 3, sorted(ps)[:5]  # 45 tests: about 0.5 expected below 0.01
