"""One figure per check: small multiples of its metrics and comparisons, then the curves it recorded.

Each metric and each comparison gets its own axis (their units differ): the per-seed values as
dots, the mean as a diamond (with the comparison's 95% bounds for a mean criterion), the margin as
a vertical line coloured by the comparison's outcome. Curves come from ``Result.extra["series"]``
as ``{title: {"x": [...], "lines": {label: [...]}, "xlabel": str, "ylabel": str, "logx": bool,
"logy": bool}}``. Figures are drawn in a worker process while the next check runs (`Plotter`).
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from posttrain.paper_checks.model import Criterion, Role

if TYPE_CHECKING:
    from posttrain.paper_checks.runner import CheckOutcome

__all__ = ["PlotData", "Plotter", "plot"]

_COLORS = {"holds": "tab:green", "excluded": "tab:red", "undecided": "tab:orange"}


def _small_axis(ax: Any, values: np.ndarray, mean: float, lo: float, hi: float, title: str) -> None:
    """One quantity on its own axis: per-seed dots, the mean and (when finite) its interval."""
    from matplotlib.ticker import FormatStrFormatter, MaxNLocator

    jitter = np.linspace(-0.15, 0.15, values.size) if values.size > 1 else np.zeros(values.size)
    ax.scatter(values, jitter, s=10, color="tab:blue", alpha=0.6, zorder=2)
    if math.isfinite(mean):
        err = [[max(mean - lo, 0.0)], [max(hi - mean, 0.0)]] if math.isfinite(lo) and math.isfinite(hi) else None
        ax.errorbar([mean], [0.0], xerr=err, fmt="kd", capsize=3, ms=4, zorder=3)
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
            plot(data, path)
        else:
            self.futures.append(self.pool.submit(plot, data, path))
        self.names[o.check.id] = name

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            try:
                for future in self.futures:
                    future.result()  # a drawing error surfaces here
            finally:
                self.pool.shutdown()


def plot(data: PlotData, path: Path) -> None:
    """Small multiples: one axis per metric, one per comparison (coloured by outcome), one per curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series, ms, cs = data.series, data.metrics, data.comparisons
    cols = 4
    rows_small = math.ceil((len(ms) + len(cs)) / cols)
    rows_series = math.ceil(len(series) / 2)
    fig = plt.figure(figsize=(12, 1.15 * rows_small + 3.2 * rows_series + 0.8), layout="constrained")
    grid = fig.add_gridspec(rows_small + rows_series, cols, height_ratios=[1.0] * rows_small + [2.8] * rows_series)
    for i, m in enumerate(ms):
        ax = fig.add_subplot(grid[i // cols, i % cols])
        v = np.asarray(m["per_seed"], dtype=np.float64)
        sd = m["sd"] if math.isfinite(m["sd"]) else math.nan
        _small_axis(ax, v[np.isfinite(v)], m["mean"], m["mean"] - sd, m["mean"] + sd, f"metric: {m['name']}")
        if m["paper_value"] is not None:
            ax.plot([m["paper_value"]], [0.3], "r*", ms=7, zorder=4)
        ax.set_xlabel(
            "value, mean +- sd (* paper)" if m["paper_value"] is not None else "value, mean +- sd", fontsize=6
        )
    for j, c in enumerate(cs):
        i = len(ms) + j
        ax = fig.add_subplot(grid[i // cols, i % cols])
        v = np.asarray(c["differences"], dtype=np.float64)
        on_axis = c["kind"] == Criterion.MEAN.value  # a quantile's bounds are on a share, not on d
        lo, hi = (c["lower"], c["upper"]) if on_axis else (math.nan, math.nan)
        _small_axis(ax, v[np.isfinite(v)], c["mean"], lo, hi, f"{c['role']}: Δ {c['name']}")
        color = _COLORS[c["outcome"]] if c["role"] != Role.CONTEXT.value else "tab:gray"
        ax.axvline(c["margin"], color=color, lw=1.5, ls=":" if c["role"] == Role.CONTEXT.value else "-")
        ax.set_xlabel(f"difference; line: margin; {c['outcome']}", fontsize=6, color=color)
        for spine in ax.spines.values():
            spine.set_edgecolor(color)
            spine.set_linewidth(2.0 if c["role"] == Role.PRIMARY.value else 0.8)
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
        f"{data.check_id}: {data.verdict} (dots: seeds; diamond: mean, with the 95% bounds of a mean criterion; "
        "thick frame: primary; dotted margin: context)",
        fontsize=9,
    )
    fig.savefig(path, dpi=90)
    plt.close(fig)
