"""Atomic checkpoints: a directory written under a temporary name, then renamed.

``<run>/checkpoints/step_000010/`` holds ``model/`` (``save_pretrained`` model + tokenizer, so
``posttrain eval`` and ``from_pretrained`` load it directly) and ``state.pt`` (optimizer,
scheduler, RNG states, step, data position). Everything is first written to
``.tmp-step_000010-<pid>/`` in the same directory and renamed with ``os.replace`` once complete,
so a process killed mid-write leaves only a temporary directory, which :func:`latest_checkpoint`
ignores and the next save removes.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

__all__ = ["latest_checkpoint", "load_state", "save_checkpoint"]

_NAME = re.compile(r"^step_(\d{6,})$")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    root: str | Path,
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    state: dict[str, Any],
    keep: int = 2,
    weights: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write checkpoint ``step`` under ``root`` atomically and prune to the ``keep`` latest; return its path.

    ``weights``: the full state dict to save instead of ``model.state_dict()`` (a sharded model's
    gathered weights), written by ``model.save_pretrained`` so ``from_pretrained`` loads it.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-step_*"):
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp-step_{step:06d}-{os.getpid()}"
    model.save_pretrained(tmp / "model", state_dict=weights)
    tokenizer.save_pretrained(tmp / "model")
    with open(tmp / "state.pt", "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    done = sorted(p for p in root.iterdir() if _NAME.match(p.name))
    for old in done[: max(len(done) - keep, 0)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: str | Path) -> Path | None:
    """The complete checkpoint with the highest step under ``root`` (temporary directories ignored)."""
    root = Path(root)
    if not root.is_dir():
        return None
    done = sorted(p for p in root.iterdir() if _NAME.match(p.name) and (p / "state.pt").is_file())
    return done[-1] if done else None


def load_state(checkpoint: str | Path) -> dict[str, Any]:
    """The ``state.pt`` mapping of a checkpoint (plain tensors and Python objects)."""
    return torch.load(Path(checkpoint) / "state.pt", map_location="cpu", weights_only=True)  # type: ignore[no-any-return]
