"""Arithmetic asked in words for pretrained chat models: sums and products of several numbers, binary or partial credit.

``chat_arithmetic`` generalises ``chat_addition`` (`posttrain.llm.rollout.tasks.ChatAddition`): ``terms``
numbers, the last one from its own range, joined by ``op``. The reply's last number (the one number
grammar of `posttrain.llm.rollout.numbers`) is scored against the value: 1 when equal; with ``partial``,
otherwise the share of the value's digits that the reply's number has in the same place, counted from
the right over the longer of the two (`digit_credit`), so a reward is graded instead of 0/1 (reward
granularity is what decides, e.g., whether designed preference pairs are ties).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from posttrain.errors import DomainError
from posttrain.llm.rollout.numbers import last_number
from posttrain.llm.rollout.problem import Problem

__all__ = ["ChatArithmetic", "digit_credit"]


def digit_credit(value: float | None, answer: int) -> float:
    """Share of the digits of ``answer`` that ``value`` matches place by place (right-aligned, over the longer one).

    1 only for ``value == answer``; 0 for no number, a negative or a non-integer value.

    Examples:
        >>> digit_credit(85.0, 85), digit_credit(95.0, 85), digit_credit(5.0, 85), digit_credit(None, 85)
        (1.0, 0.5, 0.5, 0.0)
        >>> digit_credit(185.0, 85), digit_credit(85.5, 85)
        (0.6666666666666666, 0.0)
    """
    if value is None or not math.isfinite(value) or value < 0 or value != int(value):
        return 0.0
    got, want = str(int(value)), str(answer)
    width = max(len(got), len(want))
    got, want = got.rjust(width, " "), want.rjust(width, " ")
    return sum(a == b for a, b in zip(got, want, strict=True)) / width


@dataclass(frozen=True)
class ChatArithmetic:
    """``template`` over ``terms`` numbers uniform on ``[low, high]`` (the last on ``[low_last, high_last]``) joined
    by ``op``; reward 1 when the reply's last number is the value, else 0 (or `digit_credit` with ``partial``)."""

    op: Literal["+", "*"] = "*"
    terms: int = 2
    low: int = 10
    high: int = 99
    low_last: int | None = None
    high_last: int | None = None
    partial: bool = False
    template: str = "What is {expression}? Answer with just the number."

    def __post_init__(self) -> None:
        if self.op not in ("+", "*"):
            raise DomainError(f"data.options.op: expected '+' or '*', got {self.op!r}")
        if not 2 <= self.terms <= 8:
            raise DomainError(f"data.options.terms: expected 2..8 numbers, got {self.terms!r}")
        lo_last = self.low if self.low_last is None else self.low_last
        hi_last = self.high if self.high_last is None else self.high_last
        if not (0 <= self.low <= self.high and 0 <= lo_last <= hi_last):
            raise DomainError(
                f"data.options: expected 0 <= low <= high and 0 <= low_last <= high_last, got {self.low}..{self.high}, "
                f"{lo_last}..{hi_last}"
            )
        if "{expression}" not in self.template:
            raise DomainError(f"data.options.template: expected an '{{expression}}' field, got {self.template!r}")

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        lo_last = self.low if self.low_last is None else self.low_last
        hi_last = self.high if self.high_last is None else self.high_last
        out = []
        for _ in range(n):
            nums = [rng.randint(self.low, self.high) for _ in range(self.terms - 1)] + [rng.randint(lo_last, hi_last)]
            value = math.prod(nums) if self.op == "*" else sum(nums)
            text = self.template.format(expression=self.op.join(map(str, nums)))
            out.append(Problem(text, str(value), tuple(nums)))
        return out

    def reward(self, problem: Problem, completion: str) -> float:
        value = last_number(completion)
        if not self.partial:
            return float(value is not None and value == float(problem.answer))
        return digit_credit(value, int(problem.answer))

    def solution(self, problem: Problem, rng: random.Random) -> str:
        return problem.answer
