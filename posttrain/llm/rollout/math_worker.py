"""The Math-Verify worker loop of `posttrain.llm.rollout.verifiers.MathVerifier`, in a module that imports nothing
heavy (no torch): a worker process starts in the time Math-Verify takes to import, and none when the pool's
fork server has it preloaded."""

from __future__ import annotations

from multiprocessing.connection import Connection

from posttrain.llm.rollout.judge_pool import limit_memory

__all__ = ["PRELOAD", "math_worker"]

PRELOAD = ("math_verify", __name__)
"""Modules a fork server imports once, so every worker forked from it starts warm."""


def math_worker(conn: Connection, memory_bytes: int | None) -> None:  # pragma: no cover - a child process
    """Receive ``(gold, completion)``, reply ``(status, reward)``; ``"ready"`` first, once Math-Verify is warm."""
    import logging

    limit_memory(memory_bytes)
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
        except Exception:  # MemoryError included: a verdict of 0 with the reason, never a crash of the worker
            conn.send(("error", 0.0))
