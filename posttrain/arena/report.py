"""The arena's report: one `ArenaReport`, written as JSON, markdown and a PNG figure.

Every number of the markdown and the figure is in the JSON (``report.json``), which is the
`ArenaReport` as plain data (`to_dict`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.arena.contract import ContractReport
from posttrain.arena.conventions import ConventionReport
from posttrain.arena.curves import CurveConfig, EndpointResult
from posttrain.arena.exact import BIAS_P, GradientStats, ValueStats

__all__ = ["ArenaReport", "Cost", "figure", "markdown", "write_report"]


@dataclass(frozen=True)
class Cost:
    """What the run cost: CPU seconds of this process, wall seconds, the 1/5/15-minute load average."""

    cpu_s: float
    wall_s: float
    load_avg: tuple[float, float, float]
    sections: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ArenaReport:
    """Everything the arena measured for one function (see `posttrain.arena.judge`)."""

    name: str
    kind: str
    form: str
    signature: str
    baselines: tuple[str, ...]
    contract: ContractReport
    conventions: ConventionReport
    gradients: dict[str, list[GradientStats]]
    off_policy: dict[str, list[GradientStats]]
    values: dict[str, list[ValueStats]]
    curve_config: CurveConfig
    curves: dict[str, list[float]]
    reached: dict[str, tuple[int, int, float, float]]
    endpoints: list[EndpointResult]
    errors: dict[str, str]
    cost: Cost
    toy_kl: dict[str, float] = field(default_factory=dict)
    """Exact mean KL between each toy's two policies (off-policy probe of a loss, reference of a KL estimator)."""

    @property
    def equal_to(self) -> list[str]:
        return [m.name for m in self.conventions.equal]

    def biased(self, who: str | None = None) -> bool:
        """Whether the bias test flags ``who`` (default: the function) on any toy and group size."""
        return any(g.biased for g in self.gradients.get(who or self.name, []))

    def endpoint(self, name: str, baseline: str) -> EndpointResult:
        return next(e for e in self.endpoints if e.endpoint == name and e.baseline == baseline)

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def _fmt(x: float, digits: int = 3) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.{digits}g}" if abs(x) < 1e-3 and x != 0 else f"{x:.{digits}f}"


def _gradient_table(title: str, rows: dict[str, list[GradientStats]]) -> list[str]:
    lines = [f"### {title}", "", "| estimator | toy | K | scale ± SE | relative bias | relative variance ± SE | cosine | p (bias) | untested share |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for who, stats in rows.items():
        for g in stats:
            flag = " **biased**" if g.biased else ""
            lines.append(
                f"| {who} | {g.toy} | {g.k} | {g.scale:.4f} ± {g.scale_se:.4f} | {g.bias:.4f} | "
                f"{g.variance:.4g} ± {g.variance_se:.2g} | {g.cosine:.4f} | {g.p_value:.2g}{flag} | {g.unvisited:.2g} |"
            )
    return [*lines, ""]


def markdown(r: ArenaReport) -> str:
    """The report as markdown (the figure is ``arena.png`` beside it)."""
    out = [
        f"# Arena report: `{r.name}`",
        "",
        f"Kind **{r.kind}**, form `{r.signature}`; baselines: {', '.join(r.baselines)}.",
        "",
    ]
    out += ["## 1. Contract", ""]
    if not r.contract.findings:
        out += ["Every contract item holds.", ""]
    for f in r.contract.findings:
        out.append(f"- **{f.severity}** {f.line()}")
    out += ["", "| property | holds | counterexample (shrunk) |", "| --- | --- | --- |"]
    for p in r.contract.properties:
        tag = " (contract)" if p.contract else ""
        ce = f"{p.reason}: `{p.counterexample}`" if not p.holds else ""
        out.append(f"| {p.statement}{tag} | {'yes' if p.holds else 'no'} | {ce} |")
    out += ["", "## 2. Conventions", ""]
    c = r.conventions
    if c.equal:
        names = ", ".join(f"`{m.name}`" + (f" (= {c.aliases[m.name]})" if m.name in c.aliases else "") for m in c.equal)
        out += [
            f"Equal to {names} on every probe (values{'' if r.kind == 'advantage' else ' and gradients'} to 1e-7).",
            "",
        ]
    else:
        out += [f"Equal to no registered estimator or framework mode. Closest: `{c.closest}`.", "", c.departure, ""]
    out += [
        "| candidate | source | relation | share of entries that differ | max relative difference |",
        "| --- | --- | --- | --- | --- |",
    ]
    for m in c.matches:
        rel = m.relation + (f" (factor by K: { {k: round(v, 4) for k, v in m.factor.items()} })" if m.factor else "")
        out.append(f"| {m.name} | {m.source} | {rel} | {_fmt(m.share)} | {_fmt(max(m.value_diff, m.grad_diff))} |")
    out += ["", "## 3. Exact toys", ""]
    out += [
        "Monte Carlo over independent draws. *scale* = ⟨ĝ, ∇J⟩/‖∇J‖² (1 when unbiased along ∇J); *relative "
        f"bias* = ‖E ĝ − ∇J‖/‖∇J‖ (noise floor removed); *biased* when the bias test gives p < {BIAS_P:g} "
        "(Hotelling's T² with a test of scale = 1); *untested share*: the part of ‖∇J‖ on parameters too rarely "
        "reached to enter the test.",
        "",
    ]
    out += _gradient_table(
        "Gradient against the exact policy gradient" if r.kind != "kl" else "Gradient against the exact KL gradient",
        r.gradients,
    )
    if r.off_policy:
        kl = ", ".join(f"{toy} {v:.3f}" for toy, v in r.toy_kl.items())
        out += _gradient_table(
            f"Off-policy: responses from θ_old, gradient at θ against ∇J(θ) (exact KL(θ‖θ_old): {kl})", r.off_policy
        )
    if r.values:
        out += [
            "### KL value against the exact sequence KL",
            "",
            "| estimator | toy | K | mean ± SE | exact | z |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for who, vals in r.values.items():
            for v in vals:
                z = (v.mean - v.exact) / v.mean_se if v.mean_se > 0 else math.nan
                out.append(f"| {who} | {v.toy} | {v.k} | {v.mean:.4f} ± {v.mean_se:.4f} | {v.exact:.4f} | {z:+.1f} |")
        out.append("")
    cfg = r.curve_config
    out += ["## 4. Learning curves", "", f"{cfg.seeds} paired seeds, {cfg.steps} steps, K = {cfg.k}, Adam lr {cfg.lr}; "
            f"threshold {cfg.threshold}; endpoints fixed before the run; one-sided level 0.025 per bound.", "",
            "| endpoint | vs | estimate | 95% interval | verdict | MDE | method |", "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for e in r.endpoints:
        mde = _fmt(e.mde) if e.verdict == "indistinguishable" else ""
        out.append(
            f"| {e.endpoint} | {e.baseline} | {e.estimate:+.4f} | [{e.lower:+.4f}, {e.upper:+.4f}] | {e.verdict} | {mde} | {e.method}{' ' + e.note if e.note else ''} |"
        )
    out += ["", "| method | seeds reaching the threshold | Clopper-Pearson 95% |", "| --- | --- | --- |"]
    for who, (k, n, lo, hi) in r.reached.items():
        out.append(f"| {who} | {k}/{n} | [{lo:.3f}, {hi:.3f}] |")
    if r.errors:
        out += ["", "## Sections that could not run", ""] + [f"- {k}: {v}" for k, v in r.errors.items()]
    cost = r.cost
    out += ["", "## Cost", "", f"{cost.cpu_s:.1f} s CPU, {cost.wall_s:.1f} s wall, load average {cost.load_avg[0]:.2f} "
            f"(1 min); by section (CPU s): " + ", ".join(f"{k} {v:.1f}" for k, v in cost.sections.items()), "", "![arena](arena.png)", ""]  # fmt: skip
    return "\n".join(out)


def figure(r: ArenaReport, path: Path) -> None:
    """Three panels: reward curves (mean ± 2 SE over seeds), gradient scale and relative variance against K."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    names = list(dict.fromkeys([*r.curves, *r.gradients]))
    colour = {who: f"C{i}" for i, who in enumerate(names)}
    label = {who: "yours" if who == r.name else who for who in names}
    ax = axes[0]
    for who, mean in r.curves.items():
        ax.plot(range(len(mean)), mean, label=label[who], color=colour[who], lw=2.2 if who == r.name else 1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("exact expected reward")
    ax.set_title("learning curves (mean over seeds)", fontsize=9)
    ax.legend(fontsize=7)
    for ax, field_name, title in ((axes[1], "scale", "gradient scale ⟨ĝ, g⟩/|g|² (1 = unbiased)"),
                                  (axes[2], "variance", "relative variance E|ĝ - Eĝ|²/|g|²")):  # fmt: skip
        for who, stats in r.gradients.items():
            for toy, style in (("tabular", "-"), ("bandit", "--")):
                pts = [g for g in stats if g.toy == toy]
                ks = [g.k for g in pts]
                ys = [getattr(g, field_name) for g in pts]
                err = [2 * (g.scale_se if field_name == "scale" else g.variance_se) for g in pts]
                ax.errorbar(
                    ks,
                    ys,
                    yerr=err,
                    ls=style,
                    marker="o",
                    ms=3,
                    capsize=2,
                    color=colour[who],
                    label=f"{label[who]} ({toy})",
                    lw=2 if who == r.name else 1,
                )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("group size K")
        ax.set_title(title, fontsize=9)
    axes[1].axhline(1.0, color="k", lw=0.6)
    axes[2].set_yscale("log")
    axes[2].legend(fontsize=6, ncol=1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(r: ArenaReport, out: Path, *, draw: bool = True) -> dict[str, Path]:
    """Write ``report.json``, ``report.md`` and (with ``draw``) ``arena.png`` into ``out`` (created)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "report.json", "markdown": out / "report.md", "figure": out / "arena.png"}
    paths["json"].write_text(json.dumps(r.to_dict(), indent=1) + "\n")
    paths["markdown"].write_text(markdown(r))
    if draw:
        figure(r, paths["figure"])
    return paths
