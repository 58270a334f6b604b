"""The one-screen terminal summary of an `ArenaReport` (rich, at most 80 columns)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console, Group
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from posttrain.arena.exact import BIAS_P, GradientStats
from posttrain.arena.report import ArenaReport

__all__ = ["WIDTH", "print_summary", "summary"]

WIDTH = 80
_COLOUR = {"better": "green", "worse": "red", "indistinguishable": "yellow", "larger": "cyan", "smaller": "cyan"}


def _cut(text: str, width: int = WIDTH - 2) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _contract(r: ArenaReport) -> list[Text]:
    c = r.contract
    defects = [f for f in c.findings if f.severity == "defect"]
    validation = sorted({f.item for f in c.findings if f.severity == "validation"})
    head = Text(" defects: ")
    head.append(str(len(defects)) if defects else "none", style="red bold" if defects else "green")
    head.append(f" · validation: {', '.join(validation) if validation else 'ok'}")
    lines = [head] + [Text(_cut(" ✗ " + f.line()), style="red") for f in defects[:4]]
    holds = [p.id for p in c.properties if p.holds]
    fails = [p.id for p in c.properties if not p.holds]
    lines.append(Text(_cut(" holds: " + (", ".join(holds) or "none")), style="green"))
    if fails:
        lines.append(Text(_cut(" fails: " + ", ".join(fails)), style="yellow"))
    return lines


def _conventions(r: ArenaReport) -> list[Text]:
    c = r.conventions
    if c.equal:
        return [Text(_cut(" equals: " + ", ".join(m.name for m in c.equal)), style="green")]
    prop = [m for m in c.matches if m.relation in ("proportional", "same gradient")]
    lines = [Text(_cut(f" equals: none · closest: {c.closest}"))]
    if prop:
        lines.append(Text(_cut(" " + ", ".join(f"{m.relation} to {m.name}" for m in prop[:3]))))
    return [*lines, Text(_cut(" " + c.departure, 3 * (WIDTH - 2)))]


def _num(x: float) -> str:
    """A signed number in at most 7 characters (scientific below 0.01)."""
    return f"{x:+.3f}" if x == 0 or abs(x) >= 0.01 or x != x else f"{x:+.0e}"


def _gradients(r: ArenaReport, rows: dict[str, list[GradientStats]], toy: str = "tabular") -> Table:
    ks = sorted({g.k for g in rows.get(r.name, [])})
    t = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 2, 0, 0))
    t.add_column("estimator", no_wrap=True, max_width=18)
    for k in ks:
        t.add_column(f"K={k}", justify="right", no_wrap=True)
    t.add_column("bias", no_wrap=True)
    for who, stats in rows.items():
        by_k = {g.k: g for g in stats if g.toy == toy}
        cells = [f"{by_k[k].scale:.3f}±{by_k[k].scale_se:.3f}" if k in by_k else "" for k in ks]
        biased = any(g.biased for g in stats)
        flag = Text("biased", style="red") if biased else Text("none found", style="green")
        t.add_row(Text("yours", style="bold") if who == r.name else who, *cells, flag)
    return t


def _endpoints(r: ArenaReport) -> Table:
    t = Table(box=None, pad_edge=False, show_edge=False, padding=(0, 1, 0, 0))
    t.add_column("endpoint", no_wrap=True, max_width=18)
    t.add_column("vs", no_wrap=True, max_width=8)
    t.add_column("estimate [95%]", no_wrap=True)
    t.add_column("verdict", no_wrap=True)
    t.add_column("MDE", no_wrap=True, justify="right")
    for e in r.endpoints:
        verdict = Text(e.verdict, style=_COLOUR.get(e.verdict, ""))
        mde = f"{e.mde:.3f}" if e.verdict == "indistinguishable" and e.mde == e.mde else ""
        t.add_row(e.endpoint, e.baseline, f"{_num(e.estimate)} [{_num(e.lower)}, {_num(e.upper)}]", verdict, mde)
    return t


def _gradient_parts(r: ArenaReport) -> list[object]:
    if r.off_policy:  # on-policy every ratio loss is REINFORCE: the off-policy probe tells them apart
        title = f"off-policy gradient scale, tabular toy (1 = unbiased; test p < {BIAS_P:g})"
        return [Rule(title, style="dim"), _gradients(r, r.off_policy)]
    title = f"gradient scale on the tabular toy (1 = unbiased; bias test p < {BIAS_P:g})"
    return [Rule(title, style="dim"), _gradients(r, r.gradients)]


def summary(r: ArenaReport, paths: dict[str, Path] | None = None) -> Group:
    """The summary as one rich renderable (print it with a console at most `WIDTH` wide)."""
    cfg = r.curve_config
    parts: list[object] = [
        Text(_cut(f"posttrain arena · {r.name}"), style="bold"),
        Text(_cut(f"{r.kind} · {r.signature}")),
        Rule("contract", style="dim"),
        *_contract(r),
        Rule("conventions", style="dim"),
        *_conventions(r),
        *_gradient_parts(r),
        Rule(f"learning curves: {cfg.seeds} paired seeds, {cfg.steps} steps", style="dim"),
        _endpoints(r),
    ]
    for section, message in r.errors.items():
        parts.append(Text(_cut(f" {section}: {message}"), style="red"))
    cost = r.cost
    parts.append(
        Text(f"{cost.cpu_s:.1f} s CPU ({cost.wall_s:.1f} s wall), load average {cost.load_avg[0]:.1f}", style="dim")
    )
    if paths:
        where = str(paths["markdown"])
        parts.append(
            Text("report: " + (where if len(where) <= WIDTH - 10 else "…" + where[-(WIDTH - 11) :]), style="dim")
        )
    return Group(*parts)  # type: ignore[arg-type]


def print_summary(r: ArenaReport, paths: dict[str, Path] | None = None, console: Console | None = None) -> None:
    """Print `summary` on ``console`` (default: stdout), never wider than `WIDTH` columns."""
    c = console or Console()
    narrow = Console(width=min(WIDTH, c.width), file=c.file, force_terminal=c.is_terminal, no_color=c.no_color)
    narrow.print(summary(r, paths))
