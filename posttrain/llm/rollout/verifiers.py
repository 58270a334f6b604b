"""Verifiers: a completion and a gold answer in, a reward in ``[0, 1]`` out; nothing is ever executed.

- `exact_match`: stripped string equality.
- `numeric_match`: the last number in the completion (a regex, never ``eval``) against the
  gold number, within a relative/absolute tolerance.
- `MathVerifier`: Math-Verify (``parse`` + ``verify``) in a separate worker process with
  our own wall-clock deadline. Math-Verify's timeouts use ``SIGALRM``, which only works in the main
  thread; we pass ``parsing_timeout=None, timeout_seconds=None`` and kill the worker when a
  verdict is late. Inputs longer than ``max_chars`` are rejected before parsing.

Digits: only ASCII ``0-9`` are digits, in every verifier and task. A completion with any other
character that Python calls a digit (``'²'``, ``'①'``, full-width ``'４'``, Arabic-Indic ``'٤'``) scores 0
(`foreign_digits`); the minus signs U+2212, U+FE63 and U+FF0D read as ``-``.

A verdict that could not be reached (no worker within the budget, a late or dead worker) is
*unjudged*: ``Verdict.judged`` is False and the reward is NaN, never 0, so a trainer can exclude the
sample instead of learning from a made-up 0.

Verifier factories are registered under ``registry("verifier")`` (``posttrain list verifier``).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import re
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from posttrain.registry import registry
from posttrain.validate import check_positive

__all__ = [
    "UNJUDGED",
    "VERIFIERS",
    "MathVerifier",
    "Verdict",
    "exact_match",
    "foreign_digits",
    "last_number",
    "numeric_match",
]

VERIFIERS = registry("verifier")

_NUMBER = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?")
_MAX_NUMBER_CHARS = 64
_MINUS = str.maketrans({"\u2212": "-", "\ufe63": "-", "\uff0d": "-"})

UNJUDGED = frozenset({"timeout", "unavailable", "worker_died"})
"""Verdict statuses whose reward could not be computed (reward NaN)."""


def foreign_digits(text: str) -> bool:
    """True when ``text`` has a character Python treats as a digit other than ASCII ``0-9`` (rejected everywhere).

    Examples:
        >>> foreign_digits("42"), foreign_digits("４2"), foreign_digits("x²"), foreign_digits("①")
        (False, True, True, True)
    """
    return any(ch.isdigit() and not "0" <= ch <= "9" for ch in text)


@dataclass(frozen=True)
class Verdict:
    """A reward and how it was reached.

    ``status``: ok, no_answer, too_long, non_ascii_digit, error (judged), or one of `UNJUDGED`
    (timeout, unavailable, worker_died: reward NaN).
    """

    reward: float
    status: str

    @property
    def judged(self) -> bool:
        """Whether the reward was computed (False: NaN, the sample should be left out, not scored 0)."""
        return self.status not in UNJUDGED


def last_number(text: str, *, max_chars: int = 10_000) -> float | None:
    """The last decimal number in ``text`` (regex over ASCII digits; at most ``max_chars`` are scanned), or None.

    None also when the scanned text has a non-ASCII digit (`foreign_digits`); U+2212 reads as ``-``.

    Examples:
        >>> last_number("so the answer is -12.5."), last_number("none"), last_number("\u221242"), last_number("４２")
        (-12.5, None, -42.0, None)
    """
    text = text[-max_chars:].translate(_MINUS)
    if foreign_digits(text):
        return None
    found = _NUMBER.findall(text)
    if not found or len(found[-1]) > _MAX_NUMBER_CHARS:
        return None
    value = float(found[-1])
    return value if math.isfinite(value) else None


def exact_match(completion: str, gold: str) -> float:
    """1.0 when the stripped completion equals the stripped gold answer, else 0.0.

    Examples:
        >>> exact_match(" 42 ", "42"), exact_match("42.0", "42")
        (1.0, 0.0)
    """
    return float(completion.strip() == gold.strip())


def numeric_match(completion: str, gold: str | float, *, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> float:
    """1.0 when the last number in ``completion`` is within tolerance of ``gold``, else 0.0.

    Examples:
        >>> numeric_match("x=0.3333333", "0.33333333"), numeric_match("7", "8")
        (1.0, 0.0)
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


def _math_worker(conn: Connection) -> None:  # pragma: no cover - runs in a child process
    """Worker loop: receive (gold, completion), reply with (status, reward). Runs in its own process."""
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns that we disabled its SIGALRM timeouts
    verify(parse("$1$", parsing_timeout=None), parse("$1$", parsing_timeout=None), timeout_seconds=None)  # lazy imports
    conn.send("ready")  # "ready" means warm: the first real verdict pays no first-call import cost
    while True:
        try:
            gold, completion = conn.recv()
        except EOFError:
            return
        try:
            gold_parsed = parse(gold, parsing_timeout=None)
            pred = parse(completion, parsing_timeout=None)
            ok = bool(gold_parsed) and bool(pred) and verify(gold_parsed, pred, timeout_seconds=None)
            conn.send(("ok" if pred else "no_answer", float(ok)))
        except Exception as exc:  # a verdict of 0 with the reason, never a crash of the worker
            conn.send(("error", 0.0))
            del exc


class _Worker:
    """One Math-Verify process and its pipe; ``ready`` once it has imported Math-Verify."""

    def __init__(self, ctx: Any) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_math_worker, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False

    def wait_ready(self, timeout_s: float) -> bool:
        try:
            if not self.ready and self.proc.is_alive() and self.conn.poll(max(timeout_s, 0.0)):
                self.ready = self.conn.recv() == "ready"
        except (EOFError, OSError):  # it died while importing
            self.ready = False
        return self.ready

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL; the zombie is reaped by multiprocessing on the next start
        self.conn.close()


class MathVerifier:
    """Math-Verify with a hard wall-clock deadline per verdict, safe to call from any thread.

    ``workers`` processes import Math-Verify once (`warm_up`): one serves, the others are
    warm spares. Each call waits for a ready worker (at most ``ready_budget_s``: after late verdicts
    the replacements are still importing Math-Verify), sends it the pair and waits at most
    ``deadline_s``. A late worker is killed and replaced in the background; the call returns
    ``Verdict(nan, "timeout")``. A worker that dies mid-verdict is replaced and the pair sent once more
    (``Verdict(nan, "worker_died")`` if that fails too); no ready worker within the budget gives
    ``Verdict(nan, "unavailable")``. So a call returns within ``ready_budget_s + 2 * deadline_s`` (plus
    the time to kill a process), never raises for a worker's death, and never scores 0 a verdict it
    did not reach. Calls are serialised by a lock.

    Args:
        deadline_s: the most one verdict may take on a ready worker, in seconds.
        max_chars: longer completions or gold answers get ``Verdict(0.0, "too_long")`` without parsing.
        workers: processes kept (>= 1); each extra one absorbs one more timeout in a row without waiting.
        ready_budget_s: the most a call waits for a worker to be ready, in seconds.
    """

    def __init__(
        self, *, deadline_s: float = 2.0, max_chars: int = 4000, workers: int = 2, ready_budget_s: float = 60.0
    ) -> None:
        self.workers = int(check_positive("workers", workers))
        self.deadline_s = check_positive("deadline_s", deadline_s)
        self.max_chars = int(check_positive("max_chars", max_chars))
        self.ready_budget_s = check_positive("ready_budget_s", ready_budget_s)
        self._ctx = mp.get_context("spawn")
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []

    def _fill(self) -> None:
        self._workers = [w for w in self._workers if w.proc.is_alive()]
        while len(self._workers) < self.workers:
            self._workers.append(_Worker(self._ctx))

    def warm_up(self, timeout_s: float = 120.0) -> None:
        """Start both workers and wait until they have imported Math-Verify (not counted in any deadline)."""
        with self._lock:
            self._fill()
            for w in self._workers:
                w.wait_ready(timeout_s)

    def _ready_worker(self, end: float) -> _Worker | None:
        """A ready worker, waiting until the monotonic time ``end`` at most (dead ones are replaced)."""
        while True:
            self._fill()
            ready = next((w for w in self._workers if w.wait_ready(0.0)), None)
            left = end - time.monotonic()
            if ready is not None or left <= 0:
                return ready
            waiting = [w.conn for w in self._workers] + [w.proc.sentinel for w in self._workers]
            mp_connection.wait(waiting, timeout=left)  # a "ready" message or a death

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers.remove(worker)
        self._fill()  # the new spare imports in the background

    def verdict(self, completion: str, gold: str) -> Verdict:
        """The verdict for one completion (see the class docstring for the time bounds)."""
        if len(completion) > self.max_chars or len(gold) > self.max_chars:
            return Verdict(0.0, "too_long")
        if foreign_digits(completion):
            return Verdict(0.0, "non_ascii_digit")
        with self._lock:
            end = time.monotonic() + self.ready_budget_s
            for _ in range(2):  # once more on a fresh worker if the first dies mid-verdict
                worker = self._ready_worker(end)
                if worker is None:
                    return Verdict(math.nan, "unavailable")
                try:
                    worker.conn.send((gold, completion))
                    if not worker.conn.poll(self.deadline_s):
                        self._replace(worker)
                        return Verdict(math.nan, "timeout")
                    status, value = worker.conn.recv()
                    return Verdict(float(value), status)
                except (EOFError, OSError):  # killed or crashed mid-verdict
                    self._replace(worker)
        return Verdict(math.nan, "worker_died")

    def __call__(self, completion: str, gold: str) -> float:
        """The verdict's reward: NaN when the verdict was not reached (`Verdict.judged` False)."""
        return self.verdict(completion, gold).reward

    def close(self) -> None:
        """Stop the worker processes."""
        with self._lock:
            for w in self._workers:
                w.kill()
            self._workers = []


VERIFIERS.add(
    "math",
    lambda deadline_s=2.0, max_chars=4000, workers=2, ready_budget_s=60.0: MathVerifier(
        deadline_s=deadline_s, max_chars=max_chars, workers=workers, ready_budget_s=ready_budget_s
    ),
    summary="Math-Verify in a worker process with our own deadline (Kydlicek et al., HF Math-Verify).",
)
