"""A task's problem and the protocol every task follows (`posttrain.llm.rollout.tasks` registers the tasks)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Problem", "Task"]


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
