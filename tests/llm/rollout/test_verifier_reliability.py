"""Rewards that could not be computed are never 0, and digits mean the same thing everywhere.

Math-Verify: when no worker is ready the verdict waits (within ``ready_budget_s``) for one instead of
returning 0; a worker killed mid-verdict is replaced, never an ``EOFError``; a verdict still not
reached is NaN (``Verdict.judged`` False), ``None`` for TRL. Digits: only ASCII 0-9 count as digits
in every task and verifier; the Unicode minus sign U+2212 is a minus.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time

import pytest

from posttrain.llm.adapters.rewards import compute_score, task_reward, verifier_reward
from posttrain.llm.rollout.tasks import Problem, make_task
from posttrain.llm.rollout.verifiers import MathVerifier, Verdict, last_number, numeric_match

pytest.importorskip("math_verify", reason="needs math-verify")

SLOW = "\\boxed{9^{9^{9^{9}}}}"  # Math-Verify takes far longer than the deadline on this one


@pytest.mark.slow
def test_verdict_waits_for_a_worker_instead_of_scoring_zero() -> None:
    """Two slow completions kill both workers; the next correct answers are still judged correct."""
    verifier = MathVerifier(deadline_s=1.0, workers=2, ready_budget_s=120.0)
    try:
        verifier.warm_up()
        slow = [verifier.verdict(SLOW, "1") for _ in range(2)]
        assert all(v.status == "timeout" for v in slow), slow
        verdicts = [verifier.verdict(f"\\boxed{{{i}}}", str(i)) for i in range(6)]
        assert [v.reward for v in verdicts] == [1.0] * 6, verdicts
        assert all(v.judged for v in verdicts)
    finally:
        verifier.close()


def test_unjudged_verdict_is_nan_never_zero() -> None:
    verifier = MathVerifier(deadline_s=1.0, workers=1, ready_budget_s=0.01, budget_s=0.01)  # no time to start one
    try:
        v = verifier.verdict("\\boxed{3}", "3")
        assert v.status == "unavailable" and not v.judged and math.isnan(v.reward)
        assert math.isnan(verifier("\\boxed{3}", "3"))
    finally:
        verifier.close()
    assert Verdict(0.0, "ok").judged and Verdict(1.0, "ok").judged


@pytest.mark.slow
def test_worker_killed_mid_verdict_never_raises() -> None:
    verifier = MathVerifier(deadline_s=3.0, workers=2, ready_budget_s=120.0)
    try:
        verifier.warm_up()
        serving = verifier.pids[0]

        def kill_soon() -> None:
            time.sleep(0.5)
            os.kill(serving, signal.SIGKILL)

        threading.Thread(target=kill_soon, daemon=True).start()
        v = verifier.verdict(SLOW, "1")  # killed mid-verdict at 0.5 s; the spare then times out on it
        assert v.status in {"worker_died", "timeout"} and not v.judged and math.isnan(v.reward)
        assert verifier.verdict("\\boxed{2}", "2") == Verdict(1.0, "ok")  # a replacement serves
    finally:
        verifier.close()


def test_trl_reward_is_none_and_verl_score_flags_an_unjudged_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    import posttrain.llm.adapters.rewards as rewards

    monkeypatch.setattr(rewards, "scorer", lambda name, **_: lambda c, g: math.nan if "?" in c else 1.0)
    out = verifier_reward("math")(prompts=["q", "q"], completions=["?", "1"], answer=["1", "1"])
    assert out == [None, 1.0]
    with pytest.warns(RuntimeWarning, match="not judged"):
        assert compute_score("math", "?", "1") == 0.0  # verl has no per-sample exclusion: 0 with a warning


@pytest.mark.parametrize("text", ["²", "①", "٤٢", "４２", "14²", "1٤"])
def test_multiple_task_rejects_non_ascii_digits_without_raising(text: str) -> None:
    task = make_task("multiple")
    problem = Problem("m7<50:", "7", (7, 50))
    assert task.reward(problem, text) == 0.0
    assert task_reward("multiple")(prompts=["m7<50:"], completions=[text], answer=["7"], data=[[7, 50]]) == [0.0]
    info = {"prompt": "m7<50:", "data": [7, 50]}
    assert compute_score("posttrain/multiple", text, "7", info) == 0.0


def test_countdown_and_addition_accept_only_ascii_digits() -> None:
    countdown = make_task("countdown")
    problem = Problem("3,5,7>22:", "3*5+7", (3, 5, 7))
    assert countdown.reward(problem, "3*5+7") == 1.0
    assert countdown.reward(problem, "３*5+7") == 0.0  # full-width 3
    assert countdown.reward(problem, "٣*5+7") == 0.0  # Arabic-Indic 3
    addition = make_task("addition")
    assert addition.reward(Problem("1+2=", "3", (1, 2)), "３") == 0.0


def test_numeric_match_reads_ascii_digits_and_the_unicode_minus() -> None:
    assert numeric_match("−42", "42") == 0.0  # U+2212 is a minus sign
    assert numeric_match("−42", "-42") == 1.0
    assert numeric_match("４２", "42") == 0.0  # full-width digits are not a number here
    assert numeric_match("٤٢", "42") == 0.0  # Arabic-Indic digits
    assert numeric_match("x = 4²", "4") == 0.0  # a superscript is not ignored into a match
    assert last_number("so −3.5") == -3.5
    assert numeric_match("x = 42", "42") == 1.0
