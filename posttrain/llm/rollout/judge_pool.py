"""A pool of spawned worker processes that judge many (gold, completion) pairs in parallel within a time budget.

Each worker runs a ``target(conn)`` loop: it sends ``"ready"`` once warm, then answers each
``(gold, completion)`` it receives with ``(status, reward)``. `JudgePool.judge` hands the pairs to at most
``workers`` ready processes at a time as they free up, one pair per process, and returns a
``(status, reward)`` per pair within the batch's budget. ``spares`` more processes are kept warm, so a
killed worker is replaced at once (a fresh one takes seconds to import its libraries):

- a pair whose worker is still busy after ``deadline_s`` gets ``("timeout", nan)``; the worker is killed
  (SIGKILL: a verdict stuck in C code cannot be interrupted otherwise) and a replacement starts;
- a worker that dies mid-pair is replaced and the pair sent once more (``("worker_died", nan)`` if it dies again);
- when the budget is spent, pairs still running or never started get ``("over_budget", nan)`` and the busy
  workers are killed; when no worker became ready within it, the pairs get ``("unavailable", nan)``. So `judge` returns within ``budget_s`` plus the time to kill a process.

Workers never fork the calling process (no copy of a trainer's threads or CUDA state): they fork from
multiprocessing's fork server, a clean process that has imported the ``preload`` modules once, so a
replacement starts in milliseconds (spawned from scratch where there is no fork server). They are kept
between calls (a step's batch pays no start-up cost), limited to ``memory_bytes`` of address space each (a verdict that tries to
build a huge number fails with MemoryError in the worker instead of exhausting the machine), and stopped by
`JudgePool.close`, when the pool is garbage-collected, or at interpreter exit.
"""

from __future__ import annotations

import collections
import math
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["JudgePool", "limit_memory"]

Result = tuple[str, float]


def limit_memory(memory_bytes: int | None) -> None:  # pragma: no cover - runs in a worker process
    """Cap this process's address space (``RLIMIT_AS``) where the platform allows it."""
    if memory_bytes is None:
        return
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    except (ImportError, ValueError, OSError):  # not POSIX, or a lower hard limit already set
        pass


class _Worker:
    """One worker process and its pipe; ``ready`` once it has sent ``"ready"``."""

    def __init__(self, ctx: Any, target: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=target, args=(child, *args), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False

    def poll_ready(self) -> bool:
        """Read a pending ``"ready"`` without waiting; False while importing or when dead."""
        try:
            if not self.ready and self.conn.poll(0):
                self.ready = self.conn.recv() == "ready"
        except (EOFError, OSError):
            self.ready = False
        return self.ready

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(timeout=5.0)  # reaped: no zombie left behind
        self.conn.close()


def _context(preload: Sequence[str]) -> Any:
    """The fork server's context with ``preload`` (where the platform has one), else spawn's.

    The fork server is one per process: if something started it before, its own preload list stands
    (workers then import their libraries themselves, as spawned ones do)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    if preload:
        ctx.set_forkserver_preload(list(preload))
    return ctx


def _kill_all(workers: list[_Worker]) -> None:
    for w in workers:
        w.kill()
    workers.clear()


class JudgePool:
    """``workers`` processes running ``target(conn, *args)``; see the module docstring.

    Args:
        target: the worker loop (a module-level function, importable by a spawned process).
        args: extra arguments of ``target``.
        preload: modules the fork server imports once (the worker's libraries).
        workers: pairs judged at the same time (>= 1).
        spares: warm processes kept beyond ``workers``, taking over from killed ones at once.
        deadline_s: the most one pair may take on a worker.
        ready_budget_s: the most the first call waits for the workers to start (not counted in its budget).
    """

    def __init__(
        self,
        target: Callable[..., None],
        *,
        args: tuple[Any, ...] = (),
        workers: int,
        spares: int = 1,
        deadline_s: float,
        ready_budget_s: float,
        preload: Sequence[str] = (),
    ) -> None:
        self.target, self.args = target, args
        self.workers, self.size = workers, workers + spares
        self.deadline_s, self.ready_budget_s = deadline_s, ready_budget_s
        self._ctx = _context(preload)
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._warm = False
        self._finalizer = weakref.finalize(self, _kill_all, self._workers)

    @property
    def pids(self) -> list[int]:
        """The worker processes' ids (for inspection and tests)."""
        return [w.proc.pid for w in self._workers if w.proc.pid is not None]

    def _fill(self) -> int:
        """Replace dead workers and start missing ones; returns how many were started."""
        for w in [w for w in self._workers if not w.proc.is_alive()]:
            w.kill()
            self._workers.remove(w)
        started = 0
        while len(self._workers) < self.size:
            self._workers.append(_Worker(self._ctx, self.target, self.args))
            started += 1
        return started

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers.remove(worker)

    def warm_up(self, timeout_s: float = 120.0) -> None:
        """Start the workers and wait (at most ``timeout_s``) until each is ready."""
        with self._lock:
            self._warm_up(timeout_s)

    def _warm_up(self, timeout_s: float) -> None:
        self._fill()
        end = time.monotonic() + timeout_s
        while not all(w.poll_ready() for w in self._workers) and (left := end - time.monotonic()) > 0:
            waiting = [w for w in self._workers if not w.ready]
            if not any(w.proc.is_alive() for w in waiting):
                break
            mp_connection.wait([w.conn for w in waiting] + [w.proc.sentinel for w in waiting], timeout=left)
        self._warm = True

    def judge(self, pairs: Sequence[tuple[str, str]], *, budget_s: float) -> list[Result]:
        """``(status, reward)`` for each ``(gold, completion)`` of ``pairs``, within ``budget_s`` seconds."""
        results: list[Result | None] = [None] * len(pairs)
        if not pairs:
            return []
        with self._lock:
            if not self._warm:  # the first call: the workers import their libraries outside the budget
                self._warm_up(self.ready_budget_s)
            end = time.monotonic() + budget_s
            queue = collections.deque(range(len(pairs)))
            tries = [0] * len(pairs)
            busy: dict[_Worker, tuple[int, float]] = {}
            spawns = self.size + 2 * len(pairs)  # bounds restarts when workers keep dying
            served = False  # whether any pair reached a worker (else the rest is "unavailable", not "over budget")

            def lost(i: int) -> None:
                tries[i] += 1
                if tries[i] >= 2:
                    results[i] = ("worker_died", math.nan)
                else:
                    queue.appendleft(i)

            while (queue or busy) and time.monotonic() < end:
                if spawns > 0:
                    spawns -= self._fill()
                for w in list(self._workers):
                    if w in busy or not w.poll_ready() or not queue or len(busy) >= self.workers:
                        continue
                    i = queue.popleft()
                    try:
                        w.conn.send(pairs[i])
                    except (OSError, ValueError):
                        self._replace(w)
                        lost(i)
                        continue
                    busy[w] = (i, min(time.monotonic() + self.deadline_s, end))
                    served = True
                idle = [w for w in self._workers if w not in busy and not w.ready]
                watched = list(busy) + idle  # results, deaths, and "ready" from starting processes
                wake = min([end, *(d for _, d in busy.values())])
                if not watched and queue:
                    break  # no worker left to start or wait for: the rest is unavailable
                mp_connection.wait(
                    [w.conn for w in watched] + [w.proc.sentinel for w in watched],
                    timeout=max(wake - time.monotonic(), 0.0),
                )
                for w, (i, due) in list(busy.items()):
                    try:
                        if w.conn.poll(0):
                            status, reward = w.conn.recv()
                            results[i] = (str(status), float(reward))
                            del busy[w]
                            continue
                    except (EOFError, OSError):
                        pass
                    else:
                        if w.proc.is_alive() and time.monotonic() < due:
                            continue
                        if w.proc.is_alive():  # past its deadline: killed, replaced
                            del busy[w]
                            self._replace(w)
                            results[i] = ("timeout" if due < end else "over_budget", math.nan)
                            continue
                    del busy[w]  # died mid-pair
                    self._replace(w)
                    lost(i)
            for w, (i, _) in busy.items():
                self._replace(w)
                results[i] = ("over_budget", math.nan)
            for i in queue:
                results[i] = ("over_budget" if served else "unavailable", math.nan)
        return [r if r is not None else ("unavailable", math.nan) for r in results]

    def close(self) -> None:
        """Stop the worker processes (a later `judge` starts new ones)."""
        with self._lock:
            _kill_all(self._workers)
            self._warm = False
