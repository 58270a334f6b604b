"""The README method table's generated columns, from a full run's ``results.json`` (and ``mutants.json``).

The table sits between ``<!-- METHOD TABLE -->`` and ``<!-- END METHOD TABLE -->``. Its hand-written
columns (paper, estimators, check ids) are kept byte for byte; in a row whose ``check`` column names
check ids, two cells are generated:

- ``can it fail``: each declared mutant (a wrong method) and the verdict the check gave it, from
  ``mutants.json`` (a column inserted before ``status`` when the table has none);
- ``real model``: the real-model tier's verdict of the row's paper on SmolLM2-135M-Instruct with its
  seeds and primary share, from ``docs/paper_checks/real_results.json``
  (`posttrain.real_checks.outputs.real_model_cell`; inserted before ``status`` when the table has none);
- ``status`` (the last column): per check the three-way verdict, the primary endpoint with the
  abstract sentence it tests and its numbers (the minimum detectable effect when inconclusive),
  the secondary criteria holding, and the headline comparisons that are only reported.

`update_readme` also stores the files next to the README (``docs/paper_checks/results.json`` and
``mutants.json``) so a test can show the table matches them; ``posttrain real-check --update-docs``
rewrites the real-model cells from the stored files.

Usage: ``posttrain check --out reports --mutants --update-readme`` (a full run), or
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
from posttrain.paper_checks.report import interval_text, primary_text, secondary_count

__all__ = [
    "FAIL_COLUMN",
    "REAL_COLUMN",
    "STORED_MUTANTS",
    "STORED_RESULTS",
    "check_status",
    "mutant_status",
    "render_table",
    "stored_real",
    "update_readme",
]

BEGIN, END = "<!-- METHOD TABLE -->", "<!-- END METHOD TABLE -->"
STORED_RESULTS = Path("docs") / "paper_checks" / "results.json"
"""Where `update_readme` keeps the results the table was generated from (relative to the README)."""
STORED_MUTANTS = Path("docs") / "paper_checks" / "mutants.json"
"""Where `update_readme` keeps the mutant runs the "can it fail" column was generated from."""
FAIL_COLUMN = "can it fail"
REAL_COLUMN = "real model"
_ID = re.compile(r"^\d{2}[a-z]?$")


def check_status(check: dict[str, Any]) -> str:
    """One check's status: verdict, primary endpoint (abstract sentence, numbers), secondary criteria, headlines."""
    verdict = check["verdict"]
    if verdict == "error":
        return f"**error**: {check.get('error') or ''}".rstrip(": ").replace("|", "\\|")
    word = verdict if verdict == "reproduced" else f"**{verdict}**"
    parts = [word]
    if check.get("abstract"):
        parts.append(f'tests "{check["abstract"]}"')
    parts.append(f"primary {primary_text(check)}")
    parts.append(f"secondary holding {secondary_count(check)}")
    for c in check["comparisons"]:
        if c.get("headline") and c["role"] == "context":
            parts.append(f"reported only: {c['name']}: {interval_text(c)} ({c['outcome']})")
    return "; ".join(parts).replace("|", "\\|")


def mutant_status(check_id: str, mutants: list[dict[str, Any]] | None) -> str:
    """The "can it fail" cell of one check: ``name: verdict`` per mutant run (``-`` without a record)."""
    if mutants is None:
        return "-"
    rows = [m for m in mutants if m["id"] == check_id]
    if not rows:
        return "no mutant declared"
    parts = []
    for m in rows:
        numbers = f" ({interval_text(m['primary'])})" if m.get("primary") else ""
        word = m["verdict"] if m["verdict"] != "reproduced" else "**reproduced**"
        parts.append(f"{m['mutant']}: {word}{numbers}")
    return "; ".join(parts).replace("|", "\\|")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split(" | ")]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _joined(ids: list[str], texts: list[str]) -> str:
    return texts[0] if len(ids) == 1 else "; ".join(f"{x}: {t}" for x, t in zip(ids, texts, strict=True))


def _with_column(lines: list[str], header: int, name: str) -> bool:
    """Insert the column ``name`` before ``status`` (header, rule and ``-`` in each row) unless the table has it."""
    cols = _cells(lines[header])
    if name in cols:
        return False
    lines[header] = _row([*cols[:-1], name, "status"])
    lines[header + 1] = _row(["---"] * (len(cols) + 1))
    for i in range(header + 2, len(lines)):
        if lines[i].startswith("|"):
            cells = _cells(lines[i])
            lines[i] = _row([*cells[:-1], "-", cells[-1]])
    return True


def render_table(
    readme: str, results: dict[str, Any], mutants: dict[str, Any] | None = None, real: dict[str, Any] | None = None
) -> tuple[str, int]:
    """``readme`` with the generated cells rewritten from ``results`` (and ``mutants``, ``real``); returns
    (text, lines changed).

    Rows whose ``check`` column names ids missing from ``results`` are left as they are (a missing
    ``can it fail`` column is inserted, with ``-`` in such rows; so is a missing ``real model`` column when
    ``real``, the real-model tier's results, is given).

    Raises:
        DomainError: the markers are missing or the table has no ``check`` and ``status`` columns.
    """
    from posttrain.real_checks.outputs import real_model_cell

    if BEGIN not in readme or END not in readme:
        raise DomainError(f"readme: expected the markers {BEGIN!r} and {END!r}")
    head, rest = readme.split(BEGIN, 1)
    body, tail = rest.split(END, 1)
    lines = body.split("\n")
    before = list(lines)
    header = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if header is None:
        raise DomainError("readme: no table between the method-table markers")
    cols = _cells(lines[header])
    if "check" not in cols or cols[-1] != "status":
        raise DomainError(f"readme: expected 'check' and a last 'status' column, got {cols}")
    _with_column(lines, header, FAIL_COLUMN)
    if real is not None:
        _with_column(lines, header, REAL_COLUMN)
    cols = _cells(lines[header])
    at, by_id = cols.index("check"), {c["id"]: c for c in results["checks"]}
    fail_at, real_at = cols.index(FAIL_COLUMN), cols.index(REAL_COLUMN) if REAL_COLUMN in cols else None
    runs = None if mutants is None else list(mutants.get("mutants", []))
    for i in range(header + 2, len(lines)):
        if not lines[i].startswith("|"):
            continue
        cells = _cells(lines[i])
        ids = [x.strip() for x in cells[at].split(",")]
        if not (ids and all(_ID.match(x) for x in ids)):
            continue
        if real is not None and real_at is not None:
            cells[real_at] = real_model_cell(ids, real)
        if all(x in by_id for x in ids):
            cells[-1] = _joined(ids, [check_status(by_id[x]) for x in ids])
            if runs is not None:
                cells[fail_at] = _joined(ids, [mutant_status(x, runs) for x in ids])
        lines[i] = _row(cells)
    changed = sum(a != b for a, b in zip(before, lines, strict=True))
    return head + BEGIN + "\n".join(lines) + END + tail, changed


def stored_real(root: Path) -> dict[str, Any] | None:
    """The real-model tier's stored results under the repository ``root`` (None when none is stored)."""
    from posttrain.real_checks.outputs import REAL_RESULTS

    path = Path(root) / REAL_RESULTS
    return json.loads(path.read_text()) if path.is_file() else None


def update_readme(results_path: Path, readme_path: Path) -> int:
    """Rewrite ``readme_path``'s generated cells from ``results_path`` (a full run) and ``mutants.json`` beside it.

    The files are stored next to the README (`STORED_RESULTS`, `STORED_MUTANTS`).
    """
    results = json.loads(Path(results_path).read_text())
    if results.get("mode") != "full":
        raise DomainError(f"results_path: expected a full run, got mode {results.get('mode')!r}")
    mutants_path = Path(results_path).with_name("mutants.json")
    mutants = json.loads(mutants_path.read_text()) if mutants_path.exists() else None
    text, changed = render_table(Path(readme_path).read_text(), results, mutants, stored_real(Path(readme_path).parent))
    Path(readme_path).write_text(text)
    for src, stored in ((Path(results_path), STORED_RESULTS), (mutants_path, STORED_MUTANTS)):
        dst = Path(readme_path).parent / stored
        if src.exists() and src.resolve() != dst.resolve():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    return changed


if __name__ == "__main__":  # pragma: no cover - a thin command-line wrapper
    if len(sys.argv) != 3:
        sys.exit("usage: python -m posttrain.paper_checks.readme_table RESULTS.json README.md")
    print(f"{update_readme(Path(sys.argv[1]), Path(sys.argv[2]))} rows rewritten")
