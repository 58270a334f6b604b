"""The README method table's status column, generated from a full run's ``results.json``.

The table sits between ``<!-- METHOD TABLE -->`` and ``<!-- END METHOD TABLE -->``. Its other
columns (paper, estimators, check ids) are hand-written and kept byte for byte; only the last
column of a row whose ``check`` column names check ids is rewritten: per check the verdict, how many
asserted criteria pass, the failing asserted criteria with their numbers, and the headline
comparisons that are only reported. `update_readme` also stores the results next to the
README (``docs/paper_checks/results.json``) so a test can show the table matches them.

Usage: ``posttrain check --out reports --update-readme`` (a full run), or
``python -m posttrain.paper_checks.readme_table reports/results.json README.md``.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from posttrain.errors import DomainError

__all__ = ["STORED_RESULTS", "check_status", "render_table", "update_readme"]

BEGIN, END = "<!-- METHOD TABLE -->", "<!-- END METHOD TABLE -->"
STORED_RESULTS = Path("docs") / "paper_checks" / "results.json"
"""Where `update_readme` keeps the results the table was generated from (relative to the README)."""
_ID = re.compile(r"^\d{2}[a-z]?$")


def _num(x: Any) -> str:
    return "nan" if x is None or x != x else f"{x:+.3g}"


def _row_numbers(c: dict[str, Any]) -> str:
    if c.get("kind") == "fraction":
        return f"{c['count']}/{c['n']} seeds > {c['margin']:.3g}, needs {c['required']}"
    if c.get("kind") == "exact":
        return f"{_num(c['mean'])} (exact), needs > {c['margin']:.3g}"
    return f"mean {_num(c['mean'])} [{_num(c['ci_low'])}, {_num(c['ci_high'])}], needs > {c['margin']:.3g}"


def check_status(check: dict[str, Any], *, max_failing: int = 2) -> str:
    """One check's status text: verdict, asserted criteria passing, failing ones, reported headline rows."""
    verdict = check["verdict"]
    if verdict == "error":
        return "**error**"
    asserted = [c for c in check["comparisons"] if c["asserted"]]
    passed = sum(c["passed"] for c in asserted)
    word = verdict if verdict == "reproduced" else f"**{verdict}**"
    parts = [f"{word} ({passed}/{len(asserted)} asserted pass)"]
    failing = [c for c in asserted if not c["passed"]]
    for c in failing[:max_failing]:
        parts.append(f"fails: {c['name']}: {_row_numbers(c)}")
    if len(failing) > max_failing:
        parts.append(f"and {len(failing) - max_failing} more failing")
    for c in check["comparisons"]:
        if c.get("headline") and not c["asserted"]:
            word = "would pass" if c["passed"] else "would fail"
            parts.append(f"reported only: {c['name']}: {_row_numbers(c)} ({word})")
    return "; ".join(parts).replace("|", "\\|")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def render_table(readme: str, results: dict[str, Any]) -> tuple[str, int]:
    """``readme`` with the status column rewritten from ``results``; returns (text, cells changed).

    Rows whose ``check`` column names ids missing from ``results`` are left as they are.

    Raises:
        DomainError: the markers are missing or the table has no ``check`` and ``status`` columns.
    """
    if BEGIN not in readme or END not in readme:
        raise DomainError(f"readme: expected the markers {BEGIN!r} and {END!r}")
    head, rest = readme.split(BEGIN, 1)
    body, tail = rest.split(END, 1)
    lines = body.split("\n")
    header = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if header is None:
        raise DomainError("readme: no table between the method-table markers")
    cols = _cells(lines[header])
    if "check" not in cols or cols[-1] != "status":
        raise DomainError(f"readme: expected 'check' and a last 'status' column, got {cols}")
    at = cols.index("check")
    by_id = {c["id"]: c for c in results["checks"]}
    changed = 0
    for i in range(header + 2, len(lines)):
        line = lines[i]
        if not line.startswith("|"):
            continue
        cells = _cells(line)
        ids = [x.strip() for x in cells[at].split(",")]
        if not ids or not all(_ID.match(x) for x in ids) or not all(x in by_id for x in ids):
            continue
        texts = [check_status(by_id[x]) for x in ids]
        status = texts[0] if len(ids) == 1 else "; ".join(f"{x}: {t}" for x, t in zip(ids, texts, strict=True))
        prefix = line[: line.rstrip().rstrip("|").rstrip().rfind(" | ")]
        new = f"{prefix} | {status} |"
        if new != line:
            lines[i], changed = new, changed + 1
    return head + BEGIN + "\n".join(lines) + END + tail, changed


def update_readme(results_path: Path, readme_path: Path) -> int:
    """Rewrite ``readme_path``'s status column from ``results_path`` (a full run); store the results beside it."""
    results = json.loads(Path(results_path).read_text())
    if results.get("mode") != "full":
        raise DomainError(f"results_path: expected a full run, got mode {results.get('mode')!r}")
    text, changed = render_table(Path(readme_path).read_text(), results)
    Path(readme_path).write_text(text)
    stored = Path(readme_path).parent / STORED_RESULTS
    stored.parent.mkdir(parents=True, exist_ok=True)
    if Path(results_path).resolve() != stored.resolve():
        shutil.copyfile(results_path, stored)
    return changed


if __name__ == "__main__":  # pragma: no cover - a thin command-line wrapper
    if len(sys.argv) != 3:
        sys.exit("usage: python -m posttrain.paper_checks.readme_table RESULTS.json README.md")
    print(f"{update_readme(Path(sys.argv[1]), Path(sys.argv[2]))} status cells rewritten")
