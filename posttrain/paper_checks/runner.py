"""Running checks: select them by id, run one (or one of its mutants) into a `CheckOutcome`, rerun for stability.

`run_check` builds the config (smoke or full, a ``seeds`` override, a mutant applied last), runs it
with one torch thread and per-call value checks off (the toys' tensors are tiny and valid by
construction; the thread count is restored afterwards), and turns the `Result` into its summary
and verdict. An exception becomes an *error* outcome carrying the message; the other checks still run.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from posttrain.paper_checks import CHECKS, load_all
from posttrain.paper_checks.model import PaperCheck, Result, Role, Verdict
from posttrain.paper_checks.report import summarise
from posttrain.paper_checks.stats import verdict_of
from posttrain.validate import value_checks

__all__ = ["CheckOutcome", "mutant_config", "one_thread", "run_check", "run_mutants", "select_checks", "stability"]


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
