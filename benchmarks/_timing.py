"""Interleaved timing of an implementation against its reference."""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "Row",
    "Spread",
    "clock",
    "copy_bandwidth",
    "interleaved",
    "load_average",
    "page_faults",
    "time_pair",
    "tune_malloc",
]


@dataclass(frozen=True)
class Row:
    """One benchmark line: both times (best of the repeats, or medians with their ranges), the ratio and the target.

    ``ratio`` is ``reference / ours`` (a speed-up) when ``higher_is_better``, else ``ours /
    reference`` (a slow-down factor); the target is met when the ratio is on the right side of it.
    """

    name: str
    ours_s: float
    reference_s: float
    reference: str
    target: float | None
    higher_is_better: bool
    ours_spread: Spread | None = None
    """Median and range of ``ours_s`` (seconds) when measured by :func:`interleaved`."""
    reference_spread: Spread | None = None

    @property
    def ratio(self) -> float:
        return self.reference_s / self.ours_s if self.higher_is_better else self.ours_s / self.reference_s

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.ratio >= self.target if self.higher_is_better else self.ratio <= self.target


def clock() -> Callable[[], float]:
    """The timer: CPU time of this process when torch uses one thread, else wall time.

    On a shared machine the wall time of a single-threaded computation includes the time other
    processes held the core; its CPU time does not (page faults and other kernel work are counted).
    """
    return time.process_time if torch.get_num_threads() == 1 else time.perf_counter


def time_pair(
    ours: Callable[[], object],
    reference: Callable[[], object],
    *,
    repeats: int,
    statistic: Callable[[list[float]], float] = min,
) -> tuple[float, float]:
    """Best-of-``repeats`` times (see :func:`clock`) of ``ours`` and ``reference``, alternating the two.

    Alternating (rather than timing one block after the other) exposes both to the same machine
    load; the minimum is the least disturbed run (``statistic=statistics.median`` for the median of
    the repeats). One untimed call of each comes first (warm-up).
    """
    now = clock()
    ours()
    reference()
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(repeats):
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            fn = ours if which == 0 else reference
            start = now()
            fn()
            times[which].append(now() - start)
    return statistic(times[0]), statistic(times[1])


@dataclass(frozen=True)
class Spread:
    """Median and range of repeated measurements, printed as ``median [min-max]``."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def __str__(self) -> str:
        digits = 2 if self.high < 10 else 0
        return f"{self.median:.{digits}f} [{self.low:.{digits}f}-{self.high:.{digits}f}]"


def interleaved(fns: Mapping[str, Callable[[], object]], *, repeats: int) -> dict[str, Spread]:
    """``median [min-max]`` times (see :func:`clock`) of each function over ``repeats`` rounds.

    Each round calls every function once, the order rotated by one from round to round, so that
    machine load (a shared machine) falls on all of them alike; one untimed call of each first.
    """
    now = clock()
    names = list(fns)
    for name in names:
        fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeats):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            start = now()
            fns[name]()
            times[name].append(now() - start)
    return {name: Spread.of(values) for name, values in times.items()}


def load_average() -> str:
    """The 1/5/15-minute load averages and the core count, e.g. ``load 1.2 0.9 0.7 on 2 cores``."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.1f} {five:.1f} {fifteen:.1f} on {os.cpu_count()} cores"


def copy_bandwidth(*, mib: int = 64, repeats: int = 9) -> Spread:
    """Memory bandwidth in bytes/s of a ``mib``-MiB float32 copy into a preallocated tensor (read + write).

    The floor of a memory-bound kernel is its bytes moved divided by this (the median is used).
    """
    src = torch.ones(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    now = clock()  # the clock the timings use: CPU time with one thread, so load does not lower the floor
    dst.copy_(src)
    rates = []
    for _ in range(repeats):
        start = now()
        dst.copy_(src)
        rates.append(2 * src.numel() * 4 / (now() - start))
    return Spread.of(rates)


def tune_malloc() -> bool:
    """glibc's mmap threshold 32 MiB and trim threshold 1 GiB, as the ``posttrain`` CLI sets them
    (`posttrain.llm.cli.tune_malloc`): otherwise every large temporary is a fresh ``mmap`` that
    pays page faults on first touch. False where ``mallopt`` is unavailable (not glibc)."""
    from posttrain.llm.cli import tune_malloc as tune

    return tune()


def page_faults() -> int:
    """Minor page faults of this process so far (``getrusage``)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
