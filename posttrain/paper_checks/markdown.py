"""The markdown report (``report.md``) and the check sections of the documentation pages.

`check_markdown` renders one check's section from its ``results.json`` record: the claim, the
abstract sentence its primary endpoint tests, the three-way verdict with the primary's numbers (and
the minimum detectable effect when inconclusive), the metric and comparison tables, the margins and
assumptions, and the mutants with their verdicts. ``report.md`` (`markdown_report`) and the docs
(``docs/_hooks.py``) both use it, so they read the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from posttrain.paper_checks.model import ALPHA, Role
from posttrain.paper_checks.report import (
    COMPARISON_COLUMNS,
    comparison_cells,
    fmt,
    interval_text,
    primary_text,
    rule_text,
    secondary_count,
)

__all__ = ["check_markdown", "markdown_report"]


def _md(text: Any) -> str:
    """One table cell: a single line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def check_markdown(
    check: dict[str, Any], *, image: str | None = None, mutants: Sequence[dict[str, Any]] = (), heading: str = "##"
) -> list[str]:
    """One check's section: claim, primary endpoint and its abstract sentence, verdict, tables, margins, mutants."""
    cid = check["id"]
    out = [f"{heading} {cid}: {_md(check['paper'])}", ""] if heading else []
    out += [f"Claim: {_md(check['claim'])}", ""]
    if check.get("abstract"):
        out += [f'Primary endpoint, testing the abstract\'s sentence: "{_md(check["abstract"])}"', ""]
    if check.get("reported_claim"):
        out += [f"Reported only: {_md(check['reported_claim'])}", ""]
    out += [f"**Verdict: {check['verdict']}** ({check.get('seeds')} seeds). Primary: {_md(primary_text(check))}. "
            f"Secondary criteria holding: {secondary_count(check)}.", ""]  # fmt: skip
    if check.get("error"):
        return [*out, "```text", (check.get("traceback") or check["error"]).strip(), "```", ""]
    if image:
        out += [f"![check {cid}: metrics, per-seed differences and curves]({image})", ""]
    if check.get("metrics"):
        out += ["| quantity | mean (sd) over seeds | paper |", "| --- | --- | --- |"]
        out += [f"| {_md(m['name'])} | {fmt(m['mean'])}" + (f" ({fmt(m['sd'], 3)})" if m["n"] > 1 else "")
                + f" | {fmt(m['paper_value'])} |" for m in check["metrics"]]  # fmt: skip
        out.append("")
    rows = sorted(check.get("comparisons", []), key=lambda c: list(Role).index(Role(c["role"])))
    if rows:
        out += ["| " + " | ".join(COMPARISON_COLUMNS) + " |", "|" + " --- |" * len(COMPARISON_COLUMNS)]
        out += ["| " + " | ".join(_md(x) for x in comparison_cells(c)) + " |" for c in rows]
        out.append("")
    reasons = [f"- {_md(c['name'])}: {rule_text(c)}: {_md(c['margin_reason'])}"
               + (f" (assumption: {_md(c['assumption'])})" if c.get("assumption") else "")
               for c in rows if c["margin_reason"] and c["role"] != Role.CONTEXT.value]  # fmt: skip
    if reasons:
        out += ["Margins of the primary and secondary criteria:", "", *reasons, ""]
    if mutants:
        out += ["Mutants (wrong methods the check must not call reproduced):", "",
                "| mutant | what it changes | verdict | primary |", "| --- | --- | --- | --- |"]  # fmt: skip
        out += [f"| {_md(m['mutant'])} | {_md(m['description'])} | {m['verdict']} | "
                + (_md(f"{interval_text(m['primary'])}") if m.get("primary") else _md(m.get("error") or "-")) + " |"
                for m in mutants]  # fmt: skip
        out.append("")
    if check.get("notes"):
        out += [_md(check["notes"]), ""]
    return out


def markdown_report(payload: dict[str, Any], *, plots: dict[str, str], mutants: Sequence[dict[str, Any]] = ()) -> str:
    """``report.md``: the overview table, then one section per check."""
    meta = payload["run"]
    commit = f"{meta.get('commit') or 'unknown'}{' (uncommitted changes)' if meta.get('dirty') else ''}"
    lines = [
        "# Paper checks", "",
        f"Mode: {payload['mode']}. posttrain {meta['version']}, commit {commit}, torch {meta['torch']}.", "",
        f"Each check's verdict is its primary endpoint's outcome at one-sided level {ALPHA}: *reproduced* when the "
        "lower bound clears the margin, *contradicted* when the upper bound lies at or below it, *inconclusive* "
        "otherwise. Secondary criteria are judged the same way and reported, never deciding.", "",
        "| id | verdict | primary | secondary holding | seeds | time (s) |", "| --- | --- | --- | --- | --- | --- |",
    ]  # fmt: skip
    for c in payload["checks"]:
        lines.append(
            f"| [{c['id']}](#check-{c['id']}) | {c['verdict']} | {_md(primary_text(c))} | "
            f"{secondary_count(c)} | {c['seeds']} | {c['wall_time_s']:.1f} |"
        )
    for c in payload["checks"]:
        own = [m for m in mutants if m["id"] == c["id"]]
        lines += ["", f'<a id="check-{c["id"]}"></a>', *check_markdown(c, image=plots.get(c["id"]), mutants=own)]
    return "\n".join(lines).rstrip() + "\n"
