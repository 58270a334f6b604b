"""The paper checks' command line: ``posttrain check`` and each check module's own ``main``.

``posttrain check [IDS] [--smoke] [--seeds N] [--out DIR] [--json] [--tables] [--mutant NAME | --mutants]
[--stability] [--strict] [--jobs N]`` runs the selected checks (all by default; in one worker process per
CPU unless ``--jobs`` says otherwise) and prints a one-screen summary;
``--tables`` also prints every check's tables, ``--out`` writes ``report.md``, ``results.json`` (and
``mutants.json`` for mutant runs) and one figure per check. A check module ends with
``if __name__ == "__main__": raise SystemExit(main_for(CHECK))`` and takes the same options
(``python -m posttrain.paper_checks.p16_sis --seeds 20``).

Exit code: 0 when every run finished (whatever the verdicts), 1 when one raised, 2 for an unknown
check id or mutant; with ``--strict`` a verdict other than *reproduced* also gives 1.
The heavy modules are imported when a command runs, so the options below cost nothing at start-up.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

if TYPE_CHECKING:
    from posttrain.paper_checks.model import PaperCheck

__all__ = ["OPTIONS", "main", "main_for", "run_selected"]

OPTIONS = {
    "smoke": typer.Option(False, "--smoke", help="Run the small smoke variant of each check."),
    "seeds": typer.Option(None, "--seeds", help="Override the number of seeds."),
    "out": typer.Option(None, "--out", help="Directory for report.md, results.json (mutants.json) and the figures."),
    "json_out": typer.Option(False, "--json", help="Print the results as JSON instead of the summary."),
    "strict": typer.Option(False, "--strict", help="Also exit non-zero when a verdict is not reproduced."),
    "stability": typer.Option(False, "--stability", help="Also rerun each check at twice its seeds; list changes."),
    "tables": typer.Option(False, "--tables", help="Print every check's metric and comparison tables too."),
    "mutant": typer.Option(None, "--mutant", help="Run this mutant (a wrong method) of the one selected check."),
    "mutants": typer.Option(False, "--mutants", help="Also run every mutant of the selected checks (mutants.json)."),
    "jobs": typer.Option(
        0, "--jobs", help="Worker processes (0: one per available CPU); verdicts do not depend on it."
    ),
}
"""The options shared by ``posttrain check`` and each check's ``main`` (one declaration)."""


def main(ids: Sequence[str], *, console: Console | None = None, **options: Any) -> int:
    """Run the checks named by ``ids`` (all when empty); see `run_selected` for the options."""
    from posttrain.paper_checks.runner import select_checks

    console = console or Console()
    try:
        checks = select_checks(ids)
    except KeyError as exc:
        console.print(f"[red]{exc.args[0]}[/]")
        return 2
    return run_selected(checks, console=console, **options)


def _progress(console: Console, hidden: bool) -> Any:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=hidden,
    )


def run_selected(
    checks: Sequence[PaperCheck],
    *,
    smoke: bool = False,
    seeds: int | None = None,
    out: str | None = None,
    json_out: bool = False,
    strict: bool = False,
    stability: bool = False,
    tables: bool = False,
    mutant: str | None = None,
    mutants: bool = False,
    jobs: int = 1,
    console: Console | None = None,
) -> int:
    """Run ``checks`` (or the one named ``mutant`` of the single check), print, write ``out``; return the exit code."""
    from posttrain.paper_checks import report
    from posttrain.paper_checks import tables as view
    from posttrain.paper_checks.figures import Plotter
    from posttrain.paper_checks.markdown import markdown_report
    from posttrain.paper_checks.model import Verdict
    from posttrain.paper_checks.runner import CheckOutcome, default_workers, run_jobs

    console = console or Console()
    if mutant is not None:
        if len(checks) != 1:
            console.print(f"[red]--mutant needs exactly one check, got {len(checks)}[/]")
            return 2
        try:
            checks[0].mutant(mutant)
        except KeyError as exc:
            console.print(f"[red]{exc.args[0]}[/]")
            return 2
    meta = report.run_metadata()
    start, cpu = time.perf_counter(), time.process_time()
    outcomes: list[CheckOutcome] = []
    mutant_runs: list[CheckOutcome] = []
    todo: list[tuple[PaperCheck, str | None]] = [(c, None) for c in checks] if mutant is None else [(checks[0], mutant)]
    if mutants and mutant is None:
        todo += [(c, m.name) for c in checks for m in c.mutants]
    workers = default_workers(len(todo)) if jobs <= 0 else jobs
    plotter = Plotter(Path(out)) if out is not None and mutant is None else None
    with contextlib.nullcontext() if plotter is None else plotter, _progress(console, json_out) as progress:
        task = progress.add_task(f"paper checks ({workers} worker{'s' if workers > 1 else ''})", total=len(todo))

        def started(job: tuple[PaperCheck, str | None]) -> None:
            progress.update(task, description=f"check {job[0].id}" + (f" mutant {job[1]}" if job[1] else ""))

        def finished(o: CheckOutcome) -> None:
            if plotter is not None and o.mutant is None:
                plotter.add(o)
            progress.advance(task)

        for o in run_jobs(todo, smoke=smoke, seeds=seeds, workers=workers, on_start=started, on_done=finished):
            (mutant_runs if o.mutant else outcomes).append(o)
        progress.update(task, description="paper checks (figures)")
    records: list[dict[str, Any]] = []
    if stability:
        from posttrain.paper_checks.runner import stability as rerun

        records = rerun(outcomes, smoke=smoke)
    worker_cpu = sum(o.cpu_time_s for o in outcomes + mutant_runs) if workers > 1 else 0.0
    meta["wall_time_s"], meta["cpu_time_s"] = time.perf_counter() - start, time.process_time() - cpu + worker_cpu
    meta["workers"] = workers
    payload = report.results_payload(outcomes, smoke=smoke, meta=meta)
    mutant_payload = report.mutants_payload(mutant_runs, smoke=smoke, meta=meta)
    if stability:
        payload["stability"] = records
    if json_out:
        print(json.dumps({**payload, "mutants": mutant_payload["mutants"]}, indent=2, default=float))
    elif tables:
        view.print_tables(outcomes, console)
    if out is not None:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        if outcomes:
            plots = plotter.names if plotter is not None else {}
            (folder / "results.json").write_text(json.dumps(payload, indent=2, default=float) + "\n")
            text = markdown_report(payload, plots=plots, mutants=mutant_payload["mutants"])
            (folder / "report.md").write_text(text)
        if mutant_runs:
            (folder / "mutants.json").write_text(json.dumps(mutant_payload, indent=2, default=float) + "\n")
    if not json_out:
        if outcomes:
            view.print_summary(outcomes, console, meta, out)
        if mutant_runs:
            view.print_mutants(mutant_runs, console)
        if stability:
            view.print_stability(records, console)
    runs = outcomes + mutant_runs
    errors = any(o.verdict is Verdict.ERROR for o in runs)
    unmet = any(o.verdict is not Verdict.REPRODUCED for o in outcomes)
    return 1 if errors or (strict and unmet) else 0


def main_for(*checks: PaperCheck, argv: Sequence[str] | None = None) -> int:
    """The command line of a check module (``python -m posttrain.paper_checks.pNN_name [OPTIONS]``): its checks."""
    ids = ", ".join(c.id for c in checks)
    app = typer.Typer(add_completion=False, help=f"Paper check {ids}: " + "; ".join(c.claim for c in checks))

    @app.command()
    def one(
        smoke: bool = OPTIONS["smoke"],
        seeds: int = OPTIONS["seeds"],
        out: str = OPTIONS["out"],
        json_out: bool = OPTIONS["json_out"],
        strict: bool = OPTIONS["strict"],
        stability: bool = OPTIONS["stability"],
        tables: bool = OPTIONS["tables"],
        mutant: str = OPTIONS["mutant"],
        mutants: bool = OPTIONS["mutants"],
        jobs: int = OPTIONS["jobs"],
    ) -> None:
        code = run_selected(
            list(checks),
            smoke=smoke,
            seeds=seeds,
            out=out,
            json_out=json_out,
            strict=strict,
            stability=stability,
            tables=tables,
            mutant=mutant,
            mutants=mutants,
            jobs=jobs,
        )
        raise typer.Exit(code)

    try:
        app(args=list(sys.argv[1:] if argv is None else argv), prog_name=f"check {ids}")
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    return 0
