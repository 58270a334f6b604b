"""Power of the bounded-mean bound: the effect each seed count detects with 80% power, beside two references.

For a paired difference in ``[-1, 1]`` judged against margin 0 at one-sided ``alpha = 0.025``, prints
the minimum detectable effect (MDE) of `posttrain.paper_checks.bounds.mean_lower_bound` (betting,
valid for every law on the range) at n = 5, 10, 16, 20, 50, 100, 1000 seeds and per-seed standard
deviations ``sd`` (0 = the floor: noise-free data), under the Beta alternative with that mean and SD.
Beside it, measured in the same run on the same draws: the empirical-Bernstein bound of Maurer &
Pontil (2009, Thm 4; valid, the usual comparison) and the Student-t interval (not valid for bounded
data at small n, the level it loses is in ``tests/paper_checks/test_bounds_calibration.py``), with
the ratios betting / reference. ``--caps`` adds the MDE of the bet cap ``c`` = 1/2, 3/4, 0.9
(the module's choice). ``--time`` adds the cost of one bound against the t interval (time ratio).
The exit status is 0 either way: this is a measurement.

Run: ``python -m benchmarks.bench_bounds [--reps 1000] [--caps] [--time]`` (``--small``: n <= 20).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable

import numpy as np
from rich.console import Console
from rich.table import Table
from scipy import stats

from posttrain.paper_checks import bounds

ALPHA, POWER, LO, HI, MARGIN = 0.025, 0.8, -1.0, 1.0, 0.0
SEEDS = (5, 10, 16, 20, 50, 100, 1000)
SDS = (0.0, 0.05, 0.1, 0.2, 0.4)
FLOOR = 1e-4  # the smallest effect searched

Rule = Callable[[np.ndarray], np.ndarray]  # [R, N] values in [LO, HI] -> [R] "clears the margin"


def student_t(x: np.ndarray) -> np.ndarray:
    n = x.shape[-1]
    sd = x.std(-1, ddof=1)
    low = x.mean(-1) - stats.t.ppf(1.0 - ALPHA, n - 1) * sd / math.sqrt(n)
    return np.where(sd > 0, low > MARGIN, x.mean(-1) > MARGIN)


def empirical_bernstein(x: np.ndarray) -> np.ndarray:
    """Maurer & Pontil (2009), Theorem 4, one-sided: ``mean - sqrt(2 V log(2/a) / n) - 7 log(2/a) / (3 (n - 1))`` on [0, 1]."""
    y = (x - LO) / (HI - LO)
    n, log_term = y.shape[-1], math.log(2.0 / ALPHA)
    low = y.mean(-1) - np.sqrt(2.0 * y.var(-1, ddof=1) * log_term / n) - 7.0 * log_term / (3.0 * (n - 1))
    return LO + (HI - LO) * low > MARGIN


def betting(cap: float) -> Rule:
    def rule(x: np.ndarray) -> np.ndarray:
        y = (x - LO) / (HI - LO)
        m = np.full(x.shape[0], (MARGIN - LO) / (HI - LO))
        return bounds._evalue_unit(y, m, ALPHA, cap) >= math.log(1.0 / ALPHA)

    return rule


def mde(rule: Rule, n: int, sd: float, *, reps: int, seed: int = 0) -> float:
    """Smallest effect with power >= POWER for ``rule`` (bisection on the effect, relative resolution 1%)."""
    draw = bounds.beta_sampler(lo=LO, hi=HI, sd=sd)
    top = HI - MARGIN if sd == 0 else (0.5 * (LO + HI) + math.sqrt(0.25 * (HI - LO) ** 2 - sd**2) - MARGIN) * (1 - 1e-9)

    def enough(e: float) -> bool:
        x = draw(np.random.default_rng(seed), (1 if sd == 0 else reps, n), MARGIN + e)
        return float(rule(x).mean()) >= POWER

    if n < 2 or not enough(top):
        return math.inf
    low, high = FLOOR, top
    if enough(low):
        return 0.0  # any positive effect: the Student-t rule on zero-spread data
    while high > low * 1.01:
        mid = math.sqrt(low * high)
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def _cell(v: float) -> str:
    return "-" if not math.isfinite(v) else "any > 0" if v == 0 else f"{v:.3g}"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3g}" if math.isfinite(a) and math.isfinite(b) and b > 0 else "-"


def power_table(seeds: tuple[int, ...], reps: int) -> Table:
    table = Table(
        title=f"Effect detected with 80% power on [-1, 1] at margin 0, alpha = {ALPHA} (Beta alternative, {reps} data sets)"
    )
    for col in ("seeds", "sd", "betting (ours)", "emp. Bernstein", "Student t (invalid)", "ours / EB", "ours / t"):
        table.add_column(col, justify="right")
    for n in seeds:
        for sd in SDS:
            ours = bounds.min_detectable_effect(n, lo=LO, hi=HI, margin=MARGIN, alpha=ALPHA, sd=sd, reps=reps)
            eb, t = mde(empirical_bernstein, n, sd, reps=reps), mde(student_t, n, sd, reps=reps)
            table.add_row(str(n), f"{sd:g}", _cell(ours), _cell(eb), _cell(t), _ratio(ours, eb), _ratio(ours, t))
    return table


def cap_table(seeds: tuple[int, ...], reps: int) -> Table:
    caps = (0.5, 0.75, bounds.BET_CAP)
    table = Table(title="Minimum detectable effect by bet cap c (same draws)")
    for col in ("seeds", "sd", *(f"c = {c:g}" for c in caps), f"c = {bounds.BET_CAP:g} / c = 0.5"):
        table.add_column(col, justify="right")
    for n in seeds:
        for sd in (0.05, 0.2, 0.4):
            vals = [mde(betting(c), n, sd, reps=reps) for c in caps]
            table.add_row(str(n), f"{sd:g}", *map(_cell, vals), _ratio(vals[-1], vals[0]))
    return table


def time_table(reps: int) -> Table:
    table = Table(title=f"Cost of the bound on [{reps}, N] data sets against the t interval (same data)")
    for col in ("seeds", "betting s", "t s", "betting / t"):
        table.add_column(col, justify="right")
    for n in (10, 100, 1000):
        x = np.random.default_rng(0).uniform(LO, HI, (reps, n))
        t0 = time.process_time()
        bounds.mean_lower_bound(x, lo=LO, hi=HI, alpha=ALPHA)
        ours = time.process_time() - t0
        t0 = time.process_time()
        for _ in range(10):
            student_t(x)
        ref = (time.process_time() - t0) / 10
        table.add_row(str(n), f"{ours:.3g}", f"{ref:.3g}", f"{ours / ref:.3g}")
    return table


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_bounds", description=__doc__)
    p.add_argument("--reps", type=int, default=1000, help="data sets per power estimate (default 1000)")
    p.add_argument("--caps", action="store_true", help="also compare bet caps c = 1/2, 3/4, 0.9")
    p.add_argument("--time", action="store_true", help="also time the bound against the t interval")
    p.add_argument("--small", action="store_true", help="seed counts up to 20 only")
    args = p.parse_args(argv)
    seeds = tuple(n for n in SEEDS if n <= 20) if args.small else SEEDS
    console = Console()
    t0, c0 = time.perf_counter(), time.process_time()
    console.print(power_table(seeds, args.reps))
    if args.caps:
        console.print(cap_table(tuple(n for n in seeds if n in (10, 20, 100)), args.reps))
    if args.time:
        console.print(time_table(200))
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    console.print(f"wall {time.perf_counter() - t0:.0f} s, CPU {time.process_time() - c0:.0f} s, load average {load}")


if __name__ == "__main__":
    main()
