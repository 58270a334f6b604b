"""What each option mapping of a run config configures, and the limits its target does not declare itself.

- ``data.options``: the fields of the task's dataclass (``TASKS``), plus `TASK_LIMITS` (ranges, names and
  relations of the built-in tasks' fields, which bound the work a problem costs); the task is built once
  and asked for one problem and its solution, so an option it rejects fails at load;
- ``optim.options``: the optimizer's keyword parameters (`posttrain.llm.train.optim.check_optimizer`);
- ``algorithm.options`` / ``loss_options`` / ``advantage_options``: checked where the method is built
  (`posttrain.llm.methods.catalog.build_algorithm`).

Every error names the dotted key.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from posttrain.errors import DomainError
from posttrain.llm.rollout.tasks import TASKS, Task
from posttrain.llm.rollout.verifiers import VERIFIERS
from posttrain.llm.typed import OneOf, Range, check_options, show

__all__ = ["TASK_LIMITS", "TaskLimits", "build_task_options"]


@dataclass(frozen=True)
class TaskLimits:
    """Limits on a registered task's fields (``Range`` / ``OneOf`` by field) and a check across its fields
    (``check(task) -> None``, raising ``DomainError("field: ...")``)."""

    fields: Mapping[str, Any] = field(default_factory=dict)
    check: Callable[[Any], None] | None = None


def _ordered(low: str, high: str) -> Callable[[Any], None]:
    def check(task: Any) -> None:
        lo, hi = getattr(task, low), getattr(task, high)
        if lo is not None and hi is not None and lo > hi:
            raise DomainError(f"{high}: expected >= {low}={lo}, got {hi}")

    return check


def _multiple(task: Any) -> None:
    _ordered("low", "high")(task)
    if task.bound < 2 * task.high:
        raise DomainError(
            f"bound: expected >= 2 * high = {2 * task.high} (a multiple of a below b >= 2a), got {task.bound}"
        )


def _chat_addition(task: Any) -> None:
    _ordered("low", "high")(task)
    _ordered("low_b", "high_b")(task)
    try:
        names = {f[1] for f in string.Formatter().parse(task.template) if f[1] is not None}
    except ValueError as exc:
        raise DomainError(f"template: expected a format string over {{a}} and {{b}} ({exc})") from None
    if not names <= {"a", "b"}:
        raise DomainError(f"template: expected a format string over {{a}} and {{b}}, got {show(task.template)}")


_INT = Range(-(10**12), 10**12)
TASK_LIMITS: dict[str, TaskLimits] = {
    "addition": TaskLimits({"digits": Range(1, 64)}),
    "countdown": TaskLimits({"count": Range(1, 6), "high": Range(1, 10**4)}),
    "multiple": TaskLimits({"low": Range(1, 10**6), "high": Range(1, 10**6), "bound": Range(2, 10**9)}, _multiple),
    "chat_addition": TaskLimits({"low": _INT, "high": _INT, "low_b": _INT, "high_b": _INT}, _chat_addition),
    "jsonl": TaskLimits({"verifier": OneOf(VERIFIERS)}),
    "dataset": TaskLimits({"verifier": OneOf(VERIFIERS)}),
}
"""Limits of the built-in tasks' options: the sizes bound the work and memory of one problem."""


def _prefixed(where: str, exc: Exception) -> DomainError:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if text.startswith("data.options"):
        return DomainError(text)
    head = text.split(":", 1)[0]
    return DomainError(f"{where}.{text}" if head.isidentifier() else f"{where}: {text}")


def _limited(name: str, options: Mapping[str, Any], where: str) -> None:
    """Names, types and `TASK_LIMITS` of one task's options (a ``mixture``'s components too), before building it."""
    parsed = check_options(where, TASKS.get(name), options)
    limits = TASK_LIMITS.get(name, TaskLimits())
    for key, meta in limits.fields.items():
        if parsed.get(key) is not None:
            meta.check(f"{where}.{key}", parsed[key])
    tasks: Any = parsed.get("tasks") if name == "mixture" else None
    if isinstance(tasks, Mapping):
        for domain, spec in tasks.items():
            sub: Any = {"task": spec} if isinstance(spec, str) else spec
            if isinstance(sub, Mapping) and sub.get("task") in TASKS.names() and sub.get("task") != "mixture":
                _limited(str(sub["task"]), dict(sub.get("options") or {}), f"{where}.tasks.{domain}.options")


def build_task_options(name: str, options: Mapping[str, Any], where: str = "data.options") -> Task:
    """The task ``name`` built from ``options`` after their checks, and tried once: one problem and its solution."""
    _limited(name, options, where)
    try:
        factory: Any = TASKS.get(name)
        task = factory(**options)
        check = TASK_LIMITS.get(name, TaskLimits()).check
        if check is not None:
            check(task)
        rng = random.Random(0)
        (problem,) = task.sample(rng, 1)
        task.solution(problem, rng)
    except (DomainError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise _prefixed(where, exc) from None
    return task  # type: ignore[no-any-return]
