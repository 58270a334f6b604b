"""``chat_arithmetic``: sums and products in words, binary or digit-wise credit."""

from __future__ import annotations

import random

import pytest

from posttrain.errors import DomainError
from posttrain.llm.rollout.chat_tasks import digit_credit
from posttrain.llm.rollout.tasks import make_task


def test_values_and_scores():
    task = make_task("chat_arithmetic", op="+", terms=3, low=10, high=99)
    for p in task.sample(random.Random(0), 20):
        assert int(p.answer) == sum(p.data) and len(p.data) == 3
        assert task.reward(p, f"The answer is {p.answer}.") == 1.0 and task.reward(p, "no idea") == 0.0
    mul = make_task("chat_arithmetic", op="*", low_last=2, high_last=9)
    for p in mul.sample(random.Random(1), 20):
        assert int(p.answer) == p.data[0] * p.data[1] and 2 <= p.data[1] <= 9


def test_partial_credit_is_one_only_for_the_exact_value():
    task = make_task("chat_arithmetic", op="+", partial=True)
    p = task.sample(random.Random(0), 1)[0]
    assert task.reward(p, p.answer) == 1.0
    wrong = str(int(p.answer) + 1)
    assert 0.0 <= task.reward(p, wrong) < 1.0
    assert digit_credit(1234.0, 1234) == 1.0 and digit_credit(1200.0, 1234) == 0.5 and digit_credit(-5.0, 5) == 0.0


@pytest.mark.parametrize("bad", [{"op": "/"}, {"terms": 1}, {"low": 5, "high": 2}, {"template": "no field"}])
def test_bad_options_raise(bad: dict):
    with pytest.raises(DomainError):
        make_task("chat_arithmetic", **bad)
