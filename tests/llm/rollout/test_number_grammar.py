"""One number grammar for every verifier: the numeric verifier and Math-Verify read the same number.

Findings covered: Math-Verify scoring "−42" (U+2212) 0 against -42; ``numeric_match`` scoring "1e5000" 1.0
against gold 0 (the exponent cut, the leftover 0 read) and "1,000" 0 against 1000; the chat task reading
"1,2" as 12; Math-Verify reading "1e3" as 1 and "3,5" as 3.5.
"""

from __future__ import annotations

import pytest

from posttrain.llm.rollout.numbers import last_number, normalize_numbers, number_tokens
from posttrain.llm.rollout.tasks import Problem, make_task
from posttrain.llm.rollout.verifiers import numeric_match

READINGS = [  # text, the number the grammar reads (None: no number)
    ("−42", -42.0),
    ("\ufe6342", -42.0),
    ("the answer is 1,000.", 1000.0),
    ("1,000,000", 1e6),
    ("-1,234.5", -1234.5),
    ("$1{,}000$", 1000.0),
    ("3,5", 5.0),
    ("12,34", 34.0),
    ("1,0000", 0.0),
    ("1e3", 1000.0),
    ("2.5e-3", 0.0025),
    ("x = 1e5000", None),
    ("1e5000", None),
    ("-1E400", None),
    ("9" * 70, None),
    ("x²", None),
    ("no number", None),
]


@pytest.mark.parametrize(("text", "value"), READINGS)
def test_the_grammar_reads_each_number_whole(text: str, value: float | None) -> None:
    assert last_number(text) == value


def test_a_huge_exponent_is_never_cut_to_a_shorter_number() -> None:
    assert number_tokens("1e5000") == ["1e5000"]
    assert numeric_match("1e5000", "0") == 0.0  # was 1.0: "1e500" then "0"
    assert numeric_match("1e5000", "1e5000") == 0.0  # beyond the float range: not read as a number


def test_numeric_match_reads_thousands_and_the_unicode_minus() -> None:
    assert numeric_match("1,000", "1000") == 1.0
    assert numeric_match("1,000", "1,000") == 1.0
    assert numeric_match("−42", "-42") == 1.0 and numeric_match("−42", "42") == 0.0
    assert numeric_match("3,5", "3.5") == 0.0 and numeric_match("3,5", "5") == 1.0


def test_the_scan_window_never_cuts_a_number() -> None:
    text = "x" * 20 + "123456"
    assert last_number(text, max_chars=3) is None  # "456" is the tail of 123456, not a number
    assert last_number(text, max_chars=6) == 123456.0


def test_chat_addition_reads_the_grammar_not_a_comma_free_text() -> None:
    task = make_task("chat_addition")
    problem = Problem("What is 10+2?", "12")
    assert task.reward(problem, "1,2") == 0.0  # was 1.0: commas removed, "12" read
    assert task.reward(problem, "It is 12.") == 1.0
    big = Problem("What is 990+10?", "1000")
    assert task.reward(big, "1,000") == 1.0


def test_normalized_text_keeps_what_the_grammar_reads() -> None:
    for text, value in READINGS:
        if value is not None and "$" not in text:
            assert last_number(normalize_numbers(text).replace("\\cdot 10^", "e").replace("{", "").replace("}", "")
                               .replace("\\(", "").replace("\\)", "")) == value, text  # fmt: skip


CROSS = [  # completion, gold, the expected verdict of every verifier
    ("−42", "-42", True),
    ("The answer is −42", "-42", True),
    ("1,000", "1000", True),
    ("\\boxed{1,000}", "1000", True),
    ("1,000,000", "1000000", True),
    ("$1{,}000$", "1000", True),
    ("1e3", "1000", True),
    ("x = 2.5e-3", "0.0025", True),
    ("1e5000", "0", False),
    ("1e5000", "1", False),
    ("3,5", "3.5", False),
    ("3,5", "5", True),
    ("12,34", "12.34", False),
]


@pytest.mark.parametrize(("completion", "gold", "expected"), CROSS)
def test_numeric_and_math_verify_agree(completion: str, gold: str, expected: bool) -> None:
    math_verify = pytest.importorskip("math_verify", reason="needs math-verify")
    assert bool(numeric_match(completion, gold)) is expected
    g = math_verify.parse(normalize_numbers(gold), parsing_timeout=None)
    p = math_verify.parse(normalize_numbers(completion), parsing_timeout=None)
    assert bool(p) and math_verify.verify(g, p, timeout_seconds=None) is expected, (p, g)
