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
REGISTERING_MODULES = ["posttrain.estimators", "posttrain.paper_checks"]


def load_registries() -> None:
    """Import every module that registers something."""
    for name in REGISTERING_MODULES:
        importlib.import_module(name)


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
    ids: list[str] = typer.Argument(None, help="Paper ids to run (default: all)."),
    smoke: bool = typer.Option(False, "--smoke", help="Run the small smoke variant of each check."),
    seeds: int = typer.Option(None, "--seeds", help="Override the number of seeds."),
    out: str = typer.Option(None, "--out", help="Directory for report.md and results.json."),
    json_out: bool = typer.Option(False, "--json", help="Print results as JSON."),
) -> None:
    """Run the paper checks and print a verdict per claim."""
    from posttrain.paper_checks import CHECKS

    load_registries()
    if len(CHECKS) == 0:
        console.print("No paper checks are registered yet.")
        raise typer.Exit(0)
    runner = importlib.import_module("posttrain.paper_checks._harness")
    code = runner.main(ids or [], smoke=smoke, seeds=seeds, out=out, json_out=json_out, console=console)
    raise typer.Exit(code)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
