"""A run directory belongs to one run: claiming it, resuming it with a compatible config, atomic files, checksums.

- `check_run_dir` (read only, every rank) refuses a second run in a directory that holds one
  unless ``resume`` (the config must equal the run's ``config.yaml`` except in `RESUMABLE_KEYS`)
  or ``overwrite`` (the old run's files are removed by `claim_run_dir`).
- `atomic_write_text` and `atomic_directory` write a file or a directory under a
  temporary name in the same folder, fsync it and ``os.replace`` it into place: a process killed
  mid-write leaves the previous version (or nothing), never a torn one.
- `write_checksums` / `verify_checksums`: SHA-256 of every file of a saved directory in
  ``checksums.json``; a flipped byte or a truncated file is found before anything is loaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from posttrain.errors import DomainError

__all__ = [
    "CHECKSUMS",
    "RESUMABLE_KEYS",
    "RUN_FILES",
    "RunDirError",
    "RunDirWarning",
    "atomic_directory",
    "atomic_write_text",
    "check_run_dir",
    "claim_run_dir",
    "verify_checksums",
    "write_checksums",
]

RUN_FILES = (
    "config.yaml", "metrics.jsonl", "es_metrics.jsonl", "sft_metrics.jsonl", "eval.jsonl",
    "initial", "tiny", "checkpoints", "es", "tensorboard", "wandb",
)  # fmt: skip
"""What a run writes in its directory (``--overwrite`` removes exactly these)."""

RESUMABLE_KEYS = (
    "optim.steps",
    "checkpoint.every",
    "checkpoint.keep",
    "logging.progress",
    "logging.tensorboard",
    "logging.wandb_project",
)
"""Config keys that ``--resume`` may change: how long to run, how often to save, where to log. Any other
change (a learning rate, the task, the method, the seed) would make the resumed run a different run."""

CHECKSUMS = "checksums.json"


class RunDirError(DomainError):
    """A run directory that this run may not use as asked (another run's files, an incompatible resume)."""


class RunDirWarning(UserWarning):
    """Something a resume repaired or skipped (a torn metrics line, a corrupt checkpoint)."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder, fsync'd, then ``os.replace``d."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
        os.fsync(f.fileno())  # the bytes hashed are the bytes on disk once the directory is renamed
    return h.hexdigest()


def _files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != CHECKSUMS)


def write_checksums(directory: str | Path) -> None:
    """``directory/checksums.json``: ``{relative path: [size, sha256]}`` of every file under it."""
    d = Path(directory)
    table = {str(p.relative_to(d)): [p.stat().st_size, _digest(p)] for p in _files(d)}
    (d / CHECKSUMS).write_text(json.dumps(table, indent=1, sort_keys=True))


def verify_checksums(directory: str | Path) -> str | None:
    """None when every file listed in ``checksums.json`` is present with its size and hash, else the reason.

    A directory without ``checksums.json`` (written before checksums existed) gives None: nothing to check.
    """
    d = Path(directory)
    listing = d / CHECKSUMS
    if not listing.is_file():
        return None
    try:
        table = json.loads(listing.read_text())
    except (OSError, ValueError) as exc:
        return f"{CHECKSUMS} unreadable ({exc})"
    for name, (size, digest) in sorted(table.items()):
        p = d / name
        if not p.is_file():
            return f"{name} is missing"
        if p.stat().st_size != size:
            return f"{name} has {p.stat().st_size} bytes, {size} were written"
        if _digest(p) != digest:
            return f"{name} fails its SHA-256 check"
    return None


@contextlib.contextmanager
def atomic_directory(final: str | Path) -> Iterator[Path]:
    """Yield a temporary directory beside ``final``; on success write its checksums and rename it to ``final``.

    A leftover ``.tmp-<name>-*`` directory (from a killed writer) is removed first; an existing
    ``final`` is replaced. On an exception the temporary directory is removed and nothing changes.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".tmp-{final.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    tmp.mkdir()
    try:
        yield tmp
        write_checksums(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        old = final.parent / f".old-{final.name}-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(final.parent)


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and name.count(".") < 1:  # sections, not option mappings
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = value
    return out


def _existing(out: Path) -> list[str]:
    return [name for name in RUN_FILES if (out / name).exists()]


def check_run_dir(out: str | Path, cfg: Any, *, resume: bool, overwrite: bool) -> dict[str, tuple[Any, Any]]:
    """Whether this run may use ``out``; returns the resumable keys whose value changes (``{key: (old, new)}``).

    Raises:
        RunDirError: ``out`` holds a run and neither ``resume`` nor ``overwrite`` is set; both are set;
            or ``resume`` with a config that differs from the run's ``config.yaml`` outside
            `RESUMABLE_KEYS` (the message lists the keys and both values).
    """
    from posttrain.llm.config import config_from_dict, config_to_dict

    out = Path(out)
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite: choose one (continue the run, or replace it)")
    found = _existing(out)
    if not found or overwrite:
        return {}
    if not resume:
        raise RunDirError(
            f"--out {out}: the directory already holds a run ({', '.join(found)}); pass --resume to continue it, "
            "--overwrite to replace it, or choose another --out"
        )
    saved = out / "config.yaml"
    if not saved.is_file():
        raise RunDirError(f"--resume: {out} holds {', '.join(found)} but no config.yaml to check the config against")
    try:
        old = config_to_dict(config_from_dict(yaml.safe_load(saved.read_text())))
    except (DomainError, yaml.YAMLError) as exc:
        raise RunDirError(f"--resume: the run's {saved} no longer loads ({exc})") from None
    a, b = _flat(old), _flat(config_to_dict(cfg))
    changed = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
    refused = [k for k in changed if k not in RESUMABLE_KEYS]
    if refused:
        diffs = "; ".join(f"{k}: {changed[k][0]!r} -> {changed[k][1]!r}" for k in refused)
        raise RunDirError(
            f"--resume: the config differs from the run's config.yaml in {diffs}. Only "
            f"{', '.join(RESUMABLE_KEYS)} may change on resume; use another --out (or --overwrite) for a new run"
        )
    return changed


def config_text(cfg: Any, changes: Mapping[str, tuple[Any, Any]] | None = None, *, previous: str = "") -> str:
    """``config.yaml``: the config, after the comment lines of earlier resumes and one for ``changes``."""
    from posttrain.llm.config import config_to_dict

    history = [ln for ln in previous.splitlines() if ln.startswith("# resumed")]
    if changes:
        history.append("# resumed with " + ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changes.items()))
    head = "".join(f"{ln}\n" for ln in history)
    return head + yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


def claim_run_dir(out: str | Path, cfg: Any, changes: Mapping[str, tuple[Any, Any]], *, overwrite: bool) -> None:
    """Rank 0, after `check_run_dir`: remove an overwritten run's files, write ``config.yaml`` atomically
    (a resume's changed keys are recorded as a ``# resumed with ...`` comment line at its top)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for name in _existing(out):
            target = out / name
            shutil.rmtree(target) if target.is_dir() else target.unlink()
    saved = out / "config.yaml"
    previous = saved.read_text() if saved.is_file() else ""
    atomic_write_text(saved, config_text(cfg, changes, previous=previous))


def warn(message: str) -> None:
    """A `RunDirWarning` (shown once per message on stderr)."""
    warnings.warn(message, RunDirWarning, stacklevel=3)
