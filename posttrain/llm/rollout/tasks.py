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

Tasks are registered under ``registry("task")``; `make_task` builds one by name.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from posttrain.errors import DomainError
from posttrain.llm.rollout.verifiers import VERIFIERS, last_number
from posttrain.registry import registry

__all__ = ["DATASET_FORMATS", "TASKS", "DatasetTask", "Problem", "Task", "evaluate_expression", "make_task"]

TASKS = registry("task")


@dataclass(frozen=True)
class Problem:
    """A prompt, the gold answer used for scoring, and task data (e.g. countdown's numbers)."""

    prompt: str
    answer: str
    data: tuple[int, ...] = ()
    columns: tuple[tuple[str, Any], ...] = ()
    """Extra dataset columns ``(name, value)`` (a reward function gets them as keyword lists)."""
    domain: int | None = None
    """Index of the problem's domain in its task's ``domains`` names (multi-teacher routing), or None."""


class Task(Protocol):
    """Samples problems, scores completions, and writes one correct solution."""

    def sample(self, rng: random.Random, n: int) -> list[Problem]: ...

    def reward(self, problem: Problem, completion: str) -> float: ...

    def solution(self, problem: Problem, rng: random.Random) -> str: ...


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
        value = last_number(completion.replace(",", ""))
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

    def solution(self, problem: Problem, rng: random.Random) -> str:
        return str(self._part(problem).solution(problem, rng))


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


DATASET_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}
"""``dataset`` task: the ``datasets`` builder of each file suffix (``format`` overrides it: json, jsonl, parquet)."""


def _load_rows(where: str, path: str, fmt: str | None) -> list[dict[str, Any]]:
    """Rows of a local JSON / JSONL / parquet file through ``datasets.load_dataset`` (no hub access)."""
    p = Path(path)
    if not p.is_file():
        raise DomainError(f"{where}: no file at {path!r}")
    builder = {"jsonl": "json", "json": "json", "parquet": "parquet"}.get(fmt or "") or DATASET_FORMATS.get(p.suffix)
    if builder is None:
        raise DomainError(
            f"{where}: cannot tell the format of {path!r}; set data.options.format to json, jsonl or parquet"
        )
    import datasets

    try:
        table = datasets.load_dataset(builder, data_files=str(p), split="train")
    except Exception as exc:  # a malformed file: the library's message, under the key
        raise DomainError(f"{where}: cannot read {path!r} as {builder} ({type(exc).__name__}: {exc})") from exc
    return list(table)


@dataclass(frozen=True)
class DatasetTask:
    """Prompts (and answers) from a local JSON / JSONL / parquet file read with ``datasets``.

    ``prompt`` / ``answer``: the column names (a column mapping). Every other column reaches a custom
    reward function (``data.reward``) as a keyword list; without one, completions are scored by the
    registered ``verifier`` against the answer column. Held-out problems (evaluation) come from
    ``eval_path`` when set, else from the last ``eval_fraction`` of the rows (those then never train);
    with neither, evaluation samples the training rows. ``domain``: the column of each row's domain
    label (multi-teacher routing, ``model.teachers``); the task's `domains` are its distinct training
    values, sorted, and each `Problem` carries the index of its own.
    """

    path: str
    format: str | None = None
    prompt: str = "prompt"
    answer: str = "answer"
    verifier: str = "numeric"
    eval_path: str | None = None
    eval_fraction: float = 0.0
    domain: str | None = None

    def __post_init__(self) -> None:
        if self.format is not None and self.format not in ("json", "jsonl", "parquet"):
            raise DomainError(f"data.options.format: unknown name {self.format!r}; valid: json, jsonl, parquet")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise DomainError(f"data.options.eval_fraction: expected a number in [0, 1), got {self.eval_fraction}")
        if self.eval_path is not None and self.eval_fraction:
            raise DomainError("data.options.eval_fraction: set eval_path or eval_fraction, not both")
        rows = self._problems("data.options.path", self.path)
        cut = len(rows) - int(len(rows) * self.eval_fraction)
        if cut < 1 or (self.eval_fraction and cut == len(rows)):
            raise DomainError(
                f"data.options.eval_fraction: {self.eval_fraction} of {len(rows)} rows leaves no training or no "
                "evaluation row"
            )
        held = self._problems("data.options.eval_path", self.eval_path) if self.eval_path else rows[cut:]
        names = tuple(sorted({str(dict(p.columns)[self.domain]) for p in rows[:cut]})) if self.domain else ()
        object.__setattr__(self, "_domains", names)
        object.__setattr__(self, "_train", self._labelled(rows[:cut]))
        object.__setattr__(self, "_held", self._labelled(held) or self._labelled(rows[:cut]))
        factory: Any = VERIFIERS.get(self.verifier)
        object.__setattr__(self, "_score", factory())

    def _problems(self, where: str, path: str) -> list[Problem]:
        rows = _load_rows(where, path, self.format)
        if not rows:
            raise DomainError(f"{where}: {path!r} has no rows")
        for key, column in (("prompt", self.prompt), ("answer", self.answer), ("domain", self.domain)):
            if column is not None and column not in rows[0]:
                raise DomainError(
                    f"data.options.{key}: no column {column!r} in {path!r}; columns: {', '.join(rows[0])}"
                )
        extra = [c for c in rows[0] if c != self.prompt]
        return [
            Problem(str(r[self.prompt]), "" if r[self.answer] is None else str(r[self.answer]),
                    columns=tuple((c, r[c]) for c in extra))
            for r in rows
        ]  # fmt: skip

    @property
    def domains(self) -> tuple[str, ...]:
        """The domain labels of the ``domain`` column (sorted); empty without one."""
        names: tuple[str, ...] = self._domains  # type: ignore[attr-defined]
        return names

    def _labelled(self, problems: list[Problem]) -> list[Problem]:
        """``problems`` with their domain index set (unchanged without a ``domain`` column)."""
        if self.domain is None:
            return problems
        labels = [str(dict(p.columns)[self.domain]) for p in problems]
        unknown = sorted(set(labels) - set(self.domains))
        if unknown:
            raise DomainError(
                f"data.options.domain: held-out label(s) {unknown} not among the training labels {list(self.domains)}"
            )
        return [dataclasses.replace(p, domain=self.domains.index(x)) for p, x in zip(problems, labels, strict=True)]

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        problems: list[Problem] = self._train  # type: ignore[attr-defined]
        return [problems[rng.randrange(len(problems))] for _ in range(n)]

    def held_out(self, rng: random.Random, n: int) -> list[Problem]:
        """Evaluation problems (from ``eval_path`` or the held-out fraction)."""
        problems: list[Problem] = self._held  # type: ignore[attr-defined]
        return [problems[rng.randrange(len(problems))] for _ in range(n)]

    def reward(self, problem: Problem, completion: str) -> float:
        score: Callable[[str, str], float] = self._score  # type: ignore[attr-defined]
        return float(score(completion, problem.answer))

    def solution(self, problem: Problem, rng: random.Random) -> str:
        return problem.answer


TASKS.add("addition", Addition, summary="Multi-digit addition a+b= (exact answer).")
TASKS.add("countdown", Countdown, summary="Reach a target with + - * using each number once (several answers).")
TASKS.add("multiple", Multiple, summary="Name a positive multiple of a below b (several answers).")
TASKS.add(
    "chat_addition", ChatAddition, summary="'What is a+b?' in words for chat models; the reply's last number is scored."
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
