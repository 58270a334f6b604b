"""A run directory belongs to one run: claiming it, resuming it with a compatible config, atomic files, checksums.

- `check_run_dir` (read only, every rank) refuses a second run in a directory that holds one
  unless ``resume`` (the config must equal the run's ``config.yaml`` except in `RESUMABLE_KEYS`)
  or ``overwrite`` (the old run's files are removed by `claim_run_dir`).
- `atomic_write_text` and `atomic_directory` write a file or a directory under a
  temporary name in the same folder, fsync it and ``os.replace`` it into place: a process killed
  mid-write leaves the previous version (or nothing), never a torn one.
- `write_checksums` / `verify_checksums`: SHA-256 of every file of a saved directory in
  ``checksums.json``; a flipped byte or a truncated file is found before anything is loaded, and so is a
  directory that cannot be vouched for: no manifest, a manifest of the wrong shape or naming a path
  outside the directory, a symbolic link, a file the manifest does not list.
- Nothing a run writes follows a symbolic link out of its directory: a run file that is a link (even a
  dangling one) marks the directory as holding a run, a resume refuses it, ``--overwrite`` removes the link
  itself; temporary files are created exclusively and appends (`append_jsonl`) refuse links.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from posttrain.errors import DomainError

__all__ = [
    "CHECKSUMS",
    "RESUMABLE_KEYS",
    "RUN_FILES",
    "RunDirError",
    "RunDirWarning",
    "append_jsonl",
    "append_text",
    "atomic_directory",
    "atomic_write_text",
    "check_run_dir",
    "claim_run_dir",
    "remove_run_files",
    "verify_checksums",
    "write_checksums",
]

RUN_FILES = (
    "config.yaml", "metrics.jsonl", "metrics.set-aside.jsonl", "es_metrics.jsonl", "sft_metrics.jsonl", "eval.jsonl",
    "curves.png", "initial", "tiny", "checkpoints", "es", "tensorboard", "wandb",
)  # fmt: skip
"""What a run writes in its directory (``--overwrite`` removes exactly these). Any of them present, even as a
dangling symbolic link, means the directory holds a run."""

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


def _unlink_stale(path: Path) -> None:
    """Remove what a killed writer (or anyone) left at a temporary name: a link itself, never its target."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder, fsync'd, then ``os.replace``d.

    The temporary file is created exclusively (``O_EXCL | O_NOFOLLOW``): a link planted at its name is removed,
    never written through; ``os.replace`` replaces a link at ``path`` itself, not its target.
    """
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    _unlink_stale(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with open(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def append_text(path: str | Path, text: str) -> None:
    """Append ``text`` to ``path`` (created if missing), never through a symbolic link.

    Raises ``RunDirError`` when ``path`` is a link (a run writes only inside its directory).
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if path.is_symlink():
            raise RunDirError(f"{path} is a symbolic link; a run writes only inside its directory") from None
        raise RunDirError(f"{path}: cannot append ({exc})") from exc
    with open(fd, "a") as f:
        f.write(text)


def append_jsonl(path: str | Path, row: Mapping[str, Any]) -> None:
    """Append ``row`` as one JSON line to ``path`` (`append_text`: never through a link)."""
    append_text(path, json.dumps(dict(row)) + "\n")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
        os.fsync(f.fileno())  # the bytes hashed are the bytes on disk once the directory is renamed
    return h.hexdigest()


def _walk(directory: Path) -> tuple[list[str], str | None]:
    """The relative POSIX names of the files under ``directory`` (its manifest excluded), sorted, without
    following links; or ``([], reason)`` when an entry is a symbolic link (it may point out of the directory)."""
    names = []
    for root, dirs, files in os.walk(directory, followlinks=False):
        for name in sorted(dirs + files):
            path = Path(root, name)
            if path.is_symlink():
                return [], f"{path.relative_to(directory).as_posix()} is a symbolic link"
        names += [Path(root, n).relative_to(directory).as_posix() for n in files]
    return sorted(n for n in names if n != CHECKSUMS), None


def write_checksums(directory: str | Path) -> None:
    """``directory/checksums.json``: ``{relative path: [size, sha256]}`` of every file under it.

    Raises ``RunDirError`` when the directory holds a symbolic link (its target is not the run's to vouch for).
    """
    d = Path(directory)
    names, reason = _walk(d)
    if reason is not None:
        raise RunDirError(f"{d}: {reason}; a saved directory holds plain files only")
    table = {name: [(d / name).stat().st_size, _digest(d / name)] for name in names}
    (d / CHECKSUMS).write_text(json.dumps(table, indent=1, sort_keys=True))


_SHA256 = re.compile(r"[0-9a-f]{64}")
_MAX_MANIFEST_BYTES = 1 << 24


def _manifest_entries(table: Any) -> dict[str, tuple[int, str]] | str:
    """The entries of a parsed manifest, or the reason it is not one: a mapping of relative POSIX file names
    (no ``..``, no absolute path) to ``[size, sha256]`` pairs, listing at least one file."""
    if not isinstance(table, dict):
        return f"{CHECKSUMS}: expected a mapping of file names to [size, sha256], got {type(table).__name__}"
    if not table:
        return f"{CHECKSUMS} lists no file"
    entries: dict[str, tuple[int, str]] = {}
    for name, entry in table.items():
        parts = PurePosixPath(name).parts
        if not name or "\\" in name or name.startswith("/") or any(p in ("..", ".") for p in parts):
            return f"{CHECKSUMS}: {name!r} names a file outside the directory"
        size, digest = entry if isinstance(entry, list) and len(entry) == 2 else (None, None)
        if not (isinstance(size, int) and not isinstance(size, bool) and size >= 0) or not (
            isinstance(digest, str) and _SHA256.fullmatch(digest)
        ):
            return f"{CHECKSUMS}: entry {name!r} is {entry!r}, expected [size, sha256]"
        entries[PurePosixPath(name).as_posix()] = (size, digest)
    return entries


def verify_checksums(directory: str | Path) -> str | None:
    """None when ``checksums.json`` is a valid manifest and the directory holds exactly the files it lists,
    each with its size and hash; else the reason (never an exception for a bad manifest or file).

    Not intact: no manifest (nothing vouches for the bytes), a manifest of the wrong shape (`_manifest_entries`),
    a symbolic link anywhere in the directory, a file the manifest does not list (a loader's ``*.safetensors``
    glob would read it), a missing, resized or changed file.
    """
    d = Path(directory)
    listing = d / CHECKSUMS
    if d.is_symlink() or listing.is_symlink():
        return f"{d.name if d.is_symlink() else CHECKSUMS} is a symbolic link"
    if not listing.is_file():
        return f"no {CHECKSUMS}"
    try:
        if listing.stat().st_size > _MAX_MANIFEST_BYTES:
            return f"{CHECKSUMS} is larger than {_MAX_MANIFEST_BYTES} bytes"
        table = json.loads(listing.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        return f"{CHECKSUMS} unreadable ({type(exc).__name__}: {exc})"
    entries = _manifest_entries(table)
    if isinstance(entries, str):
        return entries
    names, reason = _walk(d)
    if reason is not None:
        return reason
    unlisted = sorted(set(names) - set(entries))
    if unlisted:
        return f"{unlisted[0]} is not in {CHECKSUMS}"
    for name, (size, digest) in sorted(entries.items()):
        p = d / name
        if name not in names:
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
        _unlink_stale(stale)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    tmp.mkdir()
    try:
        yield tmp
        write_checksums(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if os.path.lexists(final):  # a link at final is moved aside and unlinked, its target left alone
        old = final.parent / f".old-{final.name}-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        _unlink_stale(old)
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
    """The run files in ``out``; a dangling link counts (it names a run's file, and a write would follow it)."""
    return [name for name in RUN_FILES if os.path.lexists(out / name)]


def _links(out: Path) -> list[str]:
    return [name for name in RUN_FILES if (out / name).is_symlink()]


def check_run_dir(out: str | Path, cfg: Any, *, resume: bool, overwrite: bool) -> dict[str, tuple[Any, Any]]:
    """Whether this run may use ``out``; returns the resumable keys whose value changes (``{key: (old, new)}``).

    Raises:
        RunDirError: ``out`` holds a run and neither ``resume`` nor ``overwrite`` is set; both are set;
            ``resume`` with a config that differs from the run's ``config.yaml`` outside
            `RESUMABLE_KEYS` (the message lists the keys and both values); ``resume`` into a directory whose
            run files include a symbolic link (its writes would land outside the run).
    """
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
    linked = _links(out)
    if linked:
        raise RunDirError(
            f"--resume: {out / linked[0]} is a symbolic link; a run writes only inside its directory "
            "(replace the link by the file, or start over with --overwrite)"
        )
    from posttrain.llm.config import config_from_dict, config_to_dict

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
        remove_run_files(out)
    saved = out / "config.yaml"
    previous = saved.read_text() if saved.is_file() else ""
    atomic_write_text(saved, config_text(cfg, changes, previous=previous))


def remove_run_files(out: str | Path) -> None:
    """Remove the `RUN_FILES` of ``out``: a symbolic link is unlinked, never followed (its target is not the run's)."""
    out = Path(out)
    for name in _existing(out):
        target = out / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()


def warn(message: str) -> None:
    """A `RunDirWarning` (shown once per message on stderr)."""
    warnings.warn(message, RunDirWarning, stacklevel=3)
