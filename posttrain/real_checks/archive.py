"""The finished runs' records kept beside the results file, so that a suite run in parts resumes on another machine.

A run's ``record.json`` (`posttrain.real_checks.runs`) holds everything an experiment reads from it: the
training log, the first-update RMS, the timings and the held-out samples with their rewards. `pack` copies
each finished record under ``<root>/<profile>/<key>/`` to ``<archive>/<profile>/<key>.json.gz`` and each
cached probe to ``<archive>/<profile>/probes/<name>.json``; `restore` puts them back where the runner looks.
The key holds the run's config and the digest of the code that trains and scores it (`arms.run_key`), so
a record archived by other code is never read: its folder name is not asked for.

A record keeps no weights. An arm whose model another arm reads (``keep_model``: a teacher, an edit's
source) is restored as a record only; when an arm that reads its weights still has to run, `drop_weightless`
sets the record aside (``record.archived.json``) and the runner trains the source again.
"""

from __future__ import annotations

import gzip
import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from posttrain.llm.train.rundir import atomic_write_text

if TYPE_CHECKING:
    from posttrain.real_checks.runs import Runner

__all__ = ["RUNS_ARCHIVE", "cost", "drop_weightless", "pack", "restore"]

RUNS_ARCHIVE = Path(__file__).resolve().parents[2] / "docs" / "paper_checks" / "real_runs"
"""Where the repository keeps the full profile's finished records (`pack`, `restore`)."""


def _read(path: Path) -> str:
    return gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()


def _write(path: Path, text: str) -> None:
    """Write in one step (a temporary file, then a rename); gzipped with mtime 0 (the same bytes for the same text)
    when ``path`` ends in ``.gz``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix != ".gz":
        atomic_write_text(path, text)
        return
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_bytes(gzip.compress(text.encode(), mtime=0))
    tmp.replace(path)


def _copy_new(plan: Iterable[tuple[Path, Path, str]]) -> list[str]:
    """Copy each ``(source, target, name)`` whose target is absent (a finished record never changes); the names copied."""
    done = []
    for source, target, name in plan:
        if not target.is_file():
            _write(target, _read(source))
            done.append(name)
    return done


def pack(root: str | Path, archive: str | Path, profile: str) -> list[str]:
    """Copy the finished records and probes of ``profile`` under ``root`` into ``archive``; returns the keys added."""
    src, dst = Path(root) / profile, Path(archive) / profile
    records = [(r, dst / f"{r.parent.name}.json.gz", r.parent.name) for r in sorted(src.glob("*/record.json"))]
    probes = [
        (p, dst / "probes" / f"{p.parent.name}.json", p.parent.name) for p in sorted(src.glob("probes/*/probe.json"))
    ]
    return _copy_new(records + probes)


def restore(archive: str | Path, root: str | Path, profile: str) -> list[str]:
    """Put the archived records and probes of ``profile`` under ``root`` where none is; returns the keys restored."""
    src, dst = Path(archive) / profile, Path(root) / profile
    keys = [(g, g.name.removesuffix(".json.gz")) for g in sorted(src.glob("*.json.gz"))]
    records = [(g, dst / key / "record.json", key) for g, key in keys]
    probes = [(p, dst / "probes" / p.stem / "probe.json", p.stem) for p in sorted(src.glob("probes/*.json"))]
    return _copy_new(records + probes)


def cost(archive: str | Path, profile: str) -> dict[str, float]:
    """What the archived runs of ``profile`` cost by their own records, each run once (a run shared by several
    experiments is one record): ``runs``, ``cpu_h`` = sum of ``train_cpu_s + eval_cpu_s`` / 3600, ``wall_h`` = sum of
    ``train_s + eval.eval_s`` / 3600, and the per-run CPU minutes' median and 10% / 90% quantiles (NaN under 2 runs).
    """
    records = [json.loads(_read(g)) for g in sorted((Path(archive) / profile).glob("*.json.gz"))]
    cpu_min = [(r.get("train_cpu_s", 0.0) + r.get("eval_cpu_s", 0.0)) / 60 for r in records]
    wall_s = sum(r.get("train_s", 0.0) + r.get("eval", {}).get("eval_s", 0.0) for r in records)
    deciles = statistics.quantiles(cpu_min, n=10) if len(cpu_min) > 1 else [float("nan")] * 9
    return {"runs": len(records), "cpu_h": sum(cpu_min) / 60, "wall_h": wall_s / 3600,
            "cpu_min_median": deciles[4], "cpu_min_p10": deciles[0], "cpu_min_p90": deciles[8]}  # fmt: skip


def drop_weightless(runner: Runner, needed: Iterable[tuple[str, int]]) -> list[str]:
    """Set aside the records of ``keep_model`` arms that have no weights but whose weights a needed run reads.

    ``needed``: the (arm, seed) runs about to be asked for. A needed run that is not finished reads its
    dependencies' final weights (`Runner.final_model`); a dependency restored from the archive has a record
    but no ``final/``, so its record moves to ``record.archived.json`` and the runner trains it again.
    Returns the folders set aside.
    """
    moved = []
    for arm, seed in needed:
        if runner.cached(arm, seed) is not None:
            continue
        for dep in runner.arms[arm].dependencies():
            folder = runner.folder(dep, seed)
            record = folder / "record.json"
            if runner.arms[dep].keep_model and record.is_file() and not (folder / "final").is_dir():
                record.replace(folder / "record.archived.json")
                moved.append(folder.name)
            moved += drop_weightless(runner, [(dep, seed)])  # a dependency run again reads its own dependencies
    return moved


def main(argv: list[str]) -> int:
    """``python -m posttrain.real_checks.archive pack|restore ROOT [PROFILE]`` or ``... cost [PROFILE]``: `pack` into
    or `restore` from the repository's archive, or the archived runs' `cost`."""
    commands = {"pack": 2, "restore": 2, "cost": 1}
    if not argv or argv[0] not in commands or len(argv) not in (commands[argv[0]], commands[argv[0]] + 1):
        print("usage: python -m posttrain.real_checks.archive pack|restore ROOT [PROFILE] | cost [PROFILE]"
              " (PROFILE default full)")  # fmt: skip
        return 2
    profile = argv[commands[argv[0]]] if len(argv) > commands[argv[0]] else "full"
    if argv[0] == "cost":
        print(json.dumps(cost(RUNS_ARCHIVE, profile), indent=1))
        return 0
    done = pack(argv[1], RUNS_ARCHIVE, profile) if argv[0] == "pack" else restore(RUNS_ARCHIVE, argv[1], profile)
    print(json.dumps({argv[0]: done}, indent=1))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
