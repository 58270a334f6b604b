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
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["RUNS_ARCHIVE", "drop_weightless", "pack", "restore"]

RUNS_ARCHIVE = Path(__file__).resolve().parents[2] / "docs" / "paper_checks" / "real_runs"
"""Where the repository keeps the full profile's finished records (`pack`, `restore`)."""


def _write_gz(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:  # mtime 0: same bytes
        gz.write(text.encode())
    tmp.replace(path)


def pack(root: str | Path, archive: str | Path, profile: str) -> list[str]:
    """Copy the finished records and probes of ``profile`` under ``root`` into ``archive``; returns the keys added.

    A key already in the archive is left as it is (a run's record does not change once written).
    """
    src, dst = Path(root) / profile, Path(archive) / profile
    added = []
    for record in sorted(src.glob("*/record.json")):
        key = record.parent.name
        target = dst / f"{key}.json.gz"
        if not target.is_file():
            _write_gz(target, record.read_text())
            added.append(key)
    for probe in sorted(src.glob("probes/*/probe.json")):
        target = dst / "probes" / f"{probe.parent.name}.json"
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(probe.read_text())
            added.append(probe.parent.name)
    return added


def restore(archive: str | Path, root: str | Path, profile: str) -> list[str]:
    """Put the archived records and probes of ``profile`` under ``root`` where none is; returns the keys restored."""
    src, dst = Path(archive) / profile, Path(root) / profile
    restored = []
    for packed in sorted(src.glob("*.json.gz")):
        key = packed.name.removesuffix(".json.gz")
        target = dst / key / "record.json"
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(gzip.decompress(packed.read_bytes()).decode())
            restored.append(key)
    for probe in sorted(src.glob("probes/*.json")):
        target = dst / "probes" / probe.stem / "probe.json"
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(probe.read_text())
            restored.append(probe.stem)
    return restored


def drop_weightless(runner: Any, needed: Iterable[tuple[str, int]]) -> list[str]:
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
    """``python -m posttrain.real_checks.archive pack|restore ROOT [PROFILE]``: `pack` into or `restore` from the repository's archive."""
    if len(argv) not in (2, 3) or argv[0] not in ("pack", "restore"):
        print("usage: python -m posttrain.real_checks.archive pack|restore ROOT [PROFILE (default full)]")
        return 2
    profile = argv[2] if len(argv) == 3 else "full"
    done = pack(argv[1], RUNS_ARCHIVE, profile) if argv[0] == "pack" else restore(RUNS_ARCHIVE, argv[1], profile)
    print(json.dumps({argv[0]: done}, indent=1))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
