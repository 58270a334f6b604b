"""The terminal view of a run (rich): the one-screen summary, and on request the per-check tables.

The summary has one line per check (verdict, primary endpoint with its interval, secondary criteria
holding, seeds, time) and the totals; ``--tables`` adds each check's metric and comparison tables
(the same rows as ``report.md``); mutant and stability runs get a table of their own.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from posttrain.paper_checks.model import ALPHA, Role, Verdict
from posttrain.paper_checks.report import (
    COMPARISON_COLUMNS,
    comparison_cells,
    fmt,
    interval_text,
    outcome_json,
    primary_row,
    rule_text,
    secondary_count,
)
from posttrain.paper_checks.runner import CheckOutcome

__all__ = ["print_mutants", "print_stability", "print_summary", "print_tables"]

STYLE = {Verdict.REPRODUCED: "green", Verdict.CONTRADICTED: "red", Verdict.INCONCLUSIVE: "yellow", Verdict.ERROR: "red"}
_OUTCOME_STYLE = {"holds": "green", "excluded": "red", "undecided": "yellow"}


def _verdict(v: Verdict) -> str:
    return f"[{STYLE[v]}]{v.value}[/]"


def print_tables(outcomes: list[CheckOutcome], console: Console) -> None:
    """Each check's metrics and comparisons (primary first, then secondary, then context rows)."""
    for o in outcomes:
        if o.error is not None:
            console.print(f"[red]{o.check.id}: error: {escape(o.error)}[/]")
            continue
        if o.summary["metrics"]:
            t = Table(title=escape(f"{o.check.id}: {o.check.paper}: metrics"))
            for col in ("quantity", "mean", "sd", "paper"):
                t.add_column(col)
            for m in o.summary["metrics"]:
                t.add_row(escape(m["name"]), fmt(m["mean"]), fmt(m["sd"], 3), fmt(m["paper_value"]))
            console.print(t)
        t = Table(title=f"{o.check.id}: comparisons (one-sided level {ALPHA}): {_verdict(o.verdict)}")
        for col in COMPARISON_COLUMNS:
            t.add_column(col, overflow="fold")
        rows = sorted(o.summary["comparisons"], key=lambda c: list(Role).index(Role(c["role"])))
        for c in rows:
            cells = [escape(x) for x in comparison_cells(c)]
            cells[-1] = f"[{_OUTCOME_STYLE[c['outcome']]}]{cells[-1]}[/]"
            t.add_row(*cells, style="dim" if c["role"] == Role.CONTEXT.value else None)
        console.print(t)


def _mde_text(row: dict[str, Any] | None) -> str:
    mde = None if row is None else row.get("mde")
    if mde is None or math.isnan(mde):
        return "-"
    return "none" if math.isinf(mde) else fmt(mde, 3)


def print_summary(
    outcomes: list[CheckOutcome], console: Console, meta: dict[str, Any], out: str | None, *, title: str = "summary"
) -> None:
    """One line per check (verdict, primary estimate and interval against its rule, MDE, secondary holding), then totals.

    The primary endpoints' names and abstract sentences are in the report (``--out``) and in ``--tables``.
    """
    t = Table(title=title, box=None, pad_edge=False)
    for col in ("id", "verdict", "primary [95% CI]", "needs", "MDE", "secondary", "seeds", "time (s)"):
        folds = col in ("primary [95% CI]", "needs")  # the other columns keep their width on a narrow terminal
        t.add_column(
            col, no_wrap=not folds, overflow="fold" if folds else "ellipsis", min_width=None if folds else len(col)
        )
    for o in outcomes:
        record = outcome_json(o)
        row = primary_row(record)
        estimate = interval_text(row) if row is not None else (o.error or "-")
        needs = rule_text(row) if row is not None else "-"
        t.add_row(o.check.id, _verdict(o.verdict), escape(estimate), escape(needs), _mde_text(row),
                  secondary_count(record), str(record["seeds"]), f"{o.wall_time_s:.1f}")  # fmt: skip
    console.print(t)
    counts = {v: sum(o.verdict is v for o in outcomes) for v in Verdict}
    console.print(
        f"{len(outcomes)} checks: "
        + ", ".join(f"{n} {v.value}" for v, n in counts.items() if n)
        + f"; total {meta['wall_time_s']:.0f} s wall, {meta['cpu_time_s']:.0f} s CPU"
        + (f"; report: {Path(out) / 'report.md'}" if out is not None else "; --out DIR writes the report")
    )


def print_mutants(outcomes: list[CheckOutcome], console: Console) -> None:
    """One line per mutant run: its verdict (anything but reproduced shows the check can fail)."""
    t = Table(title="mutants: wrong methods the checks must not call reproduced", box=None, pad_edge=False)
    for col in ("id", "mutant", "verdict", "primary estimate [95% CI]", "what it changes"):
        t.add_column(col, overflow="ellipsis", no_wrap=col != "what it changes")
    for o in outcomes:
        assert o.mutant is not None
        row = primary_row(outcome_json(o))
        style = "red" if o.verdict is Verdict.REPRODUCED else ""
        t.add_row(
            o.check.id,
            escape(o.mutant),
            _verdict(o.verdict),
            escape(interval_text(row) if row else "-"),
            escape(o.check.mutant(o.mutant).description),
            style=style,
        )
    console.print(t)


def print_stability(records: list[dict[str, Any]], console: Console) -> None:
    t = Table(title="stability: each check rerun at twice its seeds")
    for col in ("id", "seeds", "verdict", "verdict at 2x", "changed outcomes"):
        t.add_column(col, overflow="fold")
    for r in records:
        flips = "; ".join(f"{f['criterion']}: {f['at_n']} -> {f['at_2n']}" for f in r["criterion_flips"]) or "none"
        t.add_row(
            r["id"],
            str(r["seeds"]),
            r["verdict"],
            r["verdict_2x"],
            escape(flips),
            style="red" if r["verdict_flipped"] else "",
        )
    console.print(t)
