"""Running checks: select them by id, run one (or one of its mutants) into a `CheckOutcome`, rerun for stability.

`run_check` builds the config (smoke or full, a ``seeds`` override, a mutant applied last), runs it
with one torch thread and per-call value checks off (the toys' tensors are tiny and valid by
construction; the thread count is restored afterwards), and turns the `Result` into its summary
and verdict. An exception becomes an *error* outcome carrying the message; the other checks still run.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from posttrain.paper_checks import CHECKS, load_all
from posttrain.paper_checks.model import PaperCheck, Result, Role, Verdict
from posttrain.paper_checks.report import summarise
from posttrain.paper_checks.stats import verdict_of
from posttrain.validate import value_checks

__all__ = [
    "CheckOutcome", "Job", "default_workers", "mutant_config", "one_thread", "run_check", "run_jobs", "run_mutants",
    "select_checks", "stability",
]  # fmt: skip


@dataclass
class CheckOutcome:
    """One check's run: the result (or the error), the verdict, the wall and CPU time; ``mutant`` names a mutant run."""

    check: PaperCheck
    config: Any
    verdict: Verdict
    wall_time_s: float
    result: Result | None = None
    error: str | None = None
    traceback: str = ""
    summary: dict[str, Any] = field(default_factory=dict)
    cpu_time_s: float = 0.0
    mutant: str | None = None


def select_checks(ids: Sequence[str]) -> list[PaperCheck]:
    """The checks named by ``ids`` (all when empty); ``"20"`` also selects ``"20a"``, ``"20b"``, ...

    Raises:
        KeyError: an id matches no registered check (the message lists the valid ids).
    """
    load_all()
    names = CHECKS.names()
    if not ids:
        return [CHECKS.get(n) for n in names]
    chosen: list[str] = []
    for wanted in ids:
        wanted = wanted.zfill(2) if wanted.isdigit() else wanted  # "2" means check "02"
        hits = [n for n in names if n == wanted or (n.startswith(wanted) and n[len(wanted) :].isalpha())]
        if not hits:
            raise KeyError(f"unknown check id {wanted!r}; valid: {', '.join(names) or '(none)'}")
        chosen.extend(h for h in hits if h not in chosen)
    return [CHECKS.get(n) for n in chosen]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread inside the block (toy tensors are tiny: extra threads only add contention)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def mutant_config(check: PaperCheck, name: str, *, smoke: bool = False, seeds: int | None = None) -> Any:
    """The config a mutant run uses: the check's (smoke or full, ``seeds``) with the mutant applied."""
    return check.mutant(name).apply(check.config(smoke=smoke, seeds=seeds))


def run_check(
    check: PaperCheck, *, smoke: bool = False, seeds: int | None = None, mutant: str | None = None, config: Any = None
) -> CheckOutcome:
    """Run one check (``mutant``: one of its mutants; ``config``: this config instead of the built one)."""
    start, cpu = time.perf_counter(), time.process_time()
    try:
        if config is None:
            config = (
                mutant_config(check, mutant, smoke=smoke, seeds=seeds)
                if mutant
                else check.config(smoke=smoke, seeds=seeds)
            )
        with one_thread(), value_checks(False):  # shape checks stay, per-call value scans go
            result = check.run(config)
        if not isinstance(result, Result):
            raise TypeError(f"check {check.id}: run() returned {type(result).__name__}, expected Result")
        summary = summarise(result)
        verdict = verdict_of(result)
    except Exception as exc:
        return CheckOutcome(
            check,
            config,
            Verdict.ERROR,
            time.perf_counter() - start,
            error=f"{type(exc).__name__}: {exc}",
            traceback=traceback.format_exc(),
            cpu_time_s=time.process_time() - cpu,
            mutant=mutant,
        )
    return CheckOutcome(
        check,
        config,
        verdict,
        time.perf_counter() - start,
        result=result,
        summary=summary,
        cpu_time_s=time.process_time() - cpu,
        mutant=mutant,
    )


Job = tuple[PaperCheck, "str | None"]
"""A check and the mutant to run in its place (``None``: the check itself)."""


def default_workers(jobs: int) -> int:
    """Worker processes for ``jobs`` runs: one per CPU this process may use, at most one per run."""
    return max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, jobs))


def _importable(check: PaperCheck) -> bool:
    """Whether a fresh process finds ``check`` (a check of the package's modules, not one registered at run time)."""
    return getattr(check.run, "__module__", "").startswith("posttrain.paper_checks.")


_LOCAL = ("check", "config")  # may hold local functions: rebuilt in the parent instead of sent back


def _run_portable(check_id: str, smoke: bool, seeds: int | None, mutant: str | None) -> dict[str, Any]:
    """`run_check` in a worker process: the outcome's fields except the check and its config."""
    load_all()
    o = run_check(CHECKS.get(check_id), smoke=smoke, seeds=seeds, mutant=mutant)
    return {f.name: getattr(o, f.name) for f in fields(o) if f.name not in _LOCAL}


def _rejoin(
    sent: dict[str, Any], check: PaperCheck, mutant: str | None, smoke: bool, seeds: int | None
) -> CheckOutcome:
    config = (
        mutant_config(check, mutant, smoke=smoke, seeds=seeds) if mutant else check.config(smoke=smoke, seeds=seeds)
    )
    return CheckOutcome(check=check, config=config, **sent)


def run_jobs(
    jobs: Sequence[Job],
    *,
    smoke: bool = False,
    seeds: int | None = None,
    workers: int = 1,
    on_start: Callable[[Job], None] | None = None,
    on_done: Callable[[CheckOutcome], None] | None = None,
) -> list[CheckOutcome]:
    """Run ``jobs`` (checks or mutants) in ``workers`` processes; outcomes in job order.

    Each run is independent and seeded by its config, so the outcomes do not depend on ``workers``
    (each worker runs torch on one thread, as `run_check` does in this process). ``on_done`` sees each
    outcome as it finishes (in finishing order). A worker that dies gives an *error* outcome. Checks
    registered at run time (not in the package's modules) run in this process.
    """
    if workers <= 1 or len(jobs) <= 1 or not all(_importable(c) for c, _ in jobs):
        done = []
        for check, name in jobs:
            if on_start is not None:
                on_start((check, name))
            done.append(run_check(check, smoke=smoke, seeds=seeds, mutant=name))
            if on_done is not None:
                on_done(done[-1])
        return done
    slots: list[CheckOutcome | None] = [None] * len(jobs)
    context = multiprocessing.get_context("spawn")  # no fork of a process that holds torch's thread pools
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = {pool.submit(_run_portable, c.id, smoke, seeds, m): i for i, (c, m) in enumerate(jobs)}
        for future in as_completed(futures):
            i = futures[future]
            check, name = jobs[i]
            try:
                o = _rejoin(future.result(), check, name, smoke, seeds)
            except Exception as exc:  # the worker died or its outcome could not be sent back
                o = CheckOutcome(check, None, Verdict.ERROR, 0.0, error=f"{type(exc).__name__}: {exc}", mutant=name)
            slots[i] = o
            if on_done is not None:
                on_done(o)
    return [o for o in slots if o is not None]


def run_mutants(checks: Sequence[PaperCheck], *, smoke: bool = False, seeds: int | None = None) -> list[CheckOutcome]:
    """Every declared mutant of ``checks``, one outcome each."""
    return [run_check(c, smoke=smoke, seeds=seeds, mutant=m.name) for c in checks for m in c.mutants]


def _judged(o: CheckOutcome) -> dict[str, str]:
    return {c["name"]: c["outcome"] for c in o.summary.get("comparisons", []) if c["role"] != Role.CONTEXT.value}


def stability(outcomes: list[CheckOutcome], *, smoke: bool = False) -> list[dict[str, Any]]:
    """Rerun each check that ran at twice its seeds; one record per check with every outcome that changes."""
    records = []
    for o in outcomes:
        n = getattr(o.config, "seeds", None)
        if o.result is None or n is None:
            continue
        again = run_check(o.check, smoke=smoke, seeds=2 * n, mutant=o.mutant)
        before, after = _judged(o), _judged(again)
        flips = [
            {"criterion": k, "at_n": before.get(k), "at_2n": after.get(k)}
            for k in sorted(before.keys() | after.keys())
            if before.get(k) != after.get(k)
        ]
        records.append(
            {
                "id": o.check.id,
                "seeds": n,
                "verdict": o.verdict.value,
                "verdict_2x": again.verdict.value,
                "verdict_flipped": again.verdict is not o.verdict,
                "criterion_flips": flips,
                "error_2x": again.error,
                "cpu_time_2x_s": again.cpu_time_s,
            }
        )
    return records
