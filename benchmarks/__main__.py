"""``python -m benchmarks``: time the core estimators against references and print the ratios.

Defaults are the issue's sizes: B=4096 sequences, T=1024 tokens, groups of K=8, float32 on CPU,
one thread (the ratio is steadier on a shared machine; ``--threads 0`` keeps torch's default).
Times are medians with ``[min-max]`` over interleaved repeats (CPU time of the process with one
thread); the load average is printed with the table. glibc's malloc is tuned first (mmap threshold
32 MiB, trim threshold 1 GiB, as ``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824``
would): otherwise every large temporary is a fresh mmap that pays page faults on first touch
(``--default-malloc`` to measure that). verl rows appear when verl is importable.
``--small`` runs a tiny size (used by the smoke test). ``--all`` adds the method families'
row benchmarks (distillation signals, path-space estimators, SIS/replay, Muon step, SAR edit).
The exit status is 0 whether or not a target is met: this is a measurement, not a test.

Benchmarks with their own command line (multi-process or long): ``python -m benchmarks.bench_es``,
``python -m benchmarks.bench_dpo_design``, ``python -m benchmarks.bench_trainer`` (``make bench`` runs
them all).
"""

from __future__ import annotations

import argparse

import torch
from rich.console import Console
from rich.table import Table

from benchmarks import bench_advantages, bench_policy_loss, bench_simulators
from benchmarks._timing import Row, load_average, page_faults, tune_malloc


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument("--b", type=int, default=4096, help="sequences B (default 4096)")
    p.add_argument("--t", type=int, default=1024, help="tokens T (default 1024)")
    p.add_argument("--k", type=int, default=8, help="samples per group K (default 8)")
    p.add_argument("--repeats", type=int, default=15, help="timed calls of each side (best is kept)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    p.add_argument("--small", action="store_true", help="tiny sizes, 2 repeats (smoke test)")
    p.add_argument("--all", action="store_true", help="also the method families' row benchmarks")
    p.add_argument("--default-malloc", action="store_true", help="keep glibc's default mmap/trim thresholds")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> list[Row]:
    b, t, k, repeats = (64, 16, 8, 2) if args.small else (args.b, args.t, args.k, args.repeats)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = bench_advantages.run(b=b, t=t, k=k, repeats=repeats)
    rows += bench_policy_loss.run(b=b, t=t, repeats=repeats)
    toy = {"g": 4, "k": 4, "t": 3, "repeats": 1} if args.small else {}  # toy step: the G=64, K=32, T=8
    rows += bench_simulators.run(**toy)
    if args.all:
        rows += _families(small=args.small, repeats=repeats)
    return rows


def _families(*, small: bool, repeats: int) -> list[Row]:
    """Row benchmarks of the method families, at their issues' sizes (tiny with ``small``)."""
    from benchmarks import bench_distill, bench_offpolicy, bench_optim, bench_path_space, bench_sar

    if small:
        return (
            bench_distill.run(b=8, t=16, k=4, repeats=1)
            + bench_path_space.run(paths=16, steps=8, times=4, group=4, dims=(1,), repeats=1)
            + bench_offpolicy.sis_rows(b=16, t=64, k=4, repeats=1)
            + bench_offpolicy.replay_rows(groups=64, k=16, repeats=1)
            + bench_optim.run(repeats=1, hidden=64, layers=1)
        )
    return (
        bench_distill.run(repeats=repeats)
        + bench_path_space.run()
        + bench_offpolicy.sis_rows(b=512, t=4096, k=20, repeats=repeats)
        + bench_offpolicy.replay_rows(groups=4096, k=16, repeats=repeats)
        + bench_optim.run()
        + bench_sar.run()
    )


def table(rows: list[Row]) -> Table:
    tab = Table(title=f"posttrain benchmarks (float32, CPU, {torch.get_num_threads()} thread(s))")
    for col in ("what", "posttrain ms", "anchor", "anchor ms", "ratio", "goal", "met"):
        tab.add_column(col, justify="left" if col in ("what", "anchor") else "right")
    for r in rows:
        kind = "x faster" if r.higher_is_better else "x the time"
        target = "" if r.target is None else (">= " if r.higher_is_better else "<= ") + f"{r.target:g}"
        met = "" if r.met is None else ("yes" if r.met else "NO")
        tab.add_row(r.name, _ms(r.ours_s, r.ours_spread), r.reference, _ms(r.reference_s, r.reference_spread),
                    f"{r.ratio:.2f}{kind}", target, met)  # fmt: skip
    return tab


def _ms(seconds: float, spread: object) -> str:
    """``median [min-max]`` in milliseconds when a spread was measured, else the single time."""
    lo, hi = getattr(spread, "low", None), getattr(spread, "high", None)
    if lo is None or hi is None:
        return f"{seconds * 1e3:.2f}"
    return f"{seconds * 1e3:.1f} [{lo * 1e3:.1f}-{hi * 1e3:.1f}]"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    tuned = False if args.default_malloc else tune_malloc()
    faults = page_faults()
    before = load_average()
    rows = run(args)
    console = Console(width=170)
    console.print(table(rows))
    malloc = "tuned (mmap threshold 32 MiB, trim 1 GiB)" if tuned else "glibc default"
    console.print(
        f"{before} before, {load_average()} after; malloc {malloc}; {page_faults() - faults} minor page faults"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
