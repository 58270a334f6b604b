"""What the real-model results file generates: each method page's "On a real model" section with its figure, the
transfer table of ``docs/validation.md``, and the README's "real model" cell.

Everything here reads ``docs/paper_checks/real_results.json`` (and the toy checks' stored
``results.json``); nothing is written by hand. Generated text sits between markers
(``<!-- REAL MODEL -->`` ... ``<!-- END REAL MODEL -->`` in a method page, ``<!-- TRANSFER TABLE -->`` ...
``<!-- END TRANSFER TABLE -->`` in ``docs/validation.md``), appended when a page has none yet; the rest
of each page is kept byte for byte.

The **standardised effect** of a primary endpoint is $(\\bar d - \\mathrm{margin}) / s_d$ over its per-seed
differences ($\\pm\\infty$ when every seed gives the same difference, NaN without two values). The
transfer table gives, per paper, the toy and real verdicts, whether the two effects have the same
sign, the standardised effects and, where the verdicts differ, what the disagreement says about the
toy (from the gate's numbers); under it, Spearman's rank correlation of the standardised effects over
the papers that have both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posttrain.errors import DomainError
from posttrain.paper_checks.report import fmt

__all__ = [
    "REAL_COLUMN", "REAL_RESULTS", "lesson", "merge_results", "method_section", "real_model_cell", "runs_cpu_h",
    "standardised_effect", "transfer_rows", "transfer_table", "update_docs", "write_figure",
]  # fmt: skip

REAL_RESULTS = Path("docs") / "paper_checks" / "real_results.json"
"""Where the results of the real-model tier are stored (relative to the repository root)."""
REAL_COLUMN = "real model"
"""The README method table's column this tier fills (`real_model_cell`)."""
_PAGE = ("<!-- REAL MODEL -->", "<!-- END REAL MODEL -->")
_TABLE = ("<!-- TRANSFER TABLE -->", "<!-- END TRANSFER TABLE -->")


def _primary(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    rows = [c for c in entry.get("comparisons", []) if c.get("role") == "primary"]
    return rows[0] if rows else None


def standardised_effect(row: Mapping[str, Any] | None) -> float:
    """``(mean - margin) / sd`` of a comparison row's differences (module docstring)."""
    if not row:
        return math.nan
    d = np.asarray([x for x in row.get("differences", []) if x is not None and math.isfinite(x)], dtype=np.float64)
    if d.size < 2:
        return math.nan
    gap, sd = float(d.mean()) - float(row.get("margin") or 0.0), float(d.std(ddof=1))
    if sd > 0:
        return gap / sd
    return math.copysign(math.inf, gap) if gap != 0 else 0.0


def lesson(entry: Mapping[str, Any], toy_verdict: str | None) -> str:
    """What a disagreement between the toy and the real verdict teaches about the toy ("" when they agree)."""
    real = entry.get("verdict")
    if real == toy_verdict or toy_verdict is None:
        return ""
    if real == "regime not reached":
        misses = [g for g in entry.get("gate", []) if g["inside"] is False]
        parts = [f"{g['name']} is {fmt(g['value'])} on SmolLM2, the toy tested {fmt(g['toy']['lo'])}-{fmt(g['toy']['hi'])}"
                 for g in misses]  # fmt: skip
        return "the toy's regime is not the real model's: " + "; ".join(parts)
    if real == "not run":
        done = "its arms not trained"
        if "runs_planned" in entry:
            done = f"{entry['runs_cached']} of {entry['runs_planned']} planned runs finished"
        return f"nothing to learn yet: the real model has not been judged ({done})"
    if real in ("blocked", "out of scope", "error"):
        return f"not tested on the real model ({entry.get('reason') or entry.get('error') or real})"
    if real == "inconclusive":
        p = _primary(entry) or {}
        return (f"the real effect is too small or too noisy for {entry.get('seeds_run', 0)} seeds "
                f"(share clearing {fmt(p.get('estimate'))}, detectable {fmt(p.get('mde'))} more): the toy's effect "
                "size is not confirmed at this scale, nor ruled out")  # fmt: skip
    return (
        f"with the mediators in the toy's range the real verdict is {real}: the mechanism the toy encodes is "
        "not what decides on a pretrained model"
    )


def transfer_rows(real: Mapping[str, Any], toy: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per real experiment: toy and real verdicts and standardised effects, sign agreement, lesson."""
    toys = {c["id"]: c for c in toy.get("checks", [])}
    rows = []
    for e in real.get("experiments", []):
        toy_ids = [t["id"] for t in e.get("card", {}).get("toy", [])] or [e["id"]]
        t = toys.get(toy_ids[0], {})
        toy_p = next((c for c in t.get("comparisons", []) if c.get("role") == "primary"), None)
        te, re_ = standardised_effect(toy_p), standardised_effect(_primary(e))
        same = None if math.isnan(te) or math.isnan(re_) or 0.0 in (te, re_) else bool(np.sign(te) == np.sign(re_))
        rows.append({"id": e["id"], "toy_id": toy_ids[0], "title": e.get("title", ""), "toy_verdict": t.get("verdict"),
                     "real_verdict": e.get("verdict"), "toy_effect": te, "real_effect": re_, "same_sign": same,
                     "lesson": lesson(e, t.get("verdict"))})  # fmt: skip
    return rows


def _rank_correlation(rows: list[dict[str, Any]]) -> tuple[float, int]:
    from scipy import stats

    pairs = [(r["toy_effect"], r["real_effect"]) for r in rows
             if not (math.isnan(r["toy_effect"]) or math.isnan(r["real_effect"]))]  # fmt: skip
    if len(pairs) < 3:
        return math.nan, len(pairs)
    a, b = zip(*pairs, strict=True)
    rho = stats.spearmanr(stats.rankdata(a), stats.rankdata(b)).statistic
    return float(rho), len(pairs)


def _parts_line(real: Mapping[str, Any]) -> list[str]:
    """For results merged from a suite run in parts (`merge_results`): where each separately run verdict comes from."""
    own = [e for e in real.get("experiments", []) if e.get("run")]
    if not own:
        return []
    runs = "; ".join(f"{e['id']}: {_provenance(e, e['run'], short=True)}" for e in own)
    return [f"Merged from a suite run in parts; measured in their own runs: {runs}.", ""]


_INSIDE = {True: "yes", False: "**no**", None: "not measured"}
"""A gate row's ``inside`` on a page: a run mediator of untrained arms is *not measured* (`gate_rows`)."""


def _gate_value(row: Mapping[str, Any]) -> str:
    """A gate row's value on a page: ``-`` for a mediator not measured yet."""
    return "-" if row["inside"] is None else fmt(row["value"])


def runs_cpu_h(entry: Mapping[str, Any]) -> float:
    """CPU hours of the runs an entry read (training and held-out evaluation, from their records; NaN without)."""
    cost = entry.get("cost") or {}
    return sum(c.get("train_cpu_s", 0.0) + c.get("eval_cpu_s", 0.0) for c in cost.values()) / 3600 if cost else math.nan


def _provenance(entry: Mapping[str, Any], run: Mapping[str, Any], short: bool = False) -> str:
    """Where an entry was judged and what it cost: the process's wall and CPU time when it trained its runs; the
    runs' own CPU (`runs_cpu_h`) when it judged runs finished before (``--cached-only``: the process only reads)."""
    where = (f"commit {str(run.get('commit', '?'))[:10 if short else 7]}"
             + ("" if short else f", code {run.get('code_digest', '?')}") + f", {run.get('date', '?')}")  # fmt: skip
    runs = runs_cpu_h(entry)
    spent = f"the runs it read: {fmt(runs)} CPU h of training and evaluation (their records)"
    if "cached runs" in str(run.get("mode", "")):
        return f"{'judged' if short else 'Judged'} from finished runs ({where}); {spent}"
    own = f"{fmt(run.get('wall_s', math.nan) / 3600)} h wall, {fmt(run.get('cpu_s', math.nan) / 3600)} CPU h"
    return f"{'' if short else 'Measured in its own run: '}{where}, {own}" + ("" if math.isnan(runs) else f"; {spent}")


def transfer_table(real: Mapping[str, Any], toy: Mapping[str, Any]) -> str:
    """The markdown transfer table (module docstring)."""
    rows = transfer_rows(real, toy)
    meta = real.get("run", {})
    out = [f"## Transfer: toy verdicts against SmolLM2-135M-Instruct ({meta.get('profile', '?')} profile)", "",
           f"Generated from `{REAL_RESULTS.as_posix()}` ({meta.get('date', '?')}, commit {str(meta.get('commit'))[:10]}, "
           f"{fmt(meta.get('wall_s'))} s wall, {fmt(meta.get('cpu_s'))} s CPU) and the toy checks' `results.json`.", "",
           *_parts_line(real),
           "| paper | toy check | toy verdict | real verdict | same sign | std. effect toy | std. effect real | what it teaches |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        same = "-" if r["same_sign"] is None else ("yes" if r["same_sign"] else "**no**")
        out.append(f"| {r['id']} {r['title']} | {r['toy_id']} | {r['toy_verdict'] or '-'} | {r['real_verdict']} | {same} "
                   f"| {fmt(r['toy_effect'])} | {fmt(r['real_effect'])} | {r['lesson'] or '-'} |".replace("\n", " "))  # fmt: skip
    rho, n = _rank_correlation(rows)
    agree = sum(1 for r in rows if r["same_sign"])
    known = sum(1 for r in rows if r["same_sign"] is not None)
    out += ["", f"Sign agreement: {agree} of {known} papers with both effects. Spearman rank correlation of the "
            f"standardised effects: {fmt(rho)} over {n} papers{' (a correlation needs 3)' if n < 3 else ''}."]  # fmt: skip
    return "\n".join(out) + "\n"


def real_model_cell(ids: list[str], results: Mapping[str, Any] | None) -> str:
    """The README "real model" cell of a row whose check column names ``ids`` (``-`` without a record).

    Toy ids with a letter (``11b``, ``20b``) map to the experiment of their paper (``11``, ``20``).
    """
    if not results:
        return "-"
    by_id = {e["id"]: e for e in results.get("experiments", [])}
    parts = []
    for x in dict.fromkeys(i[:2] for i in ids):
        e = by_id.get(x)
        if e is None:
            continue
        p = _primary(e)
        numbers = (
            f" ({e.get('seeds_run', 0)} seeds, share {fmt(p['estimate'])} [{fmt(p['lower'])}, {fmt(p['upper'])}])"
            if p
            else ""
        )
        parts.append(f"{x}: {e['verdict']}{numbers}" if len(ids) > 1 else f"{e['verdict']}{numbers}")
    return ("; ".join(parts) or "-").replace("|", "\\|")


def method_section(entry: Mapping[str, Any], figure: str | None = None) -> str:
    """A method page's "On a real model" section for one experiment."""
    card = entry.get("card", {})
    toy = card.get("toy", [{}])[0]
    lines = [f"## On a real model: {entry['title']}", "",
             f"**Verdict: {entry['verdict']}** (SmolLM2-135M-Instruct, {entry.get('seeds_run', 0)} of "
             f"{entry.get('seeds_planned')} planned seeds; `posttrain real-check {entry['id']}`)."]  # fmt: skip
    if entry.get("run"):
        lines += ["", f"{_provenance(entry, entry['run'])}."]
    if entry.get("reason"):
        lines += ["", f"Why: {entry['reason']}"]
    if toy.get("abstract"):
        lines += ["", f'Claim (the abstract): "{toy["abstract"]}"']
    prim = toy.get("primary") or {}
    lines += ["", "Transfer card (written before the runs):", "",
              f"- toy primary: {prim.get('name', '-')} (toy {toy.get('id')}: {toy.get('verdict', '-')});",
              f"- on the real model: {card.get('effect', '-')};"]  # fmt: skip
    for k, v in card.get("regime", {}).items():
        lines.append(f"- {k}: {v};")
    gate = entry.get("gate") or []
    if gate:
        lines += [
            "",
            "| mediator | on SmolLM2 | toy range | inside | where the range comes from |",
            "| --- | --- | --- | --- | --- |",
        ]
        for g in gate:
            lines.append(f"| {g['name']} | {_gate_value(g)} | [{fmt(g['toy']['lo'])}, {fmt(g['toy']['hi'])}] | "
                         f"{_INSIDE[g['inside']]} | {g['toy']['origin']} |")  # fmt: skip
    comps = [c for c in entry.get("comparisons", []) if c.get("role") != "context" or "betting" in c.get("name", "")]
    if comps:
        lines += [
            "",
            "| comparison | role | seeds clearing | bound | outcome | mean difference |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for c in comps:
            lines.append(f"| {c['name']} | {c['role']} | {c.get('count')}/{c.get('n')} | [{fmt(c.get('lower'))}, "
                         f"{fmt(c.get('upper'))}] | {c.get('outcome')} | {fmt(c.get('mean'))} |")  # fmt: skip
    metrics = [m for m in entry.get("metrics", []) if m.get("n")]
    if metrics:
        lines += ["", "| measured per seed | mean | sd | seeds |", "| --- | --- | --- | --- |"]
        lines += [f"| {m['name']} | {fmt(m.get('mean'))} | {fmt(m.get('sd'))} | {m['n']} |" for m in metrics]
    if entry.get("ungated_verdict") and entry["verdict"] == "regime not reached":
        lines += ["", f"Verdict the gate withholds: {entry['ungated_verdict']}."]
    if figure:
        lines += ["", f"![{entry['id']} on a real model]({figure})"]
    return "\n".join(lines) + "\n"


def write_figure(entry: Mapping[str, Any], path: Path) -> bool:
    """Per-seed differences of each judged comparison (dots) beside its margin; False when there is nothing to draw."""
    comps = [c for c in entry.get("comparisons", []) if c.get("role") != "context" and c.get("differences")]
    if not comps:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 0.6 + 0.5 * len(comps)))
    for i, c in enumerate(comps):
        d = [x for x in c["differences"] if x is not None and math.isfinite(x)]
        ax.scatter(d, [i] * len(d), color="C0" if c["role"] == "primary" else "C7", s=18, zorder=3)
        ax.plot([c["margin"]] * 2, [i - 0.3, i + 0.3], color="C3", lw=1)
    ax.set_yticks(range(len(comps)), [c["name"] for c in comps], fontsize=8)
    ax.set_xlabel("per-seed difference (red: margin)")
    ax.set_title(f"{entry['id']}: {entry['verdict']}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


_UNJUDGED = frozenset({"not run", "error"})


def merge_results(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One results file from a suite run in parts: a later part's judged entry replaces an earlier entry of that id.

    An entry that came from a part other than the first carries that part's ``run`` record (commit, code
    digest, date, cost), so a page names where its verdict was measured; entries *not run* or in *error*
    never replace a judged entry (a later one replaces an earlier unjudged one: its run counts are newer).

    Raises:
        DomainError: ``parts`` is empty, mixes profiles (a smoke result beside a full one) or holds a pilot.
    """
    if not parts:
        raise DomainError("parts: at least one results file")
    profiles = {str(p.get("run", {}).get("profile")) for p in parts}
    if len(profiles) != 1 or any("pilot" in str(p.get("mode")) for p in parts):
        raise DomainError(f"parts: one profile in all and no pilot, got {sorted(str(p.get('mode')) for p in parts)}")
    first = parts[0]
    entries = {e["id"]: dict(e) for e in first.get("experiments", [])}
    for part in parts[1:]:
        for e in part.get("experiments", []):
            if e["verdict"] not in _UNJUDGED:
                entries[e["id"]] = {**e, "run": {**part.get("run", {}), "mode": part.get("mode")}}
            elif e["id"] not in entries or entries[e["id"]]["verdict"] in _UNJUDGED:
                entries[e["id"]] = dict(e)
    mode = first.get("mode") if len(parts) == 1 else f"{profiles.pop()} (in parts)"
    return {**first, "mode": mode, "experiments": [entries[k] for k in sorted(entries)]}


def _replace(text: str, markers: tuple[str, str], body: str) -> str:
    begin, end = markers
    block = f"{begin}\n{body}{end}\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + block + rest.split(end, 1)[1].lstrip("\n")
    return text.rstrip("\n") + "\n\n" + block


def update_docs(
    results: Mapping[str, Any], root: Path, toy: Mapping[str, Any] | None = None, *, pages: bool = True
) -> list[Path]:
    """Rewrite the generated parts of the docs under ``root`` (the repository) from ``results``; returns the files.

    The method pages' sections, the transfer table of ``docs/validation.md`` and the README method table's
    "real model" cells (its other generated cells from the stored toy results, unchanged);
    ``pages=False`` rewrites only the transfer table.
    """
    from posttrain.papers import paper

    toy = toy if toy is not None else json.loads((root / "docs" / "paper_checks" / "results.json").read_text())
    written = []
    for e in results.get("experiments", []) if pages else []:
        page = root / "docs" / paper(e["id"]).page
        if not page.is_file() or not paper(e["id"]).page.startswith("methods/"):
            continue
        fig = root / "docs" / "paper_checks" / f"real_{e['id']}.png"
        drawn = write_figure(e, fig)
        rel = "../paper_checks/" + fig.name if drawn else None
        page.write_text(_replace(page.read_text(), _PAGE, method_section(e, rel)))
        written.append(page)
    validation = root / "docs" / "validation.md"
    validation.write_text(_replace(validation.read_text(), _TABLE, transfer_table(results, toy)))
    written.append(validation)
    readme = root / "README.md"
    if pages and readme.is_file():
        from posttrain.paper_checks.readme_table import STORED_MUTANTS, render_table

        mutants = root / STORED_MUTANTS
        runs = json.loads(mutants.read_text()) if mutants.is_file() else None
        readme.write_text(render_table(readme.read_text(), dict(toy), runs, dict(results))[0])
        written.append(readme)
    return written


if __name__ == "__main__":  # pragma: no cover - a thin command-line wrapper
    import sys

    args = [a for a in sys.argv[1:] if a != "--table-only"]
    if not args:
        sys.exit("usage: python -m posttrain.real_checks.outputs REAL_RESULTS.json [MORE.json ...] [--table-only]\n"
                 "  several files: a suite run in parts, merged (later judged entries win) and stored in the docs")  # fmt: skip
    repo = Path(__file__).resolve().parents[2]
    merged = merge_results([json.loads(Path(a).read_text()) for a in args])
    if len(args) > 1:
        stored = repo / REAL_RESULTS
        stored.write_text(json.dumps(merged, indent=1, default=float) + "\n")
        print(f"wrote {stored.relative_to(repo)}")
    for written in update_docs(merged, repo, pages="--table-only" not in sys.argv):
        print(f"rewrote {written.relative_to(repo)}")
