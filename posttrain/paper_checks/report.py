"""What a run of the paper checks records and how one row reads: JSON records and their text.

`summarise` turns a `Result` into JSON-ready rows (per metric: mean and spread; per comparison:
its declaration, bounds, outcome and minimum detectable effect). The text helpers (`fmt`,
`rule_text`, `interval_text`, `status_text`, `primary_text`) render one row, for the terminal
(`posttrain.paper_checks.tables`), the markdown report and the docs pages
(`posttrain.paper_checks.markdown`) and the README table. `results_payload` / `mutants_payload`
are the ``results.json`` / ``mutants.json`` files.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from posttrain.paper_checks.model import ALPHA, Criterion, Result, Role
from posttrain.paper_checks.stats import POWER, compare

if TYPE_CHECKING:
    from posttrain.paper_checks.runner import CheckOutcome

__all__ = [
    "COMPARISON_COLUMNS",
    "comparison_cells",
    "fmt",
    "interval_text",
    "mutants_payload",
    "outcome_json",
    "primary_row",
    "primary_text",
    "results_payload",
    "rule_text",
    "run_metadata",
    "secondary_count",
    "status_text",
    "summarise",
]


def _metric_row(name: str, per_seed: tuple[float, ...], paper_value: float | None, note: str) -> dict[str, Any]:
    v = np.asarray(per_seed, dtype=np.float64)
    v = v[np.isfinite(v)]
    mean = float(v.mean()) if v.size else math.nan
    sd = float(v.std(ddof=1)) if v.size > 1 else math.nan
    return {
        "name": name,
        "per_seed": list(per_seed),
        "mean": mean,
        "sd": sd,
        "n": int(v.size),
        "paper_value": paper_value,
        "note": note,
    }


def summarise(result: Result) -> dict[str, Any]:
    """JSON-ready rows of a result: per metric its mean and spread, per comparison its statistics.

    Raises:
        DomainError: a malformed judged criterion (see `compare`).
    """
    metrics = [_metric_row(m.name, m.per_seed, m.paper_value, m.note) for m in result.metrics]
    comparisons = []
    for c in result.comparisons:
        st = compare(c)
        comparisons.append(
            {
                "name": c.name,
                "role": c.role.value,
                "kind": c.kind.value,
                "differences": list(c.differences),
                "margin": c.margin,
                "margin_reason": c.margin_reason,
                "bounds": list(c.bounds) if c.bounds is not None else None,
                "assumption": c.assumption,
                "share": c.share,
                "estimate": st.estimate,
                "lower": st.lower,
                "upper": st.upper,
                "threshold": st.threshold,
                "mean": st.mean,
                "n": st.n,
                "count": st.count,
                "outcome": st.outcome.value,
                "method": st.method,
                "mde": None if math.isnan(st.mde) else st.mde,
                "paper_value": c.paper_value,
                "headline": c.headline,
            }
        )
    return {"metrics": metrics, "comparisons": comparisons, "notes": result.notes, "alpha": ALPHA}


# ---------------------------------------------------------------------------------------------- text of one row


def fmt(x: Any, digits: int = 4) -> str:
    """A number in ``digits`` significant digits; ``-`` for none, ``inf`` / ``-inf`` / ``nan`` for the others."""
    if x is None:
        return "-"
    v = float(x)
    return f"{v:.{digits}g}" if math.isfinite(v) else str(v)


def _bound_text(m: float) -> str:
    """``> m``, or ``>= x`` when the margin is the float just below ``x`` (a non-strict claim)."""
    snapped = 0.0 if abs(m) < 1e-300 else float(f"{m:.12g}")
    return f">= {fmt(snapped)}" if snapped != m and math.nextafter(snapped, -math.inf) == m else f"> {fmt(m)}"


def rule_text(row: dict[str, Any]) -> str:
    """The claim a row judges: ``mean > m``, ``P(d > m) > s`` or ``exact > m``, with the mean's range."""
    bound = _bound_text(float(row["margin"]))
    if row["kind"] == Criterion.QUANTILE.value:
        return f"P(d {bound}) > {fmt(row['share'], 3)}"
    if row["kind"] == Criterion.EXACT.value:
        return f"exact {bound}"
    rng = row.get("bounds")
    return f"mean {bound} on [{fmt(rng[0])}, {fmt(rng[1])}]" if rng else f"median {bound} (unbounded)"


def interval_text(row: dict[str, Any]) -> str:
    """The estimate and its 95% interval (two one-sided bounds): ``mean [lo, hi]``, ``k/n = share [lo, hi]``."""
    if row["kind"] == Criterion.EXACT.value or row.get("n", 0) <= 1:
        return fmt(row["estimate"])
    head = f"{row['count']}/{row['n']} = {fmt(row['estimate'], 3)}" if row["kind"] == Criterion.QUANTILE.value else ""
    return f"{head or fmt(row['estimate'])} [{fmt(row['lower'])}, {fmt(row['upper'])}]"


_PRIMARY_WORD = {"holds": "reproduced", "excluded": "contradicted", "undecided": "inconclusive"}


def status_text(row: dict[str, Any]) -> str:
    """``reproduced`` / ``contradicted`` / ``inconclusive`` for the primary; holds / excluded / undecided otherwise."""
    if row["role"] == Role.PRIMARY.value:
        return _PRIMARY_WORD[row["outcome"]]
    return row["outcome"] if row["role"] == Role.SECONDARY.value else f"({row['outcome']})"


def primary_row(check: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in check.get("comparisons", []) if c["role"] == Role.PRIMARY.value), None)


def primary_text(check: dict[str, Any]) -> str:
    """The primary endpoint in one line: its name, estimate and interval against the threshold, the MDE if undecided."""
    row = primary_row(check)
    if row is None:
        return "-"
    text = f"{row['name']}: {interval_text(row)}, needs {rule_text(row)}"
    mde = row.get("mde")
    if row["outcome"] == "undecided" and mde is not None and not math.isnan(mde):
        over = "the share" if row["kind"] == Criterion.QUANTILE.value else "the margin"
        shown = "no effect" if math.isinf(mde) else f"{fmt(mde, 3)} over {over}"
        text += f"; detectable at {row['n']} seeds ({POWER:.0%} power): {shown}"
    return text


def secondary_count(check: dict[str, Any]) -> str:
    """``k/n`` secondary criteria holding (``-`` when none)."""
    rows = [c for c in check.get("comparisons", []) if c["role"] == Role.SECONDARY.value]
    return f"{sum(c['outcome'] == 'holds' for c in rows)}/{len(rows)}" if rows else "-"


COMPARISON_COLUMNS = ("role", "Δ criterion", "rule", "estimate [95% CI]", "method", "paper", "outcome")


def comparison_cells(row: dict[str, Any]) -> list[str]:
    return [row["role"], row["name"], rule_text(row), interval_text(row), row["method"], fmt(row["paper_value"]),
            status_text(row)]  # fmt: skip


# ---------------------------------------------------------------------------------------------- JSON files


def outcome_json(o: CheckOutcome) -> dict[str, Any]:
    cfg = o.config
    cfg_json = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type) else None
    return {
        "id": o.check.id,
        "paper": o.check.paper,
        "claim": o.check.claim,
        "abstract": o.check.abstract,
        "reported_claim": o.check.reported_claim,
        "mutant": o.mutant,
        "verdict": o.verdict.value,
        "error": o.error,
        "wall_time_s": o.wall_time_s,
        "cpu_time_s": o.cpu_time_s,
        "seeds": getattr(cfg, "seeds", None),
        "config": cfg_json,
        "metrics": o.summary.get("metrics", []),
        "comparisons": o.summary.get("comparisons", []),
        "notes": o.summary.get("notes", ""),
        "traceback": o.traceback,
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
    import torch

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


def results_payload(outcomes: list[CheckOutcome], *, smoke: bool, meta: dict[str, Any]) -> dict[str, Any]:
    """``results.json``: the run's metadata and one record per check."""
    return {"mode": "smoke" if smoke else "full", "run": meta, "checks": [outcome_json(o) for o in outcomes]}


def mutants_payload(outcomes: list[CheckOutcome], *, smoke: bool, meta: dict[str, Any]) -> dict[str, Any]:
    """``mutants.json``: one record per (check, mutant) run, with the mutant's description and primary row."""
    rows = []
    for o in outcomes:
        record = outcome_json(o)
        mutant = o.check.mutant(o.mutant) if o.mutant else None
        rows.append(
            {
                "id": o.check.id,
                "mutant": o.mutant,
                "description": mutant.description if mutant else "",
                "verdict": o.verdict.value,
                "error": o.error,
                "seeds": record["seeds"],
                "primary": primary_row(record),
                "wall_time_s": o.wall_time_s,
                "cpu_time_s": o.cpu_time_s,
            }
        )
    return {"mode": "smoke" if smoke else "full", "run": meta, "mutants": rows}
