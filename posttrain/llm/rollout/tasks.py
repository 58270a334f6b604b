"""Synthetic verifiable tasks that know their exact answers, plus a JSONL task for real data.

Each task samples `Problem`s from an explicit ``random.Random``, scores a completion
(reward in ``[0, 1]``; nothing is executed, expressions are parsed by a 30-line parser), and
produces a correct reference solution for the supervised warm-up. Prompts and answers use only
characters of `posttrain.llm.tools.tiny.ALPHABET`.

- ``addition``: ``"37+485="`` → ``"522"`` (multi-digit arithmetic, one answer).
- ``countdown``: ``"3,5,7>22:"`` → an expression over + - * using each number exactly once that
  equals the target (``"3*5+7"``; several answers).
- ``multiple``: ``"m7<50:"`` → any positive multiple of 7 below 50 (several answers).
- ``mixture``: several of these as labelled domains (`Problem.domain`), e.g. addition and multiple.
- ``jsonl``: ``{"prompt": ..., "answer": ...}`` lines from a file, scored by a named verifier.
- ``dataset``: rows of a local JSON / JSONL / parquet file through ``datasets``, with a column mapping.
- ``chat_addition``: ``"What is 37+48? Answer with just the number."`` → a reply whose last number
  is 85: a question in words for pretrained chat models (not limited to the tiny alphabet).
- ``chat_arithmetic``: sums or products of several numbers in words, binary or digit-wise partial credit
  (`posttrain.llm.rollout.chat_tasks`).

Tasks are registered under ``registry("task")``; `make_task` builds one by name.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any

from posttrain.errors import DomainError
from posttrain.llm.rollout.chat_tasks import ChatArithmetic
from posttrain.llm.rollout.file_tasks import DATASET_FORMATS, DatasetTask, JsonlTask
from posttrain.llm.rollout.problem import Problem, Task
from posttrain.llm.rollout.verifiers import last_number
from posttrain.registry import registry

__all__ = ["DATASET_FORMATS", "TASKS", "DatasetTask", "Problem", "Task", "evaluate_expression", "make_task"]

TASKS = registry("task")


_TOKEN = re.compile(r"[0-9]+|[+\-*]")  # ASCII digits only (see posttrain.llm.rollout.verifiers)
_ANSWER = re.compile(r"[0-9]{1,6}")


def evaluate_expression(text: str, *, max_len: int = 64) -> tuple[int, list[int]] | None:
    """Value and operands of an expression of non-negative integers with ``+ - *`` (usual precedence).

    Returns None for anything else (other characters, a dangling operator, too long). Never
    evaluates code: a tokeniser and one pass that folds products before sums.

    Examples:
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
        if not _ANSWER.fullmatch(text):  # str.isdigit() would accept '²' and '①', which int() rejects
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
        value = last_number(completion)  # the one number grammar: "1,000" is 1000, "1,2" is 2 (not 12)
        return float(value is not None and value == float(problem.answer))

    def solution(self, problem: Problem, rng: random.Random) -> str:
        return problem.answer


@dataclass(frozen=True)
class Mixture:
    """Problems of several registered tasks, each labelled with its domain (multi-teacher routing).

    ``tasks`` maps a domain name to a task name or to ``{"task": name, "options": {...}}``;
    ``weights`` are the sampler's ratios by domain name (default: equal; a domain left out gets 0). A problem
    draws its domain, then one problem of that domain's task, which scores and solves it. The
    task's `domains` are the names in the order given; `Problem.domain` is the index.
    """

    tasks: dict[str, Any]
    weights: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.tasks, dict) or not self.tasks:
            raise DomainError(f"data.options.tasks: expected a non-empty mapping domain -> task, got {self.tasks!r}")
        parts = []
        for name, entry in self.tasks.items():
            spec = {"task": entry} if isinstance(entry, str) else entry
            if not isinstance(spec, dict) or not isinstance(spec.get("task"), str) or set(spec) - {"task", "options"}:
                raise DomainError(
                    f"data.options.tasks.{name}: expected a task name or {{task: name, options: {{...}}}}, got {entry!r}"
                )
            if spec["task"] == "mixture" or spec["task"] not in TASKS.names():
                valid = ", ".join(n for n in TASKS.names() if n != "mixture")
                raise DomainError(f"data.options.tasks.{name}: unknown task {spec['task']!r}; valid: {valid}")
            parts.append(make_task(spec["task"], **dict(spec.get("options") or {})))
        unknown = sorted(set(self.weights) - set(self.tasks))
        if unknown:
            raise DomainError(f"data.options.weights: unknown domain(s) {unknown}; domains: {list(self.tasks)}")
        ratios = [float(self.weights.get(n, 1.0 if not self.weights else 0.0)) for n in self.tasks]
        if any(not math.isfinite(r) or r < 0 for r in ratios) or not sum(ratios) > 0:
            raise DomainError(f"data.options.weights: expected non-negative ratios, not all 0, got {self.weights!r}")
        object.__setattr__(self, "_parts", tuple(parts))
        object.__setattr__(self, "_ratios", tuple(ratios))

    @property
    def domains(self) -> tuple[str, ...]:
        """The domain names, in the order of ``tasks``."""
        return tuple(self.tasks)

    def _part(self, problem: Problem) -> Any:
        parts: tuple[Any, ...] = self._parts  # type: ignore[attr-defined]
        if problem.domain is None or not 0 <= problem.domain < len(parts):
            raise DomainError(f"problem.domain: expected an index in [0, {len(parts)}), got {problem.domain!r}")
        return parts[problem.domain]

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        parts: tuple[Any, ...] = self._parts  # type: ignore[attr-defined]
        picks = rng.choices(range(len(parts)), weights=self._ratios, k=n)  # type: ignore[attr-defined]
        return [dataclasses.replace(parts[d].sample(rng, 1)[0], domain=d) for d in picks]

    def reward(self, problem: Problem, completion: str) -> float:
        return float(self._part(problem).reward(problem, completion))

    def rewards(self, problems: list[Problem], completions: list[str]) -> list[float]:
        """One reward per completion, each domain's completions scored together (its task's batch ``rewards``
        where it has one: a verifier's budget then covers the domain's whole batch)."""
        out = [math.nan] * len(problems)
        by_domain: dict[int, list[int]] = {}
        for i, p in enumerate(problems):
            self._part(p)  # checks the domain index
            by_domain.setdefault(int(p.domain), []).append(i)  # type: ignore[arg-type]
        parts: tuple[Any, ...] = self._parts  # type: ignore[attr-defined]
        for d, rows in by_domain.items():
            part = parts[d]
            batch = getattr(part, "rewards", None)
            ps, cs = [problems[i] for i in rows], [completions[i] for i in rows]
            got = batch(ps, cs) if batch is not None else [part.reward(p, c) for p, c in zip(ps, cs, strict=True)]
            for i, r in zip(rows, got, strict=True):
                out[i] = float(r)
        return out

    def solution(self, problem: Problem, rng: random.Random) -> str:
        return str(self._part(problem).solution(problem, rng))


TASKS.add("addition", Addition, summary="Multi-digit addition a+b= (exact answer).")
TASKS.add("countdown", Countdown, summary="Reach a target with + - * using each number once (several answers).")
TASKS.add("multiple", Multiple, summary="Name a positive multiple of a below b (several answers).")
TASKS.add(
    "chat_addition", ChatAddition, summary="'What is a+b?' in words for chat models; the reply's last number is scored."
)
TASKS.add(
    "chat_arithmetic",
    ChatArithmetic,
    summary="Sums or products of several numbers in words; binary or digit-wise credit.",
)
TASKS.add("mixture", Mixture, summary="Several tasks as labelled domains (sampler weights), for multi-teacher routing.")
TASKS.add("jsonl", JsonlTask, summary="Prompt/answer pairs from a JSONL file, scored by a named verifier.")
TASKS.add(
    "dataset",
    DatasetTask,
    summary="Prompts from a local JSON/JSONL/parquet file (datasets), a column mapping; a verifier or data.reward scores.",
)


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
