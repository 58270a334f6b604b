"""The arena's parts on their own: loading and signatures, the refactored contract runner, the
properties of the package's estimators, the learning curves' three-way verdicts, the summary's width."""

from __future__ import annotations

import dataclasses
import functools
import io
from pathlib import Path

import pytest
import torch
from rich.console import Console

from posttrain.arena.contract import run_contract
from posttrain.arena.curves import CurveConfig, judge_curves, run_curves
from posttrain.arena.kinds import Form, Kind, advantage_tokens, last_token_rewards, load_function, registered, subject
from posttrain.arena.properties import PROPERTIES, search
from posttrain.errors import DomainError
from posttrain.estimators import k3_kl, rloo_advantages
from posttrain.testing import ContractFailure, check_estimator, contract_findings
from tests.arena import planted


def test_forms_are_read_from_the_signature() -> None:
    assert subject("f", rloo_advantages).form is Form.GROUPED
    assert registered(Kind.ADVANTAGE, "reinforce_pp").form is Form.TOKEN
    assert registered(Kind.ADVANTAGE, "reinforce_pp_baseline").form is Form.GROUPED_MASKED
    assert subject("f", planted.ppo_clip_wrong_side).kind is Kind.LOSS  # inferred from logp_old
    assert subject("f", functools.partial(k3_kl, log_ratio_clamp=None)).kind is Kind.KL
    with pytest.raises(DomainError, match="accepted: f\\(rewards"):
        subject("f", lambda a, b, c: a, "advantage")
    with pytest.raises(DomainError, match="kind: expected one of"):
        subject("f", rloo_advantages, "value")
    with pytest.raises(DomainError, match="keyword options"):
        subject("f", lambda rewards, *, q: rewards, "advantage")


def test_load_function_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import not_a_module_anywhere\n")
    (tmp_path / "fine.py").write_text("X = 3\ndef adv(rewards):\n    return rewards - rewards.mean(-1, keepdim=True)\n")
    for spec, needle in (
        (f"{tmp_path}/broken.py:adv", "does not import"),
        (f"{tmp_path}/fine.py:nothing", "has no name"),
        (f"{tmp_path}/fine.py:X", "not a function"),
        ("no_such_module_xyz:f", "does not import"),
        ("missing-colon", "expected 'module:function'"),
    ):
        with pytest.raises(DomainError, match=needle) as info:
            load_function(spec)
        assert "\n" not in str(info.value)
    assert load_function(f"{tmp_path}/fine.py:adv")[1](torch.tensor([[1.0, 0.0]])).tolist() == [[0.5, -0.5]]


def test_token_rewards_sit_on_the_last_valid_token() -> None:
    mask = torch.tensor([[True, True, False], [True, False, True], [False, False, False]])
    out = last_token_rewards(torch.tensor([[2.0, 3.0, 4.0]]), mask)
    assert out.tolist() == [[0.0, 2.0, 0.0], [0.0, 0.0, 3.0], [0.0, 0.0, 0.0]]
    s = registered(Kind.ADVANTAGE, "rloo")
    assert advantage_tokens(s, torch.tensor([[1.0, 0.0]]), torch.ones(2, 2, dtype=torch.bool)).tolist() == [
        [1.0, 1.0],
        [-1.0, -1.0],
    ]


def test_contract_findings_keep_check_estimator_messages() -> None:
    def sloppy(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (values * mask).sum(-1)

    def make(dtype: torch.dtype) -> dict[str, torch.Tensor]:
        m = torch.ones(3, 4, dtype=torch.bool)
        m[0, 2:] = False
        return {"values": torch.randn(3, 4, generator=torch.Generator().manual_seed(0), dtype=dtype), "mask": m}

    found = contract_findings(sloppy, make, output_shape=(3,), check_annotations=False)
    items = {f.item for f in found}
    assert {"masked", "rank", "input-dtype", "empty-mask"} <= items and "finite" not in items
    with pytest.raises(ContractFailure) as info:
        check_estimator(sloppy, make, output_shape=(3,), check_annotations=False)
    assert str(info.value).count("\n  - ") == len(found)  # one line per finding, as before
    only = contract_findings(sloppy, make, output_shape=(3,), items={"masked"}, check_annotations=False)
    assert only and {f.item for f in only} == {"masked"}
    with pytest.raises(DomainError, match="items"):
        contract_findings(sloppy, make, items={"nonsense"})


@pytest.mark.parametrize(
    ("kind", "name", "holds", "fails"),
    [
        (Kind.ADVANTAGE, "grpo", {"shift", "scale-invariant", "zero-sum", "constant-zero"}, {"scale-linear"}),
        (Kind.ADVANTAGE, "drgrpo", {"shift", "scale-linear", "groups-independent"}, {"scale-invariant"}),
        (Kind.ADVANTAGE, "reinforce_pp_baseline", {"padding", "shift", "permutation"}, {"groups-independent"}),
        (Kind.LOSS, "ppo_clip", {"restoring", "on-policy", "sign", "rows-independent"}, set()),
        (Kind.LOSS, "gspo", {"restoring", "padding", "on-policy"}, set()),
        (Kind.KL, "k1", {"zero-at-equal", "tokenwise"}, {"non-negative", "stationary-at-equal"}),
        (Kind.KL, "k2", {"non-negative", "stationary-at-equal"}, set()),
    ],
)
def test_the_package_estimators_have_their_known_properties(
    kind: Kind, name: str, holds: set[str], fails: set[str]
) -> None:
    s = registered(kind, name)
    props = {p.id: p for p in PROPERTIES[s.form]}
    for pid in holds | fails:
        found = search(s.fn, s.form, props[pid], max_examples=25)
        assert (found is None) == (pid in holds), (name, pid, found)


SMALL = CurveConfig(seeds=8, steps=12)


def test_identical_methods_are_indistinguishable_and_runs_are_deterministic() -> None:
    rloo = registered(Kind.ADVANTAGE, "rloo")
    a, b = run_curves(rloo, independent=True, cfg=SMALL), run_curves(rloo, independent=True, cfg=SMALL)
    assert torch.equal(a.reward, b.reward)
    looped = run_curves(rloo, independent=False, cfg=SMALL)  # seed by seed: the same numbers
    torch.testing.assert_close(looped.reward, a.reward, rtol=1e-12, atol=1e-12)
    results = judge_curves(a, {"rloo": b}, Kind.ADVANTAGE, SMALL)
    assert {r.verdict for r in results} == {"indistinguishable"}
    assert all(r.estimate == 0.0 and r.mde > 0 for r in results)


def test_an_advantage_with_the_wrong_sign_is_judged_worse() -> None:
    """The verdict can fail: negated RLOO advantages push probability away from the correct answers."""
    wrong = subject("negated", lambda rewards: -rloo_advantages(rewards))
    cfg = CurveConfig(seeds=16, steps=25)
    mine = run_curves(wrong, independent=True, cfg=cfg)
    base = run_curves(registered(Kind.ADVANTAGE, "rloo"), independent=True, cfg=cfg)
    verdicts = {r.endpoint: r.verdict for r in judge_curves(mine, {"rloo": base}, Kind.ADVANTAGE, cfg)}
    assert verdicts["final reward"] == "worse", verdicts
    better = {r.endpoint: r.verdict for r in judge_curves(base, {"negated": mine}, Kind.ADVANTAGE, cfg)}
    assert better["final reward"] == "better", better


def test_summary_fits_80_columns() -> None:
    from posttrain.arena.conventions import run_conventions
    from posttrain.arena.report import ArenaReport, Cost
    from posttrain.arena.summary import print_summary

    s = subject("tests/arena/planted.py:loo_with_self_with_a_long_name", planted.loo_with_self)
    cfg = CurveConfig(seeds=4, steps=3)
    mine, base = (
        run_curves(s, independent=True, cfg=cfg),
        run_curves(registered(Kind.ADVANTAGE, "rloo"), independent=True, cfg=cfg),
    )
    report = ArenaReport(
        s.name, "advantage", s.form.value, s.signature, ("rloo",), run_contract(s, max_examples=10),
        run_conventions(s, max_examples=20), {}, {}, {}, cfg, {s.name: mine.reward.mean(-1).tolist()},
        {}, judge_curves(mine, {"rloo": base}, Kind.ADVANTAGE, cfg), {}, Cost(1.0, 2.0, (0.5, 0.5, 0.5)),
    )  # fmt: skip
    buf = io.StringIO()
    print_summary(report, console=Console(file=buf, width=120, force_terminal=False))
    lines = buf.getvalue().splitlines()
    assert lines and max(len(line) for line in lines) <= 80, max(lines, key=len)
    assert len(lines) <= 40
    assert dataclasses.asdict(report)["name"] == s.name
