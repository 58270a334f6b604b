"""Training curves as a PNG in the run directory: what a person looks at first, without TensorBoard.

`write_curves` reads ``metrics.jsonl`` (and ``es_metrics.jsonl``) of a run and draws ``curves.png``: one
panel per quantity that the run logged, against the step: reward (``reward_mean`` with its spread across
groups, ``reward_std``), KL to the reference, entropy, response length, and the held-out scores when the
run evaluated (``eval/greedy_accuracy``, ``eval/pass@1``); an ES run's population reward. A missing or
null value (a step without a KL term, an evaluation not run that step) leaves a gap, not a zero.

The trainer's sinks (`posttrain.llm.train.sinks`) draw it at every checkpoint and at the end, ``posttrain es``
at the end (`draw_curves`: a failure to draw is a warning, never the end of a run). The file is
written under a temporary name and renamed, so a reader never sees a half-written image. matplotlib is an
extra (``[plots]``): without it no image is written and one warning says so.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

__all__ = ["CURVES", "PANELS", "curve_points", "draw_curves", "write_curves"]

CURVES = "curves.png"

PANELS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("metrics.jsonl", "reward (mean, band: ± std)", ("reward_mean",)),
    ("metrics.jsonl", "KL to the reference", ("kl",)),
    ("metrics.jsonl", "entropy (nats / token)", ("entropy",)),
    ("metrics.jsonl", "response length (tokens)", ("response_len",)),
    ("metrics.jsonl", "held-out accuracy", ("eval/greedy_accuracy", "eval/pass@1")),
    ("es_metrics.jsonl", "ES population reward", ("reward_mean",)),
)
"""(file, panel title, metric keys) of each panel; a panel with no finite value is left out."""

_warned = False


def _rows(path: Path) -> list[dict[str, Any]]:
    """The readable rows of a JSONL file (a torn or foreign line is skipped: a plot is no place to fail)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def curve_points(run_dir: str | Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{panel title: {metric key: [(step, value), ...]}}`` of the panels a run has data for."""
    run = Path(run_dir)
    cache: dict[str, list[dict[str, Any]]] = {}
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for file, title, keys in PANELS:
        rows = cache.setdefault(file, _rows(run / file))
        series = {k: [(r["step"], float(r[k])) for r in rows if _finite(r.get(k))] for k in keys}
        series = {k: v for k, v in series.items() if v}
        if series:
            out[title] = series
    return out


def write_curves(run_dir: str | Path) -> Path | None:
    """Draw the run's curves into ``run_dir/curves.png``; returns its path, or None when there is nothing to draw
    or matplotlib is not installed (one warning per process)."""
    global _warned
    run = Path(run_dir)
    points = curve_points(run)
    if not points:
        return None
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        if not _warned:
            _warned = True
            warnings.warn("matplotlib is not installed (pip install 'posttrain[plots]'): no curves.png", stacklevel=2)
        return None
    cols = min(3, len(points))
    rows = math.ceil(len(points) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.0 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    std = {r["step"]: float(r["reward_std"]) for r in _rows(run / "metrics.jsonl") if _finite(r.get("reward_std"))}
    for ax, (title, series) in zip(axes, points.items(), strict=False):
        for key, pts in series.items():
            steps, values = zip(*pts, strict=True)
            ax.plot(steps, values, marker="." if len(pts) < 40 else None, label=key)
            if title.startswith("reward") and all(s in std for s in steps):
                spread = [std[s] for s in steps]
                ax.fill_between(steps, [v - d for v, d in zip(values, spread, strict=True)],
                                [v + d for v, d in zip(values, spread, strict=True)], alpha=0.2)  # fmt: skip
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=8)
    for ax in axes[len(points) :]:
        ax.set_visible(False)
    fig.suptitle(run.name, fontsize=11)
    target = run / CURVES
    tmp = run / f".tmp-{CURVES}-{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    fig.savefig(tmp, format="png", dpi=100)
    os.replace(tmp, target)  # replaces a link at the target itself, never its target
    return target


def draw_curves(run_dir: str | Path) -> Path | None:
    """`write_curves`, warning instead of raising: a plot must never end or fail a run."""
    try:
        return write_curves(run_dir)
    except Exception as exc:
        warnings.warn(f"{CURVES} not written ({type(exc).__name__}: {exc})", stacklevel=2)
        return None
