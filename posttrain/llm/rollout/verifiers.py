"""Verifiers: a completion and a gold answer in, a reward in ``[0, 1]`` out; nothing is ever executed.

- `exact_match`: stripped string equality.
- `numeric_match`: the last number in the completion (`posttrain.llm.rollout.numbers`, a regex grammar,
  never ``eval``) against the gold number, within a relative/absolute tolerance.
- `MathVerifier`: Math-Verify (``parse`` + ``verify``) in a pool of worker processes
  (`posttrain.llm.rollout.judge_pool.JudgePool`) with our own wall-clock deadline per verdict and a time
  budget per batch (`MathVerifier.verdicts`). Math-Verify's timeouts use ``SIGALRM``, which only works in
  the main thread; we pass ``parsing_timeout=None, timeout_seconds=None`` and kill a worker whose verdict
  is late. Inputs longer than ``max_chars`` are rejected before parsing.

Numbers: every verifier reads them with one grammar (`posttrain.llm.rollout.numbers`): only ASCII ``0-9``
are digits (a completion with any other character that Python calls a digit, ``'²'``, ``'①'``, full-width
``'４'``, Arabic-Indic ``'٤'``, scores 0: `foreign_digits`); the minus signs U+2212, U+FE63 and U+FF0D read
as ``-``; ``1,000`` is one thousand; ``1e5000`` is one number. Math-Verify gets its inputs through
`normalize_numbers`, so it reads the numbers the numeric verifier reads.

A verdict that could not be reached (no worker, a late or dead worker, the batch's budget spent) is
*unjudged*: ``Verdict.judged`` is False and the reward is NaN, never 0, so a trainer can exclude the
sample instead of learning from a made-up 0. `judge_all` scores a batch with any verifier (a batch
method with a budget where the verifier has one).

Verifier factories are registered under ``registry("verifier")`` (``posttrain list verifier``).
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from posttrain.errors import DomainError
from posttrain.llm.rollout.judge_pool import JudgePool
from posttrain.llm.rollout.math_worker import PRELOAD, math_worker
from posttrain.llm.rollout.numbers import foreign_digits, last_number, normalize_numbers
from posttrain.registry import registry
from posttrain.validate import check_positive

__all__ = [
    "DEFAULT_BUDGET_S",
    "UNJUDGED",
    "VERIFIERS",
    "MathVerifier",
    "Verdict",
    "exact_match",
    "foreign_digits",
    "judge_all",
    "last_number",
    "numeric_match",
]

VERIFIERS = registry("verifier")

UNJUDGED = frozenset({"timeout", "unavailable", "worker_died", "over_budget"})
"""Verdict statuses whose reward could not be computed (reward NaN)."""

DEFAULT_BUDGET_S = 30.0
"""The default time budget of one batch of verdicts (a task's ``verifier_budget_s``), in seconds."""


@dataclass(frozen=True)
class Verdict:
    """A reward and how it was reached.

    ``status``: ok, no_answer, too_long, non_ascii_digit, error (judged), or one of `UNJUDGED`
    (timeout, unavailable, worker_died, over_budget: reward NaN).
    """

    reward: float
    status: str

    @property
    def judged(self) -> bool:
        """Whether the reward was computed (False: NaN, the sample should be left out, not scored 0)."""
        return self.status not in UNJUDGED


def exact_match(completion: str, gold: str) -> float:
    """1.0 when the stripped completion equals the stripped gold answer, else 0.0.

    Examples:
        >>> exact_match(" 42 ", "42"), exact_match("42.0", "42")
        (1.0, 0.0)
    """
    return float(completion.strip() == gold.strip())


def numeric_match(completion: str, gold: str | float, *, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> float:
    """1.0 when the last number in ``completion`` is within tolerance of ``gold``, else 0.0.

    Both are read with the one number grammar (`posttrain.llm.rollout.numbers.last_number`).

    Examples:
        >>> numeric_match("x=0.3333333", "0.33333333"), numeric_match("7", "8"), numeric_match("1,000", "1000")
        (1.0, 0.0, 1.0)
    """
    pred = last_number(completion)
    target = float(gold) if not isinstance(gold, str) else last_number(gold)
    if pred is None or target is None:
        return 0.0
    return float(math.isclose(pred, target, rel_tol=rel_tol, abs_tol=abs_tol))


VERIFIERS.add("exact", lambda **_: exact_match, summary="Stripped string equality.")
VERIFIERS.add(
    "numeric",
    lambda rel_tol=1e-6, abs_tol=1e-9: lambda c, g: numeric_match(c, g, rel_tol=rel_tol, abs_tol=abs_tol),
    summary="Last number in the completion within a tolerance of the gold number (regex, no eval).",
)


def judge_all(
    verifier: Callable[[str, str], float], completions: Sequence[str], golds: Sequence[str], *, budget_s: float
) -> list[float]:
    """One reward per completion (NaN: unjudged): the verifier's batch method ``verdicts`` within ``budget_s``
    seconds when it has one (`MathVerifier`), else one call per pair (the rule verifiers are regexes over a
    bounded text: they cannot stall)."""
    if len(completions) != len(golds):
        raise DomainError(f"golds: expected one per completion ({len(completions)}), got {len(golds)}")
    batch = getattr(verifier, "verdicts", None)
    if batch is not None:
        return [v.reward for v in batch(completions, golds, budget_s=budget_s)]
    return [float(verifier(c, g)) for c, g in zip(completions, golds, strict=True)]


def default_workers() -> int:
    """Math-Verify workers by default: one per CPU core, at most 4 (each holds ~150 MB)."""
    return max(1, min(4, os.cpu_count() or 1))


class MathVerifier:
    """Math-Verify in a pool of worker processes: a deadline per verdict, a time budget per batch, parallel.

    `verdicts` judges a batch: its pairs go to ``workers`` spawned processes in parallel (each has
    imported Math-Verify once, the first call waiting up to ``ready_budget_s`` for that, outside any
    budget). A verdict later than ``deadline_s`` is ``Verdict(nan, "timeout")`` and its worker is killed and
    replaced; a worker that dies mid-verdict is replaced and the pair sent once more
    (``Verdict(nan, "worker_died")`` if that fails too); when the batch's budget is spent the rest is
    ``Verdict(nan, "over_budget")``. So a batch returns within ``budget_s`` (plus the time to kill a
    process), never raises for a worker's death, and never scores 0 a verdict it did not reach. The pool
    is kept between batches and stopped by `close` (or when the verifier is garbage-collected, or at exit).
    Calls are serialised by a lock: safe from any thread.

    Args:
        deadline_s: the most one verdict may take on a ready worker, in seconds.
        max_chars: longer completions or gold answers get ``Verdict(0.0, "too_long")`` without parsing.
        workers: verdicts computed at the same time, one process each (default `default_workers`); one
            more process is kept warm to replace a killed one at once.
        ready_budget_s: the most the first call waits for the workers to import Math-Verify, in seconds.
        budget_s: the default budget of a batch (`verdicts`), in seconds; one `verdict` gets
            ``min(budget_s, ready_budget_s + 2 * deadline_s)``.
        memory_bytes: address-space limit of each worker (a verdict that tries to build a gigantic number
            fails there with MemoryError: ``Verdict(0.0, "error")``); None: no limit.

    Raises:
        DomainError: ``math-verify`` is not installed (the ``[llm]`` extra).
    """

    def __init__(
        self,
        *,
        deadline_s: float = 2.0,
        max_chars: int = 4000,
        workers: int | None = None,
        ready_budget_s: float = 60.0,
        budget_s: float = DEFAULT_BUDGET_S,
        memory_bytes: int | None = 4 << 30,
    ) -> None:
        if importlib.util.find_spec("math_verify") is None:
            raise DomainError("verifier 'math': math-verify is not installed (pip install 'posttrain[llm]')")
        self.workers = int(check_positive("workers", default_workers() if workers is None else workers))
        self.deadline_s = check_positive("deadline_s", deadline_s)
        self.max_chars = int(check_positive("max_chars", max_chars))
        self.ready_budget_s = check_positive("ready_budget_s", ready_budget_s)
        self.budget_s = check_positive("budget_s", budget_s)
        self._pool = JudgePool(
            math_worker, args=(memory_bytes,), workers=self.workers, deadline_s=self.deadline_s,
            ready_budget_s=self.ready_budget_s, preload=PRELOAD,
        )  # fmt: skip

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids."""
        return self._pool.pids

    def warm_up(self, timeout_s: float = 120.0) -> None:
        """Start the workers and wait until they have imported Math-Verify (not counted in any budget)."""
        self._pool.warm_up(timeout_s)

    def _screen(self, completion: str, gold: str) -> Verdict | None:
        """The verdict of a pair that needs no parsing (too long, foreign digits), else None."""
        if len(completion) > self.max_chars or len(gold) > self.max_chars:
            return Verdict(0.0, "too_long")
        if foreign_digits(completion):
            return Verdict(0.0, "non_ascii_digit")
        return None

    def verdicts(
        self, completions: Sequence[str], golds: Sequence[str], *, budget_s: float | None = None
    ) -> list[Verdict]:
        """The verdicts of a batch, judged in parallel within ``budget_s`` seconds (default: ``self.budget_s``)."""
        budget = self.budget_s if budget_s is None else check_positive("budget_s", budget_s)
        out: list[Verdict | None] = [self._screen(c, g) for c, g in zip(completions, golds, strict=True)]
        todo = [i for i, v in enumerate(out) if v is None]
        pairs = [(normalize_numbers(golds[i]), normalize_numbers(completions[i])) for i in todo]
        for i, (status, reward) in zip(todo, self._pool.judge(pairs, budget_s=budget), strict=True):
            out[i] = Verdict(reward, status)
        return [v for v in out if v is not None]

    def verdict(self, completion: str, gold: str) -> Verdict:
        """The verdict for one completion (a batch of one)."""
        budget = min(self.budget_s, self.ready_budget_s + 2 * self.deadline_s)
        return self.verdicts([completion], [gold], budget_s=budget)[0]

    def __call__(self, completion: str, gold: str) -> float:
        """The verdict's reward: NaN when the verdict was not reached (`Verdict.judged` False)."""
        return self.verdict(completion, gold).reward

    def close(self) -> None:
        """Stop the worker processes (a later call starts new ones)."""
        self._pool.close()


VERIFIERS.add(
    "math",
    lambda deadline_s=2.0, max_chars=4000, workers=None, ready_budget_s=60.0, budget_s=DEFAULT_BUDGET_S: MathVerifier(
        deadline_s=deadline_s, max_chars=max_chars, workers=workers, ready_budget_s=ready_budget_s, budget_s=budget_s
    ),
    summary="Math-Verify in a pool of worker processes with a deadline per verdict and a budget per batch "
    "(Kydlicek et al., HF Math-Verify).",
)
