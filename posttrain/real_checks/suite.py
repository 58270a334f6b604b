"""Running a selection of real-model experiments: probe, gate, run the arms (shared, cached), judge, record.

Order per experiment: *out of scope* and *blocked* are reported without running anything; the probe
mediators are measured on the base model (cached per task); an experiment whose probe misses the toy's
range is reported *regime not reached* without training its arms (``train_ungated`` trains them anyway,
for the verdict the gate withholds); otherwise its arms run for each planned seed (each arm once per
seed, however many experiments name it; see `posttrain.real_checks.runs`), the run mediators are read
from seed 0's records, and the experiment is judged (`posttrain.real_checks.experiment.judge`). The arms a run
mediator reads run first, for seed 0: when one such mediator misses the toy's range the experiment is reported
*regime not reached* without training its other arms (the verdict the full run would give). An
exception in one experiment is recorded as its *error*; the others still run. A teacher or an edit source whose
record was restored from the archive without its weights runs again before an arm that reads them
(`posttrain.real_checks.archive.drop_weightless`).
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posttrain.real_checks.archive import drop_weightless
from posttrain.real_checks.arm_table import ARMS
from posttrain.real_checks.arms import PILOT_OFFSET, RUN_CODE, Profile, arm_config, code_digest, git_commit, run_key
from posttrain.real_checks.experiment import RealExperiment, RealVerdict, judge
from posttrain.real_checks.gate import gate_rows
from posttrain.real_checks.probe import probe_metrics
from posttrain.real_checks.runs import Runner

__all__ = [
    "PILOT_FILE",
    "PILOT_SEEDS",
    "arms_of",
    "needed_runs",
    "pilot_record",
    "planned_seeds",
    "run_suite",
    "sample_plan",
    "seed_plan",
]


def arms_of(exps: Sequence[RealExperiment]) -> list[str]:
    """Every arm the experiments need, their dependencies included, dependencies first."""
    out: list[str] = []

    def add(name: str) -> None:
        for dep in ARMS[name].dependencies():
            add(dep)
        if name not in out:
            out.append(name)

    for e in exps:
        if not e.scope or e.context:
            for a in (*e.arms, *_gate_arms(e)):
                add(a)
    return out


def sample_plan(profile: Profile) -> dict[str, int]:
    """Held-out samples per prompt of each arm: the profile's coverage samples for an arm that any registered
    pass@k experiment reads, else its evaluation samples.

    Over every registered experiment, not the ones selected: a run's content key holds its evaluation, so a
    plan that followed the selection would give ``real-check 19`` and the whole suite two different GRPO runs
    (a suite run in parts would never find its cached runs).
    """
    from posttrain.real_checks import select_experiments

    every = select_experiments()
    out = {a: profile.eval_samples for a in arms_of(every)}
    for e in every:
        if e.coverage:
            out.update({a: profile.coverage_samples for a in e.arms})
    return out


PILOT_FILE = Path(__file__).resolve().parents[2] / "docs" / "paper_checks" / "real_pilot.json"
"""The recorded pilot (``posttrain real-check --pilot``): per experiment, its primary's pilot differences."""
PILOT_SEEDS = 3


def seed_plan(exp: RealExperiment, pilot: Path = PILOT_FILE) -> tuple[int, str]:
    """An experiment's planned seeds and why: from the recorded pilot when it has the experiment, else its default."""
    from posttrain.real_checks.plan import MIN_SEEDS, pilot_share, seeds_for_share

    record = json.loads(pilot.read_text()).get(exp.id) if pilot.is_file() else None
    if not record or exp.scope:
        return exp.seeds, exp.seed_reason
    p = pilot_share(record["differences"], record["margin"])
    n = max(MIN_SEEDS, seeds_for_share(p))
    return n, (f"power plan from the pilot (seeds {record['seeds'][0]}-{record['seeds'][-1]}, differences "
               f"{[round(x, 4) for x in record['differences']]}): P(d > margin) ~ {p:.2f} -> {n} seeds")  # fmt: skip


def planned_seeds(exp: RealExperiment, profile: Profile, seeds: int | None) -> int:
    """The seeds an experiment runs: its plan, an explicit override, capped by the profile (smoke, measure: 1)."""
    n = int(seeds) if seeds is not None else seed_plan(exp)[0]
    return min(n, profile.max_seeds) if profile.max_seeds is not None else n


def _probe(profile: Profile, runner: Runner, task: str, root: Path) -> dict[str, float]:
    """The probe metrics of the profile's base model on ``task`` (cached by the content key)."""
    from posttrain.llm.config import config_from_dict
    from posttrain.llm.run import as_plan, build_initial, training_task
    from posttrain.llm.tools.models import resolve_model_path
    from posttrain.real_checks.arms import Arm

    probe_arm = Arm(f"probe_{task}", task=task)
    tree = arm_config(profile, probe_arm, 0)
    size = {"prompts": profile.probe_prompts, "samples": profile.probe_samples}
    key = run_key(tree, probe_arm, depends={}, evaluation=size, code=(*RUN_CODE, "real_checks/probe.py"))
    folder = root / "probes" / f"{task}-{key}"
    cached = folder / "probe.json"
    if cached.is_file():
        return dict(json.loads(cached.read_text()))
    cfg = config_from_dict(tree)
    path = cfg.model.path
    if path and not cfg.data.sft_steps:
        model_dir = Path(str(resolve_model_path(path) or path))
    else:
        folder.mkdir(parents=True, exist_ok=True)
        model_dir = build_initial(cfg, folder / "run", training_task(as_plan(cfg)))
    out = probe_metrics(str(model_dir), cfg, prompts=size["prompts"], samples=size["samples"], seed=0)
    folder.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(out) + "\n")
    runner.log(f"probe {task}: p0 {out['p0']:.3f}, zero-variance groups {out['zero_variance_groups']:.2f}")
    return out


def _entry(exp: RealExperiment, n: int) -> dict[str, Any]:
    return {"id": exp.id, "title": exp.title, "card": exp.card.as_dict(), "seeds_planned": n,
            "seed_reason": seed_plan(exp)[1], "arms": list(exp.arms)}  # fmt: skip


def needed_runs(exp: RealExperiment, seeds: range) -> list[tuple[str, int]]:
    """The (arm, seed) runs an experiment reads: its arms for every seed, and for the first seed (the gate's) the
    arms its run mediators read that are not among them (a teacher's headroom reads the base)."""
    own = [(a, s) for s in seeds for a in exp.arms]
    if not seeds:
        return own
    return own + [(a, seeds[0]) for a in _gate_arms(exp) if a not in exp.arms]


def _missing_runs(exp: RealExperiment, runner: Runner, seeds: range) -> int:
    """How many of the experiment's (arm, seed) runs (`needed_runs`) have no finished record under the runner's root."""
    return sum(runner.cached(a, s) is None for a, s in needed_runs(exp, seeds))


def _judge_one(exp: RealExperiment, profile: Profile, runner: Runner, root: Path, seeds: range,
               train_ungated: bool, gate_only: bool, cached_only: bool = False) -> dict[str, Any]:  # fmt: skip
    entry = _entry(exp, len(seeds))
    if exp.scope:
        entry.update(verdict=RealVerdict.OUT_OF_SCOPE.value, reason=exp.scope)
        if exp.context and cached_only and _missing_runs(exp, runner, range(1)):
            return entry
        if exp.context and not gate_only:
            per_seed = [{a: runner.record(a, 0) for a in exp.arms}]
            entry["context"] = {f"{m} {a}": _metric(per_seed[0][a], m) for a, m in exp.context}
        return entry
    blocked = exp.needs()
    if blocked:
        entry.update(verdict=RealVerdict.BLOCKED.value, reason=blocked)
        return entry
    probes = {t: _probe(profile, runner, t, root) for t in exp.probe_tasks}
    early = [g for g in gate_rows([m for m in exp.card.mediators if m.source.value == "probe"], probes, {})
             if not g["inside"]]  # fmt: skip
    if early and not train_ungated:
        entry.update(verdict=RealVerdict.REGIME_NOT_REACHED.value, gate=gate_rows(exp.card.mediators, probes, {}),
                     probes=probes, reason="probe mediators outside the toy's range; arms not trained")  # fmt: skip
        return entry
    if gate_only:
        entry.update(verdict=RealVerdict.NOT_RUN.value, gate=gate_rows(exp.card.mediators, probes, {}), probes=probes,
                     reason="gate-only run: the probe mediators are in the toy's range; the arms are not trained yet")  # fmt: skip
        return entry
    if not cached_only:  # a restored teacher or edit source has a record but no weights (`archive`)
        drop_weightless(runner, needed_runs(exp, seeds))
    staged = None if train_ungated else _run_gate(exp, runner, probes, cached_only, seeds[0])
    if staged is not None:
        rows, read = staged
        entry.update(verdict=RealVerdict.REGIME_NOT_REACHED.value, gate=rows, probes=probes, cost=_cost([read], list(read)),
                     reason=f"run mediators on seed {seeds[0]} outside the toy's range (arms {', '.join(read)} "
                            f"run first); the other arms not trained")  # fmt: skip
        return entry
    missing = _missing_runs(exp, runner, seeds) if cached_only else 0
    if missing:
        total = len(needed_runs(exp, seeds))
        entry.update(verdict=RealVerdict.NOT_RUN.value, probes=probes, runs_cached=total - missing, runs_planned=total,
                     gate=gate_rows(exp.card.mediators, probes, _finished_gate_records(exp, runner, seeds[0])),
                     reason=f"the probe mediators are in the toy's range; {total - missing} of the {total} planned runs "
                            f"(arm x seed) are finished, so no verdict yet")  # fmt: skip
        return entry
    per_seed = [{a: runner.record(a, s) for a in exp.arms} for s in seeds]
    first = {a: runner.record(a, seeds[0]) for a in _gate_arms(exp)}
    gate = gate_rows(exp.card.mediators, probes, {**first, **per_seed[0]})
    entry.update(judge(exp, per_seed, gate), gate=gate, probes=probes)
    entry["cost"] = _cost(per_seed, exp.arms)
    return entry


def _cost(per_seed: Sequence[dict[str, Any]], arms: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per arm, the CPU seconds of training and of held-out evaluation summed over the distinct runs the seeds read:
    a fixed-seed arm (a teacher) is one run, counted once however many evaluation seeds read its record."""

    def runs(arm: str) -> list[dict[str, Any]]:
        return list({r[arm].get("key", i): r[arm] for i, r in enumerate(per_seed)}.values())

    return {a: {f: sum(r.get(f, 0.0) for r in runs(a)) for f in ("train_cpu_s", "eval_cpu_s")} for a in arms}


def _gate_arms(exp: RealExperiment) -> list[str]:
    """The arms the experiment's run mediators read: the arguments of a ``"name:arg:arg"`` key that name one of its
    arms or a registered arm it does not compare (01 and 13 read the teacher's headroom over the base)."""
    names = [a for m in exp.card.mediators if m.source.value == "run" for a in m.key.split(":")[1:]
             if a in exp.arms or a in ARMS]  # fmt: skip
    return list(dict.fromkeys(names))


def _finished_gate_records(exp: RealExperiment, runner: Runner, seed: int) -> dict[str, Any]:
    """The records of the arms the run mediators read (`_gate_arms`) at ``seed`` when all of them are finished, else
    none: an experiment judged from the cache before all its runs are finished shows a run mediator its finished
    arms measure (a teacher shared with another experiment) and leaves the others *not measured* (`gate_rows`). A
    finished mediator outside the toy's range never gets here: `_run_gate` reports it first."""
    found = {a: runner.cached(a, seed) for a in _gate_arms(exp)}
    return found if found and None not in found.values() else {}


def _run_gate(
    exp: RealExperiment, runner: Runner, probes: dict[str, Any], cached_only: bool, seed: int = 0
) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """The gate rows and the records they read when a run mediator misses the toy's range on ``seed`` (the first
    planned), else None.

    Only the arms the run mediators read (`_gate_arms`) are run, for ``seed`` (from the cache in ``cached_only``
    mode, which gives None when one is missing). The final gate reads the same records and replaces any
    verdict with *regime not reached* when one row misses, so judging here first changes no verdict; it spares
    the arms that could not change it.
    """
    if cached_only:
        read = _finished_gate_records(exp, runner, seed)
    else:
        read = {a: runner.record(a, seed) for a in _gate_arms(exp)}
    if not read:
        return None
    rows = gate_rows(exp.card.mediators, probes, read)
    return (rows, read) if any(not g["inside"] for g in rows if g["source"] == "run") else None


def _metric(record: Any, name: str) -> float:
    from posttrain.real_checks.metrics import metric

    return metric(record, name)


def _naming_log(log: Callable[[str], None], names: dict[str, list[str]]) -> Callable[[str], None]:
    """``log`` with the arms a line's run belongs to: the runner names a run by its trainer method and content key
    (the OPD arm trains ``opd_then_rl``, a teacher ``grpo``), so a line ending in a key of ``names`` gets
    ``(arm A)`` appended, every arm that shares the key listed."""

    def emit(line: str) -> None:
        arms = names.get(line.rsplit(": ", 1)[-1])
        log(f"{line} (arm {', '.join(arms)})" if arms else line)

    return emit


def _arm_names(runner: Runner, seeds: range) -> dict[str, list[str]]:
    """Every registered arm's run key at ``seeds``, inverted: key -> the arms that share it (`_naming_log`)."""
    names: dict[str, list[str]] = {}
    for arm in ARMS:
        for seed in seeds:
            found = names.setdefault(runner.key(arm, seed), [])
            if arm not in found:
                found.append(arm)
    return names


def _prepare_model(profile: Profile) -> None:
    """Convert the profile's registered model (from its PyPI wheel) before any arm asks for it; `prepare_model`
    returns at once when it is converted already. A path, a hub id or the tiny model is left to the trainer, and
    a local directory of the registered name wins, as in `resolve_model_path`."""
    from posttrain.llm.tools.models import MODELS, prepare_model

    name = profile.base["model"].get("path")
    if isinstance(name, str) and name in MODELS and not Path(name).is_dir():
        prepare_model(name)


def run_suite(
    exps: Sequence[RealExperiment],
    profile: Profile,
    root: str | Path,
    *,
    seeds: int | None = None,
    train_ungated: bool = False,
    gate_only: bool = False,
    pilot: bool = False,
    cached_only: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run ``exps`` on ``profile`` with runs cached under ``root``; returns the results payload (``real_results.json``).

    ``gate_only``: probe and gate, train nothing (an experiment that passes is *not run*); ``pilot``: run
    `PILOT_SEEDS` seeds from `PILOT_OFFSET` (never evaluation seeds) for the seed plan; ``cached_only``:
    train nothing, judge the experiments whose planned runs are all finished under ``root`` and report the
    others as *not run* with the count of finished runs (a results file of a suite run in parts).
    """
    import os
    import platform

    import torch

    start, cpu = time.perf_counter(), time.process_time()
    _prepare_model(profile)
    folder = Path(root) / profile.name
    names: dict[str, list[str]] = {}
    runner = Runner(profile, ARMS, folder, samples=sample_plan(profile), log=_naming_log(log, names))
    entries = []
    for exp in exps:
        n = PILOT_SEEDS if pilot else planned_seeds(exp, profile, seeds)
        span = range(PILOT_OFFSET, PILOT_OFFSET + n) if pilot else range(n)
        names.update(_arm_names(runner, span))
        try:
            entries.append(_judge_one(exp, profile, runner, folder, span, train_ungated, gate_only, cached_only))
        except Exception as exc:
            entries.append({**_entry(exp, n), "verdict": RealVerdict.ERROR.value,
                            "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})  # fmt: skip
        log(f"{exp.id}: {entries[-1]['verdict']}")
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    meta = {"profile": profile.name, "model": profile.base["model"].get("path") or "tiny (built in code)",
            "code_digest": code_digest(), "commit": git_commit(), "host": platform.node(),
            "torch_threads": torch.get_num_threads(), "load_average_end": list(load),
            "wall_s": time.perf_counter() - start, "cpu_s": time.process_time() - cpu,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    mode = profile.name + (
        " (gate only)" if gate_only else " (pilot)" if pilot else " (cached runs)" if cached_only else ""
    )
    return {"mode": mode, "run": meta, "experiments": entries}


def pilot_record(payload: dict[str, Any]) -> dict[str, Any]:
    """The pilot file's content from a pilot run's payload: per experiment, its primary's differences and seeds."""
    out = {}
    for e in payload["experiments"]:
        rows = [c for c in e.get("comparisons", []) if c.get("role") == "primary"]
        if rows:
            out[e["id"]] = {"differences": rows[0]["differences"], "margin": rows[0]["margin"],
                            "seeds": list(range(PILOT_OFFSET, PILOT_OFFSET + len(rows[0]["differences"])))}  # fmt: skip
    return out
