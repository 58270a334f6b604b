"""The paper-check harness behind ``posttrain check``: run, summarise, judge, write the report.

For every selected check it builds the config (smoke or full, ``--seeds`` override), runs it with
a rich progress bar, and turns the :class:`~posttrain.paper_checks.base.Result` into

- a table row per metric: mean +/- a 95% bootstrap CI over seeds beside the paper's value;
- a row per comparison: the paired mean difference, its 95% paired-bootstrap CI, the one-sided
  sign-test p-value, the declared margin and whether it is asserted;
- a verdict: *reproduced* when every asserted comparison's CI lower end clears its margin,
  *not reproduced* otherwise (numbers shown), *error* when ``run`` raised (the message is kept;
  the other checks still run).

``out`` receives ``report.md``, ``results.json`` (per check: id, paper, claim, verdict, metrics,
comparisons with margins, seeds, wall time) and one PNG per check (metrics with CIs, per-seed
paired differences against the margin, and any curves the check put in ``Result.extra["series"]``
as ``{title: {"x": [...], "lines": {label: [...]}, "xlabel": str, "ylabel": str, "logx": bool,
"logy": bool}}``).

Exit code: 0 when every check ran (whatever the verdicts), 1 when one raised, 2 for an unknown
id; with ``strict`` a *not reproduced* verdict also gives 1.
"""

from __future__ import annotations

import dataclasses
import json
import math
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
    PaperCheck,
    Result,
    Verdict,
    compare,
    paired_bootstrap_ci,
    verdict_of,
)

__all__ = ["CheckOutcome", "main", "run_check", "select_checks", "summarise"]


@dataclass
class CheckOutcome:
    """One check's run: the result (or the error), the verdict and the wall time."""

    check: PaperCheck
    config: Any
    verdict: Verdict
    wall_time_s: float
    result: Result | None = None
    error: str | None = None
    traceback: str = ""
    summary: dict[str, Any] = field(default_factory=dict)


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
    lo, hi = paired_bootstrap_ci(v)
    return float(v.mean()), lo, hi, int(v.size)


def summarise(result: Result) -> dict[str, Any]:
    """JSON-ready statistics of a result: per-metric mean and CI, per-comparison paired statistics."""
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
                "differences": list(c.differences),
                "mean": st.mean,
                "ci_low": st.ci_low,
                "ci_high": st.ci_high,
                "sign_p": st.sign_p,
                "n": st.n,
                "passed": st.passed,
                "margin": c.margin,
                "margin_reason": c.margin_reason,
                "asserted": c.asserted,
                "every_seed": bool(getattr(c, "every_seed", False)),
                "min_seeds": getattr(c, "min_seeds", None),
                "paper_value": c.paper_value,
            }
        )
    return {"metrics": metrics, "comparisons": comparisons, "notes": result.notes}


def run_check(check: PaperCheck, *, smoke: bool = False, seeds: int | None = None) -> CheckOutcome:
    """Run one check; an exception becomes an *error* outcome carrying the message."""
    start = time.perf_counter()
    config: Any = None
    try:
        config = check.config(smoke=smoke, seeds=seeds)
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
        )
    return CheckOutcome(check, config, verdict, time.perf_counter() - start, result=result, summary=summary)


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "nan"
    return f"{x:.{digits}g}"


def _margin_text(row: dict[str, Any]) -> str:
    """``> m``, or ``>= x`` when the margin is the float just below ``x`` (how a check writes "at least x")."""
    m = float(row["margin"])
    snapped = 0.0 if abs(m) < 1e-300 else float(f"{m:.12g}")
    text = f">= {_fmt(snapped)}" if snapped != m and math.nextafter(snapped, -math.inf) == m else f"> {_fmt(m)}"
    if row.get("min_seeds") is not None:
        text += f" in >= {row['min_seeds']}/{row['n']} seeds"
    elif row.get("every_seed"):
        text += " in every seed"
    return text


def _interval(row: dict[str, Any]) -> str:
    """``mean [CI low, CI high]``; a single number (one seed, or a deterministic check) alone."""
    if row.get("n", 0) <= 1:
        return _fmt(row["mean"])
    return f"{_fmt(row['mean'])} [{_fmt(row['ci_low'])}, {_fmt(row['ci_high'])}]"


def _sign_p(row: dict[str, Any]) -> str:
    return _fmt(row["sign_p"], 3) if row.get("n", 0) > 1 else "-"


def _seeds_of(config: Any) -> int | None:
    return getattr(config, "seeds", None) if config is not None else None


def outcome_json(o: CheckOutcome) -> dict[str, Any]:
    cfg = (
        dataclasses.asdict(o.config) if dataclasses.is_dataclass(o.config) and not isinstance(o.config, type) else None
    )
    return {
        "id": o.check.id,
        "paper": o.check.paper,
        "claim": o.check.claim,
        "verdict": o.verdict.value,
        "error": o.error,
        "wall_time_s": o.wall_time_s,
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


_STYLE = {Verdict.REPRODUCED: "green", Verdict.NOT_REPRODUCED: "yellow", Verdict.ERROR: "red"}


def _print_tables(outcomes: list[CheckOutcome], console: Console) -> None:
    overview = Table(title="paper checks")
    for col in ("id", "claim", "verdict", "seeds", "time (s)"):
        overview.add_column(col)
    for o in outcomes:
        overview.add_row(
            o.check.id,
            o.check.claim,
            f"[{_STYLE[o.verdict]}]{o.verdict.value}[/]",
            str(_seeds_of(o.config)),
            f"{o.wall_time_s:.1f}",
        )
    console.print(overview)
    for o in outcomes:
        if o.error is not None:
            console.print(f"[red]{o.check.id}: error: {o.error}[/]")
            continue
        t = Table(title=f"{o.check.id}: {o.check.paper}", show_lines=False)
        for col in ("quantity", "mean [95% CI]", "paper", "margin", "sign p", "status"):
            t.add_column(col)
        for m in o.summary["metrics"]:
            t.add_row(m["name"], _interval(m), _fmt(m["paper_value"]), "", "", "")
        for c in o.summary["comparisons"]:
            status = ("pass" if c["passed"] else "FAIL") if c["asserted"] else "reported"
            t.add_row(
                f"Δ {c['name']}",
                _interval(c),
                _fmt(c["paper_value"]),
                _margin_text(c),
                _sign_p(c),
                status,
            )
        console.print(t)


def _markdown(outcomes: list[CheckOutcome], *, smoke: bool) -> str:
    lines = [
        "# Paper checks",
        "",
        f"Mode: {'smoke' if smoke else 'full'}.",
        "",
        "| id | claim | verdict | seeds | time (s) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.check.id} | {o.check.claim} | {o.verdict.value} | {_seeds_of(o.config)} | {o.wall_time_s:.1f} |"
        )
    for o in outcomes:
        lines += ["", f"## {o.check.id}: {o.check.paper}", "", o.check.claim, "", f"**Verdict: {o.verdict.value}**", ""]
        if o.error is not None:
            lines += ["```", o.traceback.strip() or o.error, "```"]
            continue
        lines += [
            "| quantity | mean [95% CI] | paper | margin | sign p | status |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for m in o.summary["metrics"]:
            lines.append(f"| {m['name']} | {_interval(m)} | {_fmt(m['paper_value'])} |  |  |  |")
        for c in o.summary["comparisons"]:
            status = ("pass" if c["passed"] else "FAIL") if c["asserted"] else "reported"
            lines.append(
                f"| Δ {c['name']} | {_interval(c)} | {_fmt(c['paper_value'])} | {_margin_text(c)} | "
                f"{_sign_p(c)} | {status} |"
            )
        reasons = [
            f"- {c['name']}: {_margin_text(c)} — {c['margin_reason']}"
            for c in o.summary["comparisons"]
            if c["margin_reason"]
        ]
        if reasons:
            lines += ["", "Margins:", *reasons]
        if o.summary["notes"]:
            lines += ["", o.summary["notes"]]
    return "\n".join(lines) + "\n"


def _plot(o: CheckOutcome, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    assert o.result is not None
    series = o.result.extra.get("series", {}) if isinstance(o.result.extra, dict) else {}
    panels = 2 + len(series)
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4), squeeze=False)
    ax = axes[0][0]
    ms = o.summary["metrics"]
    if ms:
        means = [m["mean"] for m in ms]
        err = np.array([[m["mean"] - m["ci_low"] for m in ms], [m["ci_high"] - m["mean"] for m in ms]])
        ax.barh(range(len(ms)), means, xerr=np.nan_to_num(err), color="tab:blue", alpha=0.7)
        for i, m in enumerate(ms):
            if m["paper_value"] is not None:
                ax.plot(m["paper_value"], i, "r*", markersize=10)
        ax.set_yticks(range(len(ms)), [m["name"] for m in ms], fontsize=7)
    ax.set_title("metrics (bar: mean, 95% CI; *: paper)", fontsize=8)
    ax = axes[0][1]
    for i, c in enumerate(o.summary["comparisons"]):
        d = np.asarray(c["differences"], dtype=np.float64)
        ax.scatter(d, np.full(d.shape, i), s=12, color="tab:green" if c["passed"] else "tab:red")
        ax.plot([c["margin"]] * 2, [i - 0.3, i + 0.3], "k-")
    ax.set_yticks(range(len(o.summary["comparisons"])), [c["name"] for c in o.summary["comparisons"]], fontsize=7)
    ax.set_title("paired differences per seed (|: margin)", fontsize=8)
    for j, (title, spec) in enumerate(series.items()):
        ax = axes[0][2 + j]
        for label, ys in spec.get("lines", {}).items():
            ax.plot(spec["x"], ys, marker=".", label=str(label))
        ax.set_xscale("log" if spec.get("logx") else "linear")
        ax.set_yscale("log" if spec.get("logy") else "linear")
        ax.set_xlabel(spec.get("xlabel", ""))
        ax.set_ylabel(spec.get("ylabel", ""))
        ax.set_title(title, fontsize=8)
        ax.legend(fontsize=6)
    fig.suptitle(f"{o.check.id}: {o.verdict.value}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight")  # long metric labels stay inside the image
    plt.close(fig)


def main(
    ids: Sequence[str],
    *,
    smoke: bool = False,
    seeds: int | None = None,
    out: str | None = None,
    json_out: bool = False,
    strict: bool = False,
    console: Console | None = None,
) -> int:
    """Run the selected checks, print the tables (or JSON), write the report; return the exit code."""
    console = console or Console()
    try:
        checks = select_checks(ids)
    except KeyError as exc:
        console.print(f"[red]{exc.args[0]}[/]")
        return 2
    outcomes: list[CheckOutcome] = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # toy tensors are tiny: extra threads only add contention
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            console=console,
            transient=json_out,
            disable=json_out,
        ) as progress:
            task = progress.add_task("paper checks", total=len(checks))
            for check in checks:
                progress.update(task, description=f"check {check.id}")
                outcomes.append(run_check(check, smoke=smoke, seeds=seeds))
                progress.advance(task)
    finally:
        torch.set_num_threads(threads)
    payload = {"mode": "smoke" if smoke else "full", "checks": [outcome_json(o) for o in outcomes]}
    if json_out:
        print(json.dumps(payload, indent=2, default=float))
    else:
        _print_tables(outcomes, console)
    if out is not None:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "results.json").write_text(json.dumps(payload, indent=2, default=float) + "\n")
        (folder / "report.md").write_text(_markdown(outcomes, smoke=smoke))
        for o in outcomes:
            if o.result is not None:
                _plot(o, folder / f"check_{o.check.id}.png")
    errors = any(o.verdict is Verdict.ERROR for o in outcomes)
    failed = any(o.verdict is Verdict.NOT_REPRODUCED for o in outcomes)
    return 1 if errors or (strict and failed) else 0
