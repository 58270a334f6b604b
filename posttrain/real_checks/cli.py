"""``posttrain real-check``: the real-model tier of the paper checks (runs, results file, docs, budget).

    posttrain real-check [IDS] [--profile full|measure|smoke] [--seeds N] [--root runs/real_checks]
                         [--out DIR] [--update-docs] [--train-ungated] [--gate-only] [--cached-only]
                         [--pilot] [--plan] [--budget] [--threads 2] [--archive]

``--profile full`` (default) is the suite on SmolLM2-135M-Instruct; ``measure`` runs every arm for 2
steps with a small evaluation (the per-step costs the budget reads); ``smoke`` runs every experiment
end to end on the tiny model built in code (1 seed, 2 steps; it trains the arms of a gated experiment
too, so every path runs). Runs are cached under ``--root`` by their content key: an interrupted suite
resumes where it stopped. ``--out`` writes ``real_results.json``; ``--update-docs`` (a full run) also
stores it as ``docs/paper_checks/real_results.json`` and regenerates the method pages' "On a real
model" sections and the transfer table of ``docs/validation.md``. ``--gate-only`` probes the base model
and applies the regime gates without training anything; ``--cached-only`` trains nothing either and judges
each experiment whose planned runs are all finished under ``--root`` (the others are *not run*, with the
count of finished runs): the results file and docs of a suite run in parts; ``--pilot`` runs 3 pilot seeds (10000-10002) of
each selected experiment and records its primary differences in ``docs/paper_checks/real_pilot.json``,
from which the seed plans are then drawn (`posttrain.real_checks.plan`). ``--plan`` prints the jobs and
seeds without running; ``--budget`` prices the full plan from the ``measure`` records under ``--root``.
``--archive`` restores the finished records kept in ``docs/paper_checks/real_runs`` under ``--root`` before
running and keeps the newly finished ones there after (`posttrain.real_checks.archive`): a suite run in
parts resumes on a machine that has none of its runs, and the records behind the results file travel with it.
Exit code: 0 when every experiment finished (whatever its verdict), 1 when one raised, 2 for bad options.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

__all__ = ["budget_of", "main"]


def _gated_out(exp: Any, root: Path) -> bool:
    """Whether the cached full-profile probes already put ``exp`` outside its toy's regime (no arm would train)."""
    from posttrain.real_checks.gate import gate_rows

    probes = {}
    for task in exp.probe_tasks:
        found = sorted((root / "full" / "probes").glob(f"{task}-*/probe.json"))
        if not found:
            return False
        probes[task] = json.loads(found[-1].read_text())
    rows = gate_rows([m for m in exp.card.mediators if m.source.value == "probe"], probes, {})
    return any(not r["inside"] for r in rows)


def budget_of(ids: list[str], root: Path, seeds: int | None = None, *, gated: bool = True) -> dict[str, Any]:
    """The full profile's plan for ``ids`` priced from the ``measure`` profile's records under ``root``.

    With ``gated``, experiments whose cached probes miss the toy's regime are left out (they train nothing).
    ``per_experiment``: each experiment's jobs not already counted for an earlier id (shared arms count once).
    """
    from posttrain.real_checks import select_experiments
    from posttrain.real_checks.arm_table import ARMS
    from posttrain.real_checks.arms import PROFILES, Kind, arm_config
    from posttrain.real_checks.plan import estimate
    from posttrain.real_checks.runs import Runner
    from posttrain.real_checks.suite import needed_runs, planned_seeds, sample_plan

    chosen = [e for e in select_experiments(ids) if not e.needs() and (not e.scope or e.context)]
    skipped = [e.id for e in chosen if gated and _gated_out(e, root)]
    exps = [e for e in chosen if e.id not in skipped]
    full, meas = PROFILES["full"], PROFILES["measure"]
    samples = sample_plan(full)
    runner = Runner(full, ARMS, root / "full", samples=samples)
    per_exp: dict[str, set[tuple[str, int]]] = {}

    def add(into: set[tuple[str, int]], arm: str, seed: int) -> None:
        into.add((arm, runner.seed_of(arm, seed)))
        for dep in ARMS[arm].dependencies():
            add(into, dep, seed)

    for e in exps:
        per_exp[e.id] = set()
        for a, s in needed_runs(e, range(planned_seeds(e, full, seeds) if not e.scope else 1)):
            add(per_exp[e.id], a, s)
    jobs = set().union(*per_exp.values()) if per_exp else set()
    steps, evals = {}, {}
    for name, _ in jobs:
        tree, kind = arm_config(full, ARMS[name], 0), ARMS[name].kind
        steps[name] = {Kind.RL: tree["optim"]["steps"], Kind.ES: tree.get("es", {}).get("steps", 0),
                       Kind.DPO: tree["optim"]["steps"]}.get(kind, 0) + int(tree["data"].get("sft_steps", 0))  # fmt: skip
        evals[name] = full.eval_prompts * samples.get(name, full.eval_samples)
    measured_runner = Runner(meas, ARMS, root / "measure", samples=sample_plan(meas))
    measured = {a: r for a in {n for n, _ in jobs} if (r := measured_runner.cached(a, 0)) is not None}
    out = estimate(sorted(jobs), steps, evals, measured)
    seen: set[tuple[str, int]] = set()
    marginal = {}
    for eid, js in per_exp.items():
        new = sorted(js - seen)
        seen |= js
        marginal[eid] = estimate(new, steps, evals, measured)["cpu_s"] if new else 0.0
    out.update(jobs=len(jobs), experiments=[e.id for e in exps], gated_out=skipped, measured_arms=sorted(measured),
               per_experiment_cpu_s=marginal)  # fmt: skip
    return out


def _print_budget(b: dict[str, Any], console: Console) -> None:
    table = Table(
        title=f"full-profile budget: {b['jobs']} runs (arm x seed), from {len(b['measured_arms'])} measured arms"
    )
    for col in ("arm", "CPU h"):
        table.add_column(col)
    for arm, s in sorted(b["per_arm_cpu_s"].items(), key=lambda x: -x[1]):
        table.add_row(arm + (" (unmeasured: median rate)" if arm in b["unmeasured"] else ""), f"{s / 3600:.2f}")
    console.print(table)
    marginal = ", ".join(f"{k} {v / 3600:.1f}" for k, v in b["per_experiment_cpu_s"].items())
    console.print(f"CPU h per experiment (jobs not counted for an earlier id): {marginal}")
    if b["gated_out"]:
        console.print(f"left out (the cached probes miss the toy's regime): {', '.join(b['gated_out'])}")
    console.print(f"total {b['cpu_s'] / 3600:.1f} CPU h; wall with both cores {b['wall_s_two_cores'] / 3600:.1f} h "
                  f"(median rates: step {b['median_rates']['step']:.1f} CPU s, held-out sample "
                  f"{b['median_rates']['sample']:.2f} CPU s, build {b['median_rates']['build']:.1f} CPU s)")  # fmt: skip


_MARK = {True: "", False: " (out)", None: " (not measured)"}
"""A gate row's mark in the summary table (``inside`` is None for a run mediator of untrained arms)."""


def _print_summary(payload: dict[str, Any], console: Console) -> None:
    from posttrain.paper_checks.report import fmt

    table = Table(title=f"real-model checks ({payload['mode']})")
    for col in ("id", "verdict", "seeds", "primary: seeds clearing [bound]", "gate"):
        table.add_column(col)
    for e in payload["experiments"]:
        p = next((c for c in e.get("comparisons", []) if c.get("role") == "primary"), None)
        prim = f"{p['count']}/{p['n']} [{p['lower']:.2f}, {p['upper']:.2f}]" if p else "-"
        gate = ", ".join(f"{g['name']} {fmt(g['value'])}{_MARK[g['inside']]}" for g in e.get("gate", []))
        table.add_row(e["id"], e["verdict"], str(e.get("seeds_run", "-")), prim, gate or e.get("reason", "")[:60])
    console.print(table)
    for e in payload["experiments"]:
        if e["verdict"] == "error":
            console.print(f"[red]{e['id']}: {escape(e.get('error', 'no message recorded'))}[/]", highlight=False)


def main(
    ids: list[str],
    *,
    profile: str = "full",
    seeds: int | None = None,
    root: str = "runs/real_checks",
    out: str | None = None,
    update_docs: bool = False,
    train_ungated: bool = False,
    plan: bool = False,
    budget: bool = False,
    gate_only: bool = False,
    cached_only: bool = False,
    pilot: bool = False,
    threads: int = 2,
    archive: bool = False,
    console: Console | None = None,
) -> int:
    """Run the selected experiments (module docstring); returns the exit code."""
    import torch

    from posttrain.real_checks import select_experiments
    from posttrain.real_checks.arms import PROFILES
    from posttrain.real_checks.suite import arms_of, planned_seeds, run_suite

    console = console or Console()
    if profile not in PROFILES:
        console.print(f"[red]--profile: expected one of {', '.join(PROFILES)}, got {profile!r}[/]")
        return 2
    try:
        exps = select_experiments(ids)
    except KeyError as exc:
        console.print(f"[red]{exc.args[0]}[/]")
        return 2
    if update_docs and profile != "full":
        console.print("[red]--update-docs needs a full-profile run (the docs describe the suite, not a smoke run)[/]")
        return 2
    if budget:
        _print_budget(budget_of(list(ids), Path(root), seeds), console)
        return 0
    prof = PROFILES[profile]
    if plan:
        for e in exps:
            console.print(f"{e.id}: {planned_seeds(e, prof, seeds)} seeds; arms {', '.join(e.arms) or '-'}"
                          f"{'; ' + (e.scope or e.needs()) if e.scope or e.needs() else ''}")  # fmt: skip
        console.print(f"{len(arms_of(exps))} arms in all (shared arms once per seed)")
        return 0
    torch.set_num_threads(threads)
    if gate_only and cached_only:
        console.print("[red]--gate-only and --cached-only: choose one (both train nothing)[/]")
        return 2
    if pilot and (gate_only or cached_only or update_docs or profile != "full"):
        console.print("[red]--pilot runs the full profile's pilot seeds alone (no --gate-only, --update-docs)[/]")
        return 2
    if archive:
        from posttrain.real_checks.archive import RUNS_ARCHIVE, pack, restore

        console.print(f"restored {len(restore(RUNS_ARCHIVE, root, prof.name))} records and probes from {RUNS_ARCHIVE}")
    payload = run_suite(exps, prof, root, seeds=seeds, train_ungated=train_ungated or profile == "smoke",
                        gate_only=gate_only, pilot=pilot, cached_only=cached_only, log=lambda line: console.print(f"[dim]{line}[/]"))  # fmt: skip
    _print_summary(payload, console)
    if archive:
        console.print(f"kept {len(pack(root, RUNS_ARCHIVE, prof.name))} new records and probes in {RUNS_ARCHIVE}")
    text = json.dumps(payload, indent=1, default=float) + "\n"
    if pilot:
        from posttrain.real_checks.suite import PILOT_FILE, pilot_record

        old = json.loads(PILOT_FILE.read_text()) if PILOT_FILE.is_file() else {}
        PILOT_FILE.write_text(json.dumps({**old, **pilot_record(payload)}, indent=1) + "\n")
        console.print(f"pilot recorded in {PILOT_FILE}")
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "real_results.json").write_text(text)
    if update_docs:
        from posttrain.real_checks.outputs import REAL_RESULTS
        from posttrain.real_checks.outputs import update_docs as rewrite

        repo = Path(__file__).resolve().parents[2]
        stored = repo / REAL_RESULTS
        stored.write_text(text) if out is None else shutil.copyfile(Path(out) / "real_results.json", stored)
        for path in rewrite(payload, repo):
            console.print(f"rewrote {path.relative_to(repo)}")
    return 1 if any(e["verdict"] == "error" for e in payload["experiments"]) else 0
