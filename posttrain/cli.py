"""The ``posttrain`` command line (typer + rich).

Subcommands register here; the heavy ones import their modules lazily so ``posttrain --help``
stays fast.
"""

from __future__ import annotations

import importlib

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    name="posttrain",
    help="LLM post-training methods: estimators, toy paper checks, and an LLM trainer.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()

# Modules whose import registers estimators, checks, ... (kept in one list so `list` sees all).
REGISTERING_MODULES = [
    "posttrain.estimators",
    "posttrain.estimators.optim",
    "posttrain.estimators.projections",
    "posttrain.paper_checks",
]


def load_registries() -> None:
    """Import every module that registers something."""
    for name in REGISTERING_MODULES:
        importlib.import_module(name)
    from posttrain.paper_checks import load_all

    load_all()


@app.command("list")
def list_registered(kind: str = typer.Argument(None, help="Only this registry (e.g. advantage).")) -> None:
    """List every registered estimator (and check) with its one-line summary and paper."""
    from posttrain.registry import REGISTRIES

    load_registries()
    kinds = [kind] if kind else sorted(REGISTRIES)
    for k in kinds:
        if k not in REGISTRIES:
            raise typer.BadParameter(f"unknown registry {k!r}; valid: {', '.join(sorted(REGISTRIES))}")
        reg = REGISTRIES[k]
        table = Table(title=f"{k} ({len(reg)})", show_lines=False)
        table.add_column("name", style="bold")
        table.add_column("summary")
        table.add_column("paper", style="dim")
        for e in reg:
            table.add_row(e.name, e.summary, e.paper)
        console.print(table)


@app.command("check")
def check(
    ids: list[str] = typer.Argument(None, help="Check ids to run (default: all); '20' also runs 20a, 20b, ..."),
    smoke: bool = typer.Option(False, "--smoke", help="Run the small smoke variant of each check."),
    seeds: int = typer.Option(None, "--seeds", help="Override the number of seeds."),
    out: str = typer.Option(None, "--out", help="Directory for report.md, results.json and PNG plots."),
    json_out: bool = typer.Option(False, "--json", help="Print results as JSON."),
    strict: bool = typer.Option(False, "--strict", help="Also exit non-zero when a claim is not reproduced."),
) -> None:
    """Run the paper checks and print a verdict per claim (exit 1 if a check raised)."""
    from posttrain.paper_checks import CHECKS

    load_registries()  # includes every paper-check module
    if len(CHECKS) == 0:
        console.print("No paper checks are registered yet.")
        raise typer.Exit(0)
    runner = importlib.import_module("posttrain.paper_checks._harness")
    code = runner.main(ids or [], smoke=smoke, seeds=seeds, out=out, json_out=json_out, strict=strict, console=console)
    raise typer.Exit(code)


def _print_edit_report(report: object) -> None:
    from dataclasses import asdict

    data = {k: v for k, v in asdict(report).items() if k != "per_tensor"}  # type: ignore[call-overload]
    table = Table(title="checkpoint edit")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for k, v in data.items():
        table.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
    console.print(table)


@app.command("sar")
def sar(
    base_dir: str = typer.Argument(..., help="Base checkpoint directory (safetensors)."),
    tuned_dir: str = typer.Argument(..., help="RL-tuned checkpoint directory from the same base."),
    out_dir: str = typer.Argument(..., help="Where to write the edited checkpoint."),
    delta_fraction: float = typer.Option(
        0.01, "--rank", "--delta-fraction", help="k = max(1, floor(rank * min(m, n)))."
    ),
    base_rank: int = typer.Option(None, "--base-rank", help="Base subspace rank r (default: full)."),
    mask: str = typer.Option("full", "--mask", help="full, diagonal or off_diagonal."),
    alpha: float = typer.Option(1.0, "--alpha", help="Scale of the projected update."),
    dtype: str = typer.Option("auto", "--dtype", help="auto, float32, float16 or bfloat16 (bf16 may erase the edit)."),
    exact: bool = typer.Option(False, "--exact", help="Exact SVD of each delta instead of a randomized one."),
) -> None:
    """SAR: keep the rank-k part of an RL update aligned with the base's spectral frame (arXiv:2607.03065)."""
    from posttrain.llm.sar_edit import edit_checkpoint

    report = edit_checkpoint(
        base_dir,
        [tuned_dir],
        out_dir,
        delta_fraction=delta_fraction,
        base_rank=base_rank,
        mask=mask,
        alphas=[alpha],
        save_dtype=dtype,
        randomized=not exact,
    )
    _print_edit_report(report)


@app.command("merge")
def merge(
    base_dir: str = typer.Argument(..., help="Base checkpoint directory shared by all experts."),
    out_dir: str = typer.Argument(..., help="Where to write the merged checkpoint."),
    tuned_dirs: list[str] = typer.Argument(..., help="Expert checkpoint directories."),
    method: str = typer.Option("sar", "--method", help="sar, task_arithmetic, average or ties."),
    delta_fraction: float = typer.Option(0.01, "--rank", "--delta-fraction", help="SAR rank fraction."),
    dtype: str = typer.Option("auto", "--dtype", help="auto, float32, float16 or bfloat16."),
) -> None:
    """Merge RL experts fine-tuned from one base (SAR-projected sum by default)."""
    from posttrain.llm.sar_edit import edit_checkpoint

    report = edit_checkpoint(
        base_dir, tuned_dirs, out_dir, method=method, delta_fraction=delta_fraction, save_dtype=dtype
    )
    _print_edit_report(report)


# LLM trainer commands (posttrain.llm.cli imports torch/transformers only inside the commands).
from posttrain.llm import cli as _llm_cli  # noqa: E402

REGISTERING_MODULES += ["posttrain.llm.algorithm", "posttrain.llm.tasks"]  # method, task, verifier registries

app.command("train")(_llm_cli.train_command)
app.command("eval")(_llm_cli.eval_command)
app.command("es")(_llm_cli.es_command)


@app.command("flops")
def flops(
    config: str = typer.Argument(..., help="A training config YAML (llm format and/or a `flops:` section)."),
) -> None:
    """Print the RACE FLOP accounting (search / learning / reward, update fraction p) of a config."""
    from posttrain.theory.race_cli import print_flops

    print_flops(config, console)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
