"""A custom reward function named ``"module:function"`` in the config (``data.reward``), TRL's signature.

The function is called once per rollout batch as TRL's ``GRPOTrainer`` calls a reward function:

    f(prompts=[...], completions=[...], answer=[...], **columns) -> list[float | None]

(keyword arguments; one entry per completion, group-major). ``answer`` is the task's answer (the
``dataset`` task's mapped answer column); ``columns`` are the problem's other dataset columns under
their own names (a column missing from a row is None). A
``None`` or NaN entry means "not judged": the trainer leaves that sample's group out of the loss
(``RolloutBatch.judged``) instead of scoring it 0.

Loading a config checks only the spec's form (`is_reward_spec`); the module is imported (running its
import-time code) when the task is built for training (`with_reward_function`), which also calls the function
once on the task's first problem and its reference solution, so a function that raises or returns the wrong
thing fails before a model is built. Its errors name ``data.reward`` and the spec.
"""

from __future__ import annotations

import importlib
import inspect
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.errors import DomainError
from posttrain.llm.rollout.tasks import Problem, Task

__all__ = ["RewardFunctionTask", "is_reward_spec", "load_reward_function", "with_reward_function"]

_SPEC = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def is_reward_spec(spec: str) -> bool:
    """Whether ``spec`` has the form ``package.module:function`` (dotted identifiers; nothing is imported).

    Examples:
        >>> is_reward_spec("my_rewards:exact"), is_reward_spec("my rewards:exact"), is_reward_spec("exact")
        (True, False, False)
    """
    return _SPEC.fullmatch(spec) is not None


def load_reward_function(spec: str, where: str = "data.reward") -> Callable[..., Any]:
    """Import ``"package.module:function"`` and check it takes ``prompts``, ``completions`` and ``**kwargs``.

    Raises ``DomainError`` naming ``where`` when the module does not import, the attribute is missing or
    not callable, or the signature cannot take TRL's keyword call.
    """
    if not is_reward_spec(spec):
        raise DomainError(f"{where}: expected 'package.module:function', got {spec!r}")
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or an error raised while importing the user's module
        raise DomainError(f"{where}: cannot import module {module_name!r} ({type(exc).__name__}: {exc})") from exc
    fn: Any = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise DomainError(f"{where}: module {module_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise DomainError(f"{where}: {spec!r} is not callable (got {type(fn).__name__})")
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: trust the call
        return fn  # type: ignore[no-any-return]
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if not {"prompts", "completions"} <= names or not any(p.kind is p.VAR_KEYWORD for p in params):
        raise DomainError(
            f"{where}: {spec!r} must have TRL's reward signature f(prompts, completions, **kwargs) -> list[float]; "
            f"got {inspect.signature(fn)}"
        )
    return fn  # type: ignore[no-any-return]


@dataclass(frozen=True)
class RewardFunctionTask:
    """``task``'s problems and solutions, scored by ``fn`` in batches (`rewards`)."""

    task: Task
    fn: Callable[..., Any]
    spec: str = ""

    def sample(self, rng: Any, n: int) -> list[Problem]:
        return self.task.sample(rng, n)

    def solution(self, problem: Problem, rng: Any) -> str:
        return self.task.solution(problem, rng)

    @property
    def domains(self) -> tuple[str, ...]:
        """The wrapped task's domain names (multi-teacher routing), if it labels any."""
        return tuple(getattr(self.task, "domains", ()))

    def held_out(self, rng: Any, n: int) -> list[Problem]:
        """The wrapped task's evaluation problems (its ``held_out`` split, else its samples)."""
        split = getattr(self.task, "held_out", None)
        return (split or self.task.sample)(rng, n)  # type: ignore[no-any-return]

    def reward(self, problem: Problem, completion: str) -> float:
        return self.rewards([problem], [completion])[0]

    def rewards(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[float]:
        """One reward per completion (``problems[i]`` is completion ``i``'s problem); None/NaN -> NaN (unjudged)."""
        rows = [dict(p.columns) for p in problems]
        names = dict.fromkeys(name for row in rows for name in row if name != "answer")  # ordered union
        columns = {name: [row.get(name) for row in rows] for name in names}
        columns["answer"] = [p.answer for p in problems]  # always the task's (mapped) answer
        try:
            out = self.fn(prompts=[p.prompt for p in problems], completions=list(completions), **columns)
        except Exception as exc:  # the user's code: its failure named, not a bare traceback
            raise DomainError(f"data.reward: {self.spec or self.fn!r} raised {type(exc).__name__}: {exc}") from exc
        if out is None or not hasattr(out, "__len__") or len(out) != len(completions):
            raise DomainError(
                f"data.reward: {self.spec or self.fn!r} returned {len(out) if hasattr(out, '__len__') else out!r} "
                f"rewards for {len(completions)} completions"
            )
        values = []
        for i, v in enumerate(out):
            if v is None:
                values.append(math.nan)
                continue
            try:
                values.append(float(v))
            except (TypeError, ValueError):
                raise DomainError(f"data.reward: reward {i} is not a number: {v!r}") from None
            if math.isinf(values[-1]):
                raise DomainError(f"data.reward: reward {i} is infinite")
        return values


def with_reward_function(task: Task, spec: str | None) -> Task:
    """``task`` scored by the reward function ``spec`` (``"module:function"``, imported here and tried once on
    the task's first problem and its reference solution); ``task`` itself when None."""
    if spec is None:
        return task
    scored = RewardFunctionTask(task, load_reward_function(spec), spec)
    rng = random.Random(0)
    (problem,) = task.sample(rng, 1)
    scored.rewards([problem], [task.solution(problem, rng)])
    return scored
