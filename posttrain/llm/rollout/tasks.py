"""Synthetic verifiable tasks that know their exact answers, plus a JSONL task for real data.

Each task samples :class:`Problem`s from an explicit ``random.Random``, scores a completion
(reward in ``[0, 1]``; nothing is executed, expressions are parsed by a 30-line parser), and
produces a correct reference solution for the supervised warm-up. Prompts and answers use only
characters of :data:`posttrain.llm.tools.tiny.ALPHABET`.

- ``addition``: ``"37+485="`` → ``"522"`` (multi-digit arithmetic, one answer).
- ``countdown``: ``"3,5,7>22:"`` → an expression over + - * using each number exactly once that
  equals the target (``"3*5+7"``; several answers).
- ``multiple``: ``"m7<50:"`` → any positive multiple of 7 below 50 (several answers).
- ``jsonl``: ``{"prompt": ..., "answer": ...}`` lines from a file, scored by a named verifier.
- ``chat_addition``: ``"What is 37+48? Answer with just the number."`` → a reply whose last number
  is 85: a question in words for pretrained chat models (not limited to the tiny alphabet).

Tasks are registered under ``registry("task")``; :func:`make_task` builds one by name.
"""

from __future__ import annotations

import inspect
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from posttrain.errors import DomainError
from posttrain.llm.rollout.verifiers import VERIFIERS, last_number
from posttrain.registry import registry

__all__ = ["TASKS", "Problem", "Task", "evaluate_expression", "make_task"]

TASKS = registry("task")


@dataclass(frozen=True)
class Problem:
    """A prompt, the gold answer used for scoring, and task data (e.g. countdown's numbers)."""

    prompt: str
    answer: str
    data: tuple[int, ...] = ()


class Task(Protocol):
    """Samples problems, scores completions, and writes one correct solution."""

    def sample(self, rng: random.Random, n: int) -> list[Problem]: ...

    def reward(self, problem: Problem, completion: str) -> float: ...

    def solution(self, problem: Problem, rng: random.Random) -> str: ...


_TOKEN = re.compile(r"\d+|[+\-*]")


def evaluate_expression(text: str, *, max_len: int = 64) -> tuple[int, list[int]] | None:
    """Value and operands of an expression of non-negative integers with ``+ - *`` (usual precedence).

    Returns None for anything else (other characters, a dangling operator, too long). Never
    evaluates code: a tokeniser and one pass that folds products before sums.

    Example:
        >>> evaluate_expression("3*5+7"), evaluate_expression("2+3*4-1"), evaluate_expression("2+")
        ((22, [3, 5, 7]), (13, [2, 3, 4, 1]), None)
    """
    if not text or len(text) > max_len or "".join(_TOKEN.findall(text)) != text:
        return None
    tokens = _TOKEN.findall(text)
    if len(tokens) % 2 == 0 or any(t.isdigit() != (i % 2 == 0) for i, t in enumerate(tokens)):
        return None
    operands = [int(t) for t in tokens[::2]]
    total, sign, product = 0, 1, operands[0]
    for op, value in zip(tokens[1::2], operands[1:], strict=True):
        if op == "*":
            product *= value
        else:
            total += sign * product
            sign, product = (1 if op == "+" else -1), value
    return total + sign * product, operands


@dataclass(frozen=True)
class Addition:
    """``a+b=`` with ``a, b`` uniform on ``[0, 10^digits)``; reward 1 for the exact sum."""

    digits: int = 2

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        hi = 10**self.digits
        pairs = [(rng.randrange(hi), rng.randrange(hi)) for _ in range(n)]
        return [Problem(f"{a}+{b}=", str(a + b), (a, b)) for a, b in pairs]

    def reward(self, problem: Problem, completion: str) -> float:
        return float(completion.strip() == problem.answer)

    def solution(self, problem: Problem, rng: random.Random) -> str:
        return problem.answer


@dataclass(frozen=True)
class Countdown:
    """Reach the target with ``+ - *`` using each of ``count`` numbers in ``[1, high]`` exactly once."""

    count: int = 3
    high: int = 9

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        out = []
        for _ in range(n):
            nums = [rng.randint(1, self.high) for _ in range(self.count)]
            expr = "".join(f"{x}{rng.choice('+-*')}" for x in nums[:-1]) + str(nums[-1])
            value = evaluate_expression(expr)
            assert value is not None  # built from the grammar
            shown = sorted(nums)
            out.append(Problem(f"{','.join(map(str, shown))}>{value[0]}:", expr, tuple(shown)))
        return out

    def reward(self, problem: Problem, completion: str) -> float:
        parsed = evaluate_expression(completion.strip())
        if parsed is None:
            return 0.0
        value, operands = parsed
        target = int(problem.prompt.split(">")[1].rstrip(":"))
        return float(value == target and sorted(operands) == list(problem.data))

    def solution(self, problem: Problem, rng: random.Random) -> str:
        return problem.answer


@dataclass(frozen=True)
class Multiple:
    """``m{a}<{b}:``: any positive multiple of ``a`` below ``b`` is correct (several answers)."""

    low: int = 2
    high: int = 9
    bound: int = 60

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        out = []
        for _ in range(n):
            a = rng.randint(self.low, self.high)
            b = rng.randint(2 * a, self.bound)
            out.append(Problem(f"m{a}<{b}:", str(a), (a, b)))
        return out

    def reward(self, problem: Problem, completion: str) -> float:
        text = completion.strip()
        if not text.isdigit() or len(text) > 6:
            return 0.0
        a, b = problem.data
        return float(0 < int(text) < b and int(text) % a == 0)

    def solution(self, problem: Problem, rng: random.Random) -> str:
        a, b = problem.data
        return str(a * rng.randint(1, (b - 1) // a))


@dataclass(frozen=True)
class ChatAddition:
    """``template`` with ``a`` uniform on ``[low, high]`` and ``b`` on ``[low_b, high_b]`` (default: a's range).

    Reward 1 when the last number of the reply is ``a + b``: "85", "37 + 48 = 85" and "The answer is 85."
    score, a reply cut off before it gives the sum (or that ends on another number) does not.
    """

    low: int = 10
    high: int = 99
    low_b: int | None = None
    high_b: int | None = None
    template: str = "What is {a}+{b}? Answer with just the number."

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        lo_b = self.low if self.low_b is None else self.low_b
        hi_b = self.high if self.high_b is None else self.high_b
        pairs = [(rng.randint(self.low, self.high), rng.randint(lo_b, hi_b)) for _ in range(n)]
        return [Problem(self.template.format(a=a, b=b), str(a + b), (a, b)) for a, b in pairs]

    def reward(self, problem: Problem, completion: str) -> float:
        value = last_number(completion.replace(",", ""))
        return float(value is not None and value == float(problem.answer))

    def solution(self, problem: Problem, rng: random.Random) -> str:
        return problem.answer


@dataclass(frozen=True)
class JsonlTask:
    """Problems from a JSONL file (``prompt``, ``answer`` keys), scored by a registered verifier."""

    path: str
    verifier: str = "numeric"

    def __post_init__(self) -> None:
        object.__setattr__(self, "_problems", self._load())
        factory: Any = VERIFIERS.get(self.verifier)
        object.__setattr__(self, "_score", factory())

    def _load(self) -> list[Problem]:
        p = Path(self.path)
        if not p.is_file():
            raise DomainError(f"path: no JSONL file at {self.path!r}")
        rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        if not rows or any(not {"prompt", "answer"} <= set(r) for r in rows):
            raise DomainError(f"path: every line of {self.path!r} needs 'prompt' and 'answer' keys")
        return [Problem(str(r["prompt"]), str(r["answer"])) for r in rows]

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        problems: list[Problem] = self._problems  # type: ignore[attr-defined]
        return [problems[rng.randrange(len(problems))] for _ in range(n)]

    def reward(self, problem: Problem, completion: str) -> float:
        score: Callable[[str, str], float] = self._score  # type: ignore[attr-defined]
        return float(score(completion, problem.answer))

    def solution(self, problem: Problem, rng: random.Random) -> str:
        return problem.answer


TASKS.add("addition", Addition, summary="Multi-digit addition a+b= (exact answer).")
TASKS.add("countdown", Countdown, summary="Reach a target with + - * using each number once (several answers).")
TASKS.add("multiple", Multiple, summary="Name a positive multiple of a below b (several answers).")
TASKS.add("chat_addition", ChatAddition, summary="'What is a+b?' in words for chat models; the reply's last number is scored.")
TASKS.add("jsonl", JsonlTask, summary="Prompt/answer pairs from a JSONL file, scored by a named verifier.")


def make_task(name: str, **options: Any) -> Task:
    """Build the task registered as ``name`` with its options (unknown options raise ``DomainError``)."""
    factory: Any = TASKS.get(name)
    valid = list(inspect.signature(factory).parameters)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise DomainError(
            f"data.options: unknown option(s) {', '.join(unknown)} for task {name!r}; valid: {', '.join(valid)}"
        )
    return factory(**options)  # type: ignore[no-any-return]
