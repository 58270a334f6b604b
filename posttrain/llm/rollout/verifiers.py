"""Verifiers: a completion and a gold answer in, a reward in ``[0, 1]`` out; nothing is ever executed.

- :func:`exact_match`: stripped string equality.
- :func:`numeric_match`: the last number in the completion (a regex, never ``eval``) against the
  gold number, within a relative/absolute tolerance.
- :class:`MathVerifier`: Math-Verify (``parse`` + ``verify``) in a separate worker process with
  our own wall-clock deadline. Math-Verify's timeouts use ``SIGALRM``, which only works in the main
  thread; we pass ``parsing_timeout=None, timeout_seconds=None`` and kill the worker when a
  verdict is late, so every call returns within ``deadline_s`` (plus the time to kill a process)
  from any thread. Inputs longer than ``max_chars`` are rejected before parsing.

Verifier factories are registered under ``registry("verifier")`` (``posttrain list verifier``).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import re
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from posttrain.registry import registry
from posttrain.validate import check_positive

__all__ = ["VERIFIERS", "MathVerifier", "Verdict", "exact_match", "last_number", "numeric_match"]

VERIFIERS = registry("verifier")

_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d{1,3})?")
_MAX_NUMBER_CHARS = 64


@dataclass(frozen=True)
class Verdict:
    """A reward and how it was reached (``status`` in ok, no_answer, too_long, timeout, error)."""

    reward: float
    status: str


def last_number(text: str, *, max_chars: int = 10_000) -> float | None:
    """The last decimal number in ``text`` (regex; at most ``max_chars`` are scanned), or None.

    Example:
        >>> last_number("so the answer is -12.5."), last_number("none")
        (-12.5, None)
    """
    found = _NUMBER.findall(text[-max_chars:])
    if not found or len(found[-1]) > _MAX_NUMBER_CHARS:
        return None
    value = float(found[-1])
    return value if math.isfinite(value) else None


def exact_match(completion: str, gold: str) -> float:
    """1.0 when the stripped completion equals the stripped gold answer, else 0.0.

    Example:
        >>> exact_match(" 42 ", "42"), exact_match("42.0", "42")
        (1.0, 0.0)
    """
    return float(completion.strip() == gold.strip())


def numeric_match(completion: str, gold: str | float, *, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> float:
    """1.0 when the last number in ``completion`` is within tolerance of ``gold``, else 0.0.

    Example:
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


def _math_worker(conn: Connection) -> None:
    """Worker loop: receive (gold, completion), reply with (status, reward). Runs in its own process."""
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns that we disabled its SIGALRM timeouts
    conn.send("ready")
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
        if not self.ready and self.proc.is_alive() and self.conn.poll(max(timeout_s, 0.0)):
            self.ready = self.conn.recv() == "ready"
        return self.ready

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL; the zombie is reaped by multiprocessing on the next start
        self.conn.close()


class MathVerifier:
    """Math-Verify with a hard wall-clock deadline per verdict, safe to call from any thread.

    ``workers`` processes import Math-Verify once (:meth:`warm_up`): one serves, the others are
    warm spares. Each call sends the pair to the serving worker and waits at most ``deadline_s``; a late
    worker is killed, the spare takes over, and a new spare starts in the background; the call
    returns ``Verdict(0.0, "timeout")``. If no warm worker is available within the deadline (several
    timeouts in a row, faster than a worker starts) the call returns ``Verdict(0.0, "unavailable")``.
    Calls are serialised by a lock.

    Args:
        deadline_s: the most a verdict may take, in seconds (waiting for a worker included).
        max_chars: longer completions or gold answers get ``Verdict(0.0, "too_long")`` without parsing.
        workers: processes kept (>= 1); each extra one absorbs one more timeout in a row.
    """

    def __init__(self, *, deadline_s: float = 2.0, max_chars: int = 4000, workers: int = 2) -> None:
        self.workers = int(check_positive("workers", workers))
        self.deadline_s = check_positive("deadline_s", deadline_s)
        self.max_chars = int(check_positive("max_chars", max_chars))
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

    def verdict(self, completion: str, gold: str) -> Verdict:
        """The verdict for one completion, within ``deadline_s``."""
        if len(completion) > self.max_chars or len(gold) > self.max_chars:
            return Verdict(0.0, "too_long")
        end = time.monotonic() + self.deadline_s
        with self._lock:
            self._fill()
            worker = next((w for w in self._workers if w.wait_ready(0.0)), None)
            if worker is None and not self._workers[0].wait_ready(end - time.monotonic()):
                return Verdict(0.0, "unavailable")
            worker = worker or self._workers[0]
            worker.conn.send((gold, completion))
            if not worker.conn.poll(max(end - time.monotonic(), 0.0)):
                worker.kill()
                self._workers.remove(worker)
                self._fill()  # the new spare imports in the background
                return Verdict(0.0, "timeout")
            status, value = worker.conn.recv()
        return Verdict(float(value), status)

    def __call__(self, completion: str, gold: str) -> float:
        return self.verdict(completion, gold).reward

    def close(self) -> None:
        """Stop the worker processes."""
        with self._lock:
            for w in self._workers:
                w.kill()
            self._workers = []


VERIFIERS.add(
    "math",
    lambda deadline_s=2.0, max_chars=4000, workers=2: MathVerifier(
        deadline_s=deadline_s, max_chars=max_chars, workers=workers
    ),
    summary="Math-Verify in a worker process with our own deadline (Kydlicek et al., HF Math-Verify).",
)
