"""Synthetic tasks know their answers; verifiers never execute input and always meet their deadline."""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from posttrain.errors import DomainError
from posttrain.llm.rollout.tasks import TASKS, evaluate_expression, make_task
from posttrain.llm.rollout.verifiers import VERIFIERS, MathVerifier, exact_match, last_number, numeric_match
from posttrain.llm.tools.tiny import ALPHABET


@pytest.mark.parametrize("name", ["addition", "countdown", "multiple"])
def test_reference_solutions_score_one_and_use_the_vocabulary(name: str) -> None:
    task = make_task(name)
    rng = random.Random(0)
    problems = task.sample(rng, 200)
    for p in problems:
        sol = task.solution(p, rng)
        assert task.reward(p, sol) == 1.0, (p, sol)
        assert set(p.prompt + sol) <= set(ALPHABET)
    assert task.sample(random.Random(1), 5) == task.sample(random.Random(1), 5)  # explicit RNG: reproducible


def test_wrong_answers_score_zero() -> None:
    add, cd, mult = make_task("addition", digits=3), make_task("countdown"), make_task("multiple")
    p = add.sample(random.Random(0), 1)[0]
    assert add.reward(p, str(int(p.answer) + 1)) == 0.0 and add.reward(p, "") == 0.0
    q = cd.sample(random.Random(0), 1)[0]
    a, b, c = q.data
    assert cd.reward(q, f"{a}+{b}") == 0.0  # a number unused
    assert cd.reward(q, f"{a}+{b}+{c}+{c}") == 0.0  # a number reused
    assert cd.reward(q, "__import__('os')") == 0.0
    m = mult.sample(random.Random(0), 1)[0]
    k, bound = m.data
    assert mult.reward(m, str(k * ((bound - 1) // k))) == 1.0  # the largest valid multiple
    assert mult.reward(m, str(k * ((bound - 1) // k + 1))) == 0.0  # one step past the bound
    assert mult.reward(m, "0") == 0.0 and mult.reward(m, str(k + 1)) == 0.0
    with pytest.raises(DomainError, match=r"unknown option.* digit .*valid: digits"):
        make_task("addition", digit=2)


@given(st.lists(st.integers(0, 99), min_size=1, max_size=6), st.lists(st.sampled_from("+-*"), min_size=5, max_size=5))
def test_expression_parser_matches_python_precedence(nums: list[int], ops: list[str]) -> None:
    text = "".join(f"{n}{ops[i]}" for i, n in enumerate(nums[:-1])) + str(nums[-1])
    parsed = evaluate_expression(text)
    assert parsed is not None
    assert parsed[0] == eval(text)  # the test's reference only; the library never evaluates text
    assert parsed[1] == nums


@pytest.mark.parametrize("bad", ["", "1+", "+1", "1++2", "1/2", "(1)", "1 + 2", "2**3", "1" * 100])
def test_expression_parser_rejects(bad: str) -> None:
    assert evaluate_expression(bad) is None


def test_jsonl_task(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "2+2=", "answer": "4"}\n{"prompt": "1+2=", "answer": "3"}\n')
    task = make_task("jsonl", path=str(path), verifier="numeric")
    p = task.sample(random.Random(0), 1)[0]
    assert task.reward(p, f"it is {p.answer}") == 1.0 and task.reward(p, "5") == 0.0
    with pytest.raises(DomainError, match="no JSONL file"):
        make_task("jsonl", path=str(tmp_path / "missing.jsonl"))
    assert {"addition", "countdown", "multiple", "jsonl"} <= set(TASKS.names())
    assert {"exact", "numeric", "math"} <= set(VERIFIERS.names())


def test_exact_and_numeric() -> None:
    assert exact_match(" 12 ", "12") == 1.0 and exact_match("12.0", "12") == 0.0
    assert numeric_match("the answer is 0.1 + 0.2 = 0.30000000000000004", "0.3") == 1.0
    assert numeric_match("1e400", "1") == 0.0  # overflows to inf: no answer, not a crash
    assert last_number("9" * 100) is None  # absurdly long numbers are not answers
    assert numeric_match("x" * 1_000_000, "1") == 0.0


ADVERSARIAL = [
    "2**2**2**2**2**2",  # huge exponent tower
    "$10^{10^{10^{10}}}!$",
    "\\frac{" * 300 + "1" + "}{2}" * 300,  # deeply nested LaTeX
    "\\sqrt{" * 500 + "2" + "}" * 500,
    "(" * 2000 + "1" + ")" * 1999,
    "1" * 3999,  # long string just under the length cap
    "x" * 50_000,  # over the cap
    "__import__('os').system('touch PWNED')",  # code-looking strings
    "exec(\"open('PWNED','w')\")",
    "\\boxed{\\input{/etc/passwd}}",
]


@pytest.mark.slow
def test_math_verifier_deadline_on_adversarial_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every verdict returns within deadline + 0.5 s (time to kill a process); nothing is executed."""
    monkeypatch.chdir(tmp_path)
    deadline, ready = 1.5, 0.5  # a call may wait `ready` for a worker, then `deadline` for the verdict
    verifier = MathVerifier(deadline_s=deadline, workers=3, ready_budget_s=ready)
    try:
        verifier.warm_up()
        assert verifier("\\boxed{\\frac{1}{2}}", "0.5") == 1.0
        assert verifier("$x = 3$", "3") == 1.0
        assert verifier("$x = 4$", "3") == 0.0
        statuses = []
        for text in ADVERSARIAL:
            start = time.monotonic()
            v = verifier.verdict(text, "1")
            elapsed = time.monotonic() - start
            assert elapsed < ready + deadline + 0.5, (text[:40], v, elapsed)
            assert v.reward == 0.0 or (not v.judged and math.isnan(v.reward))  # never a reward > 0
            statuses.append(v.status)
        assert "too_long" in statuses
        assert not (tmp_path / "PWNED").exists()
    finally:
        verifier.close()
