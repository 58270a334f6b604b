"""Interleaved timing of an implementation against its reference."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

__all__ = ["Row", "Spread", "clock", "time_pair"]


@dataclass(frozen=True)
class Row:
    """One benchmark line: both times (best of the repeats), the ratio and the target.

    ``ratio`` is ``reference / ours`` (a speed-up) when ``higher_is_better``, else ``ours /
    reference`` (a slow-down factor); the target is met when the ratio is on the right side of it.
    """

    name: str
    ours_s: float
    reference_s: float
    reference: str
    target: float | None
    higher_is_better: bool

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
