"""The paper-check harness behind ``posttrain check``: run, summarise, judge, write the report.

For every selected check it builds the config (smoke or full, ``--seeds`` override), runs it with
a rich progress bar, and turns the `Result` into

- a row per metric: mean and its Student-t 95% interval over seeds beside the paper's value;
- a row per comparison, asserted ones first, then the reported-only ones in a section of their own:
  the criterion (mean / fraction of seeds / exact, with its margin), the paired mean and its t
  interval, the seeds clearing the margin, the criterion's one-sided p-value, and the status
  (pass / FAIL for asserted rows; "would pass" / "would fail" for reported ones);
- a verdict: *reproduced* when every asserted criterion holds at level
  `ALPHA`, *not reproduced* otherwise (numbers shown), *error*
  when ``run`` raised or declared a malformed criterion (the message is kept; the other checks
  still run).

The overview shows per check the asserted claim, the verdict, how many asserted criteria pass,
and the reported-only part of the claim with its headline comparisons, so a headline that is
only reported is visible next to the verdict. It ends with a one-screen summary (verdicts, total
wall and CPU time, where the report went).

``out`` receives ``report.md`` (linking the plots), ``results.json`` (run metadata: package
version, git commit, torch/numpy/scipy versions, total times; per check: id, paper, claim,
reported claim, verdict, metrics, comparisons with their statistics and margins, seeds, wall and
CPU time) and one PNG per check: small multiples, one axis per metric and per comparison (their
units differ), then any curves the check put in ``Result.extra["series"]`` as ``{title: {"x": [...],
"lines": {label: [...]}, "xlabel": str, "ylabel": str, "logx": bool, "logy": bool}}``.

``stability`` reruns every check at twice its seeds and lists each verdict and asserted criterion
that flips.

Exit code: 0 when every check ran (whatever the verdicts), 1 when one raised, 2 for an unknown
id; with ``strict`` a *not reproduced* verdict also gives 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import platform
import subprocess
import textwrap
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from posttrain.paper_checks import CHECKS, load_all
from posttrain.paper_checks.base import (
    ALPHA,
    Criterion,
    PaperCheck,
    Result,
    Verdict,
    compare,
    t_interval,
    verdict_of,
)
from posttrain.validate import value_checks

__all__ = ["CheckOutcome", "main", "run_check", "run_metadata", "select_checks", "stability", "summarise"]


@dataclass
class CheckOutcome:
    """One check's run: the result (or the error), the verdict, the wall and CPU time."""

    check: PaperCheck
    config: Any
    verdict: Verdict
    wall_time_s: float
    result: Result | None = None
    error: str | None = None
    traceback: str = ""
    summary: dict[str, Any] = field(default_factory=dict)
    cpu_time_s: float = 0.0


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


def _finite_stats(values: Sequence[float]) -> tuple[float, float, float, int]:
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan, math.nan, math.nan, 0
    lo, hi = t_interval(v)
    return float(v.mean()), lo, hi, int(v.size)


def summarise(result: Result) -> dict[str, Any]:
    """JSON-ready statistics of a result: per-metric mean and t interval, per-comparison criterion statistics.

    Raises:
        DomainError: a malformed asserted criterion (see `compare`).
    """
    metrics = []
    for m in result.metrics:
        mean, lo, hi, n = _finite_stats(m.per_seed)
        metrics.append(
            {
                "name": m.name,
                "per_seed": list(m.per_seed),
                "mean": mean,
                "ci_low": lo,
                "ci_high": hi,
                "n": n,
                "paper_value": m.paper_value,
                "note": m.note,
            }
        )
    comparisons = []
    for c in result.comparisons:
        st = compare(c)
        comparisons.append(
            {
                "name": c.name,
                "kind": c.kind.value,
                "differences": list(c.differences),
                "mean": st.mean,
                "ci_low": st.ci_low,
                "ci_high": st.ci_high,
                "p": st.p,
                "sign_p": st.sign_p,
                "n": st.n,
                "count": st.count,
                "required": st.required if c.kind is Criterion.FRACTION else None,
                "fraction": c.fraction,
                "rate_low": st.rate_low if c.kind is Criterion.FRACTION else None,
                "passed": st.passed,
                "margin": c.margin,
                "margin_reason": c.margin_reason,
                "asserted": c.asserted,
                "headline": c.headline,
                "paper_value": c.paper_value,
            }
        )
    return {"metrics": metrics, "comparisons": comparisons, "notes": result.notes, "alpha": ALPHA}


def run_check(check: PaperCheck, *, smoke: bool = False, seeds: int | None = None) -> CheckOutcome:
    """Run one check; an exception becomes an *error* outcome carrying the message."""
    start, cpu = time.perf_counter(), time.process_time()
    config: Any = None
    try:
        config = check.config(smoke=smoke, seeds=seeds)
        with value_checks(False):  # toy inner loops: shape checks stay, per-call value scans go
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
        )
    return CheckOutcome(
        check,
        config,
        verdict,
        time.perf_counter() - start,
        result=result,
        summary=summary,
        cpu_time_s=time.process_time() - cpu,
    )


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "nan"
    return f"{x:.{digits}g}"


def _margin_text(row: dict[str, Any]) -> str:
    """``mean > m``, ``> m in >= k/n seeds`` or ``exact > m``; ``>= x`` when the margin is the float just below ``x``."""
    m = float(row["margin"])
    snapped = 0.0 if abs(m) < 1e-300 else float(f"{m:.12g}")
    bound = f">= {_fmt(snapped)}" if snapped != m and math.nextafter(snapped, -math.inf) == m else f"> {_fmt(m)}"
    kind = row.get("kind", Criterion.MEAN.value)
    if kind == Criterion.FRACTION.value:
        need = row["required"]
        need_text = f"{need}/{row['n']}" if need is not None and need <= row["n"] else f"(impossible at n={row['n']})"
        return f"{bound} in >= {need_text} seeds"
    if kind == Criterion.EXACT.value:
        return f"exact {bound}"
    return f"mean {bound}"


def _interval(row: dict[str, Any]) -> str:
    """``mean [CI low, CI high]``; a single number (one seed, or a deterministic value) alone."""
    if row.get("n", 0) <= 1 or row.get("kind") == Criterion.EXACT.value:
        return _fmt(row["mean"])
    return f"{_fmt(row['mean'])} [{_fmt(row['ci_low'])}, {_fmt(row['ci_high'])}]"


def _p_text(row: dict[str, Any]) -> str:
    if row.get("kind") == Criterion.EXACT.value or row.get("n", 0) <= 1:
        return "-"
    return _fmt(row["p"], 3)


def _seeds_text(row: dict[str, Any]) -> str:
    return f"{row['count']}/{row['n']}" if row.get("n", 0) else "-"


def _status(row: dict[str, Any]) -> str:
    if row["asserted"]:
        return "pass" if row["passed"] else "FAIL"
    return "would pass" if row["passed"] else "would fail"


def _seeds_of(config: Any) -> int | None:
    return getattr(config, "seeds", None) if config is not None else None


def _asserted_count(o: CheckOutcome) -> str:
    rows = [c for c in o.summary.get("comparisons", []) if c["asserted"]]
    return f"{sum(c['passed'] for c in rows)}/{len(rows)}" if rows else "-"


def _reported_text(o: CheckOutcome) -> str:
    """The reported-only part of the claim and its headline comparisons (plain text)."""
    parts = [o.check.reported_claim] if o.check.reported_claim else []
    for c in o.summary.get("comparisons", []):
        if c["headline"] and not c["asserted"]:
            parts.append(f"{c['name']}: {_interval(c)}, {_status(c)}")
    return "; ".join(parts) or "-"


def outcome_json(o: CheckOutcome) -> dict[str, Any]:
    cfg = (
        dataclasses.asdict(o.config) if dataclasses.is_dataclass(o.config) and not isinstance(o.config, type) else None
    )
    return {
        "id": o.check.id,
        "paper": o.check.paper,
        "claim": o.check.claim,
        "reported_claim": o.check.reported_claim,
        "verdict": o.verdict.value,
        "asserted_passed": _asserted_count(o),
        "error": o.error,
        "wall_time_s": o.wall_time_s,
        "cpu_time_s": o.cpu_time_s,
        "seeds": _seeds_of(o.config),
        "config": cfg,
        "metrics": o.summary.get("metrics", []),
        "comparisons": o.summary.get("comparisons", []),
        "margin": [
            {"comparison": c["name"], "margin": c["margin"], "reason": c["margin_reason"]}
            for c in o.summary.get("comparisons", [])
            if c["asserted"]
        ],
        "notes": o.summary.get("notes", ""),
    }


def _git_commit() -> dict[str, Any]:
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": sha or None, "dirty": bool(dirty)}


def run_metadata() -> dict[str, Any]:
    """What produced a run: package, commit, library versions, machine."""
    import scipy

    import posttrain

    return {
        "package": "posttrain",
        "version": posttrain.__version__,
        **_git_commit(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "alpha_one_sided": ALPHA,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


_STYLE = {Verdict.REPRODUCED: "green", Verdict.NOT_REPRODUCED: "yellow", Verdict.ERROR: "red"}
_ROW_STYLE = {"pass": "green", "FAIL": "red", "would pass": "dim", "would fail": "dim"}


def _comparison_cells(c: dict[str, Any]) -> list[str]:
    return [c["name"], _margin_text(c), _interval(c), _seeds_text(c), _p_text(c), _fmt(c["paper_value"]), _status(c)]


_COMPARISON_COLS = ("Δ criterion", "rule", "mean [95% t CI]", "seeds > margin", "p (one-sided)", "paper", "status")


def _print_tables(outcomes: list[CheckOutcome], console: Console) -> None:
    overview = Table(title="paper checks", show_lines=True)
    for col in ("id", "asserted claim", "verdict", "asserted pass", "reported only", "seeds", "time (s)"):
        overview.add_column(col, overflow="fold")
    for o in outcomes:
        overview.add_row(
            o.check.id,
            o.check.claim,
            f"[{_STYLE[o.verdict]}]{o.verdict.value}[/]",
            _asserted_count(o),
            _reported_text(o),
            str(_seeds_of(o.config)),
            f"{o.wall_time_s:.1f}",
        )
    console.print(overview)
    for o in outcomes:
        if o.error is not None:
            console.print(f"[red]{o.check.id}: error: {o.error}[/]")
            continue
        if o.summary["metrics"]:
            t = Table(title=f"{o.check.id}: {o.check.paper}: metrics")
            for col in ("quantity", "mean [95% t CI]", "paper"):
                t.add_column(col)
            for m in o.summary["metrics"]:
                t.add_row(m["name"], _interval(m), _fmt(m["paper_value"]))
            console.print(t)
        t = Table(title=f"{o.check.id}: criteria (one-sided level {ALPHA})")
        for col in _COMPARISON_COLS:
            t.add_column(col)
        rows = o.summary["comparisons"]
        for c in (c for c in rows if c["asserted"]):
            cells = _comparison_cells(c)
            cells[-1] = f"[{_ROW_STYLE[cells[-1]]}]{cells[-1]}[/]"
            t.add_row(*cells)
        reported = [c for c in rows if not c["asserted"]]
        if reported:
            t.add_section()
            t.add_row("[bold]reported only (not in the verdict)[/]", *[""] * (len(_COMPARISON_COLS) - 1))
            for c in reported:
                t.add_row(*_comparison_cells(c), style="dim")
        console.print(t)


def _print_summary(outcomes: list[CheckOutcome], console: Console, meta: dict[str, Any], out: str | None) -> None:
    """One line per check (verdict, asserted criteria passing, headline reported rows), then the totals."""
    t = Table(title="summary", box=None, pad_edge=False)
    for col in ("id", "verdict", "asserted pass", "reported headline", "seeds", "time (s)"):
        t.add_column(col, no_wrap=col != "reported headline", overflow="ellipsis")
    for o in outcomes:
        heads = [c for c in o.summary.get("comparisons", []) if c["headline"] and not c["asserted"]]
        head = "; ".join(f"{_interval(c).split(' ')[0]} {_status(c)}" for c in heads) or "-"
        t.add_row(
            o.check.id,
            f"[{_STYLE[o.verdict]}]{o.verdict.value}[/]",
            _asserted_count(o),
            head,
            str(_seeds_of(o.config)),
            f"{o.wall_time_s:.1f}",
        )
    console.print(t)
    verdicts = {v: sum(o.verdict is v for o in outcomes) for v in Verdict}
    console.print(
        f"{len(outcomes)} checks: "
        + ", ".join(f"{n} {v.value}" for v, n in verdicts.items() if n)
        + f"; total {meta['wall_time_s']:.0f} s wall, {meta['cpu_time_s']:.0f} s CPU"
        + (f"; report: {Path(out) / 'report.md'}" if out is not None else "")
    )


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def _markdown(outcomes: list[CheckOutcome], *, smoke: bool, meta: dict[str, Any], plots: dict[str, str]) -> str:
    commit = f"{meta.get('commit') or 'unknown'}{' (uncommitted changes)' if meta.get('dirty') else ''}"
    lines = [
        "# Paper checks",
        "",
        f"Mode: {'smoke' if smoke else 'full'}. posttrain {meta['version']}, commit {commit}, torch {meta['torch']}.",
        "",
        f"Every asserted criterion is judged at one-sided level {ALPHA}: a mean by its Student-t 95% interval "
        "(lower end above the margin), a fraction of seeds by the count and an exact binomial test against 1/2, "
        "an exact (deterministic) value directly. Reported-only rows are shown, never part of the verdict.",
        "",
        "| id | asserted claim | verdict | asserted pass | reported only | seeds | time (s) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        lines.append(
            f"| [{o.check.id}](#check-{o.check.id}) | {_md(o.check.claim)} | {o.verdict.value} | {_asserted_count(o)} | "
            f"{_md(_reported_text(o))} | {_seeds_of(o.config)} | {o.wall_time_s:.1f} |"
        )
    header = "| " + " | ".join(_COMPARISON_COLS) + " |"
    rule = "| " + " | ".join("---" for _ in _COMPARISON_COLS) + " |"
    for o in outcomes:
        lines += [
            "",
            f'<a id="check-{o.check.id}"></a>',
            f"## {o.check.id}: {_md(o.check.paper)}",
            "",
            f"Asserted claim: {o.check.claim}",
            "",
        ]
        if o.check.reported_claim:
            lines += [f"Reported only: {o.check.reported_claim}", ""]
        lines += [f"**Verdict: {o.verdict.value}** (asserted criteria passing: {_asserted_count(o)})", ""]
        if o.error is not None:
            lines += ["```", o.traceback.strip() or o.error, "```"]
            continue
        if o.check.id in plots:
            lines += [f"![check {o.check.id}]({plots[o.check.id]})", ""]
        if o.summary["metrics"]:
            lines += ["| quantity | mean [95% t CI] | paper |", "| --- | --- | --- |"]
            lines += [f"| {_md(m['name'])} | {_interval(m)} | {_fmt(m['paper_value'])} |" for m in o.summary["metrics"]]
            lines.append("")
        for title, asserted in (("Asserted criteria", True), ("Reported only (not in the verdict)", False)):
            rows = [c for c in o.summary["comparisons"] if c["asserted"] is asserted]
            if rows:
                lines += [f"{title}:", "", header, rule]
                lines += ["| " + " | ".join(_md(x) for x in _comparison_cells(c)) + " |" for c in rows]
                lines.append("")
        reasons = [
            f"- {_md(c['name'])}: {_margin_text(c)} — {c['margin_reason']}"
            for c in o.summary["comparisons"]
            if c["margin_reason"] and c["asserted"]
        ]
        if reasons:
            lines += ["Margins (asserted):", *reasons, ""]
        if o.summary["notes"]:
            lines += [o.summary["notes"], ""]
    return "\n".join(lines).rstrip() + "\n"


_COLORS = {"pass": "tab:green", "FAIL": "tab:red", "would pass": "tab:gray", "would fail": "tab:gray"}


def _small_axis(ax: Any, values: np.ndarray, mean: float, lo: float, hi: float, title: str) -> None:
    """One quantity on its own axis: per-seed dots, the mean and its t interval."""
    from matplotlib.ticker import FormatStrFormatter, MaxNLocator

    jitter = np.linspace(-0.15, 0.15, values.size) if values.size > 1 else np.zeros(1)
    ax.scatter(values, jitter, s=10, color="tab:blue", alpha=0.6, zorder=2)
    if math.isfinite(mean):
        ax.errorbar(
            [mean], [0.0], xerr=[[max(mean - lo, 0.0)], [max(hi - mean, 0.0)]], fmt="kd", capsize=3, ms=4, zorder=3
        )
    ax.set_yticks([])
    ax.set_ylim(-0.5, 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(5))
    ax.xaxis.set_major_formatter(FormatStrFormatter("%.4g"))  # no offset text spilling onto the next row
    ax.tick_params(axis="x", labelsize=6)
    ax.set_title("\n".join(textwrap.wrap(title, 38)[:3]), fontsize=6.5)


@dataclass(frozen=True)
class PlotData:
    """What one check's figure shows, as plain data (picklable: the figure is drawn in another process)."""

    check_id: str
    verdict: str
    metrics: list[dict[str, Any]]
    comparisons: list[dict[str, Any]]
    series: dict[str, Any]

    @classmethod
    def of(cls, o: CheckOutcome) -> PlotData:
        assert o.result is not None
        series = o.result.extra.get("series", {}) if isinstance(o.result.extra, dict) else {}
        return cls(o.check.id, o.verdict.value, o.summary["metrics"], o.summary["comparisons"], series)


class Plotter:
    """Draws the checks' figures in one worker process while the next check runs (``with`` block).

    The checks use one core; on a machine with two or more, matplotlib's drawing (seconds per
    figure: constrained layout, ticks) then costs no wall time. With one core it runs inline.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.names: dict[str, str] = {}  # check id -> figure file name
        self.futures: list[Any] = []
        self.pool: Any = None

    def __enter__(self) -> Plotter:
        import multiprocessing
        import os
        from concurrent.futures import ProcessPoolExecutor

        self.folder.mkdir(parents=True, exist_ok=True)
        if (os.cpu_count() or 1) > 1:  # spawn: no fork of a process holding torch's threads
            self.pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        return self

    def add(self, o: CheckOutcome) -> None:
        """Queue the figure of ``o`` (a check that raised has none)."""
        if o.result is None:
            return
        name = f"check_{o.check.id}.png"
        data, path = PlotData.of(o), self.folder / name
        if self.pool is None:
            _plot(data, path)
        else:
            self.futures.append(self.pool.submit(_plot, data, path))
        self.names[o.check.id] = name

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            try:
                for future in self.futures:
                    future.result()  # a drawing error surfaces here
            finally:
                self.pool.shutdown()


def _plot(data: PlotData, path: Path) -> None:
    """Small multiples: one axis per metric, one per comparison (coloured by status), one per curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series, ms, cs = data.series, data.metrics, data.comparisons
    cols = 4
    n_axes = len(ms) + len(cs)
    rows_small = math.ceil(n_axes / cols)
    rows_series = math.ceil(len(series) / 2)
    fig = plt.figure(figsize=(12, 1.15 * rows_small + 3.2 * rows_series + 0.8), layout="constrained")
    grid = fig.add_gridspec(rows_small + rows_series, cols, height_ratios=[1.0] * rows_small + [2.8] * rows_series)
    for i, m in enumerate(ms):
        ax = fig.add_subplot(grid[i // cols, i % cols])
        v = np.asarray(m["per_seed"], dtype=np.float64)
        _small_axis(ax, v[np.isfinite(v)], m["mean"], m["ci_low"], m["ci_high"], f"metric: {m['name']}")
        if m["paper_value"] is not None:
            ax.plot([m["paper_value"]], [0.3], "r*", ms=7, zorder=4)
        ax.set_xlabel("value (* paper)" if m["paper_value"] is not None else "value", fontsize=6)
    for j, c in enumerate(cs):
        i = len(ms) + j
        ax = fig.add_subplot(grid[i // cols, i % cols])
        status = _status(c)
        v = np.asarray(c["differences"], dtype=np.float64)
        _small_axis(ax, v[np.isfinite(v)], c["mean"], c["ci_low"], c["ci_high"], f"Δ {c['name']}")
        ax.axvline(c["margin"], color=_COLORS[status], lw=1.5, ls="-" if c["asserted"] else ":")
        ax.set_xlabel(f"difference; line: margin; {status}", fontsize=6, color=_COLORS[status])
        for spine in ax.spines.values():
            spine.set_edgecolor(_COLORS[status] if c["asserted"] else "lightgray")
    for j, (title, spec) in enumerate(series.items()):
        ax = fig.add_subplot(grid[rows_small + j // 2, (j % 2) * 2 : (j % 2) * 2 + 2])
        for label, ys in spec.get("lines", {}).items():
            ax.plot(spec["x"], ys, marker=".", label=str(label))
        ax.set_xscale("log" if spec.get("logx") else "linear")
        if spec.get("logx") and len(spec["x"]) <= 12:  # label the grid itself, not crowded minor ticks
            ax.set_xticks(spec["x"], [f"{x:g}" for x in spec["x"]])
            ax.minorticks_off()
        ax.set_yscale("log" if spec.get("logy") else "linear")
        ax.set_xlabel(spec.get("xlabel") or "x", fontsize=8)
        ax.set_ylabel(spec.get("ylabel") or "value", fontsize=8)
        ax.set_title(title, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    fig.suptitle(
        f"{data.check_id}: {data.verdict} (dots: seeds; diamond: mean with 95% t interval; "
        "solid margin line: asserted, dotted: reported only)",
        fontsize=9,
    )
    fig.savefig(path, dpi=90)
    plt.close(fig)


def stability(outcomes: list[CheckOutcome], *, smoke: bool = False) -> list[dict[str, Any]]:
    """Rerun each check that ran at twice its seeds; one record per check with every flip."""
    records = []
    for o in outcomes:
        n = _seeds_of(o.config)
        if o.result is None or n is None:
            continue
        again = run_check(o.check, smoke=smoke, seeds=2 * n)
        before = {c["name"]: c["passed"] for c in o.summary["comparisons"] if c["asserted"]}
        after = {c["name"]: c["passed"] for c in again.summary.get("comparisons", []) if c["asserted"]}
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


def _print_stability(records: list[dict[str, Any]], console: Console) -> None:
    t = Table(title="stability: each check rerun at twice its seeds")
    for col in ("id", "seeds", "verdict", "verdict at 2x", "flipped asserted criteria"):
        t.add_column(col, overflow="fold")
    for r in records:
        flips = "; ".join(f"{f['criterion']}: {f['at_n']} -> {f['at_2n']}" for f in r["criterion_flips"]) or "none"
        style = "red" if r["verdict_flipped"] else ""
        t.add_row(r["id"], str(r["seeds"]), r["verdict"], r["verdict_2x"], flips, style=style)
    console.print(t)


def main(
    ids: Sequence[str],
    *,
    smoke: bool = False,
    seeds: int | None = None,
    out: str | None = None,
    json_out: bool = False,
    strict: bool = False,
    check_stability: bool = False,
    console: Console | None = None,
) -> int:
    """Run the selected checks, print the tables (or JSON), write the report; return the exit code."""
    console = console or Console()
    try:
        checks = select_checks(ids)
    except KeyError as exc:
        console.print(f"[red]{exc.args[0]}[/]")
        return 2
    meta = run_metadata()
    start, cpu = time.perf_counter(), time.process_time()
    outcomes: list[CheckOutcome] = []
    records: list[dict[str, Any]] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # toy tensors are tiny: extra threads only add contention
    plotter = Plotter(Path(out)) if out is not None else None
    try:
        with (
            contextlib.nullcontext() if plotter is None else plotter,
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                console=console,
                transient=json_out,
                disable=json_out,
            ) as progress,
        ):
            task = progress.add_task("paper checks", total=len(checks))
            for check in checks:
                progress.update(task, description=f"check {check.id}")
                outcomes.append(run_check(check, smoke=smoke, seeds=seeds))
                if plotter is not None:
                    plotter.add(outcomes[-1])
                progress.advance(task)
            progress.update(task, description="paper checks (figures)")
        if check_stability:
            records = stability(outcomes, smoke=smoke)
    finally:
        torch.set_num_threads(threads)
    meta["wall_time_s"] = time.perf_counter() - start
    meta["cpu_time_s"] = time.process_time() - cpu
    payload: dict[str, Any] = {
        "mode": "smoke" if smoke else "full",
        "run": meta,
        "checks": [outcome_json(o) for o in outcomes],
    }
    if check_stability:
        payload["stability"] = records
    if json_out:
        print(json.dumps(payload, indent=2, default=float))
    else:
        _print_tables(outcomes, console)
        if check_stability:
            _print_stability(records, console)
    if plotter is not None:
        folder, plots = plotter.folder, plotter.names
        (folder / "results.json").write_text(json.dumps(payload, indent=2, default=float) + "\n")
        (folder / "report.md").write_text(_markdown(outcomes, smoke=smoke, meta=meta, plots=plots))
    if not json_out:
        _print_summary(outcomes, console, meta, out)
    errors = any(o.verdict is Verdict.ERROR for o in outcomes)
    failed = any(o.verdict is Verdict.NOT_REPRODUCED for o in outcomes)
    return 1 if errors or (strict and failed) else 0
