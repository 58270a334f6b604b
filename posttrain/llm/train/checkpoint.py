"""Atomic, checksummed checkpoints: a directory written under a temporary name, then renamed.

``<run>/checkpoints/step_000010/`` holds ``model/`` (``save_pretrained`` model + tokenizer, so
``posttrain eval`` and ``from_pretrained`` load it directly), ``state.pt`` (optimizer,
scheduler, RNG states, step, data position) and ``checksums.json`` (size and SHA-256 of every file).
Everything is first written to ``.tmp-step_000010-<pid>/`` in the same directory and renamed with
``os.replace`` once complete (`posttrain.llm.train.rundir.atomic_directory`), so a process
killed mid-write leaves only a temporary directory, which `latest_checkpoint` ignores and the
next save removes. `intact_checkpoint` is the newest checkpoint whose files match their
checksums; a corrupt one (a flipped byte, a truncated file, and equally one whose ``checksums.json`` is
missing or invalid: nothing vouches for its bytes) is set aside as ``.corrupt-step_*`` with a warning and
the previous one is used.

`save_training_state` and `load_training_state` add what a trainer needs on top: the
optimizer (under FSDP2 the gathered full weights and full optimizer state, written by rank 0; on
resume every rank keeps its shards) and the check that the weights match the model;
`truncate_metrics` drops the ``metrics.jsonl`` rows of steps after a resumed checkpoint (and sets aside the
lines it cannot read).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from posttrain.llm.policy import load_policy_weights, save_policy
from posttrain.llm.train.rundir import append_text, atomic_directory, atomic_write_text, verify_checksums, warn

__all__ = [
    "as_tuple",
    "complete_checkpoints",
    "intact_checkpoint",
    "latest_checkpoint",
    "load_state",
    "load_training_state",
    "save_checkpoint",
    "save_training_state",
    "set_aside",
    "truncate_metrics",
]

_NAME = re.compile(r"^step_(\d{6,})$")


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
    with atomic_directory(final) as tmp:  # checksums written, files fsync'd, then renamed
        save_policy(model, tmp / "model", weights=weights)  # a LoRA policy: its adapter (or merged weights)
        tokenizer.save_pretrained(tmp / "model")
        with open(tmp / "state.pt", "wb") as f:
            torch.save(state, f)
    done = sorted(p for p in root.iterdir() if _NAME.match(p.name))
    for old in done[: max(len(done) - keep, 0)]:  # renamed first: a kill mid-delete leaves no half checkpoint
        doomed = root / f".tmp-{old.name}-pruned"
        os.replace(old, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    return final


def complete_checkpoints(root: str | Path) -> list[Path]:
    """The complete checkpoints under ``root`` by increasing step (temporary and set-aside directories ignored)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if _NAME.match(p.name) and (p / "state.pt").is_file())


def latest_checkpoint(root: str | Path) -> Path | None:
    """The complete checkpoint with the highest step under ``root`` (temporary directories ignored)."""
    done = complete_checkpoints(root)
    return done[-1] if done else None


def set_aside(checkpoint: str | Path, reason: str) -> None:
    """Rename a corrupt checkpoint to ``.corrupt-<name>`` (kept for inspection, never loaded or pruned) and warn."""
    ckpt = Path(checkpoint)
    aside = ckpt.parent / f".corrupt-{ckpt.name}"
    if aside.exists():
        shutil.rmtree(aside)
    os.replace(ckpt, aside)
    warn(f"checkpoint {ckpt.name} is corrupt ({reason}); set aside as {aside.name}, falling back to the previous one")


def intact_checkpoint(root: str | Path, *, set_aside_corrupt: bool = False) -> Path | None:
    """The newest complete checkpoint whose files match ``checksums.json``; newer corrupt ones are skipped with a
    warning (and renamed by `set_aside` when ``set_aside_corrupt``)."""
    for ckpt in reversed(complete_checkpoints(root)):
        reason = verify_checksums(ckpt)
        if reason is None:
            return ckpt
        if set_aside_corrupt:
            set_aside(ckpt, reason)
        else:
            warn(f"checkpoint {ckpt.name} is corrupt ({reason}); falling back to the previous one")
    return None


def load_state(checkpoint: str | Path) -> dict[str, Any]:
    """The ``state.pt`` mapping of a checkpoint (plain tensors and Python objects)."""
    return torch.load(Path(checkpoint) / "state.pt", map_location="cpu", weights_only=True)  # type: ignore[no-any-return]


def save_training_state(
    root: str | Path,
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    keep: int,
    rank: int,
    modules: tuple[torch.nn.Module, ...] = (),
) -> Path | None:
    """Checkpoint ``model`` (bare, DDP-wrapped or FSDP2-sharded), ``optimizer`` and ``state`` from rank 0.

    ``modules``: an algorithm's own trainable modules (their state dicts go in ``state["modules"]``, their
    parameters are in ``optimizer``). Under FSDP2 every rank first joins the gathering of the full weights
    and optimizer state (collectives); only rank 0 writes. Returns the checkpoint's path on rank 0, else None.
    """
    from posttrain.llm.train.parallel import full_optimizer_state, full_state_dict, is_sharded

    weights = None
    if is_sharded(model):
        weights, optim_state = full_state_dict(model), full_optimizer_state(model, optimizer, modules=modules)
    else:
        optim_state = optimizer.state_dict()
    if rank != 0:
        return None
    policy = getattr(model, "module", model)
    return save_checkpoint(
        root, step, model=policy, tokenizer=tokenizer, keep=keep, weights=weights,
        state={**state, "modules": [m.state_dict() for m in modules], "optimizer": optim_state},
    )  # fmt: skip


def load_training_state(
    checkpoint: str | Path, *, model: Any, optimizer: torch.optim.Optimizer, modules: tuple[torch.nn.Module, ...] = ()
) -> dict[str, Any]:
    """Load a checkpoint's weights into ``model`` and ``modules`` and its optimizer state into ``optimizer``;
    return ``state.pt``.

    The modules are loaded before the optimizer (a lazy module's parameters then have their shapes).
    Under FSDP2 every rank reads the full weights and keeps its shards. Raises ``ValueError`` when
    the weights do not match the model (a tied ``lm_head.weight`` may be absent) or the number of
    modules differs from the checkpoint's.
    """
    from safetensors.torch import load_file

    from posttrain.llm.train.parallel import is_sharded, load_full_optimizer_state, load_full_state_dict

    ckpt = Path(checkpoint)
    weights: dict[str, Any] = {}
    for shard in sorted((ckpt / "model").glob("*.safetensors")):
        weights.update(load_file(str(shard)))
    policy = getattr(model, "module", model)
    sharded = is_sharded(model)
    result = load_full_state_dict(model, weights) if sharded else load_policy_weights(policy, ckpt / "model", weights)
    tied = {"lm_head.weight"} if getattr(policy.config, "tie_word_embeddings", False) else set()
    if result.unexpected_keys or set(result.missing_keys) - tied:
        raise ValueError(f"checkpoint {ckpt} does not match the model: {result}")
    state = load_state(ckpt)
    for module, module_state in zip(modules, state.get("modules", []), strict=True):
        module.load_state_dict(module_state)
    if sharded:
        load_full_optimizer_state(model, optimizer, state["optimizer"], modules=modules)
    else:
        optimizer.load_state_dict(state["optimizer"])
    return state


SET_ASIDE = "metrics.set-aside.jsonl"
"""Where a resume puts the ``metrics.jsonl`` lines it cannot read (beside it, for inspection)."""


def _step_of(line: str) -> int | None:
    """The step of a ``metrics.jsonl`` line, or None when the line is not a JSON object with a positive integer
    ``step`` (a write cut short by a kill, or a line someone else wrote)."""
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):
        return None
    step = row.get("step") if isinstance(row, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 1 else None


def truncate_metrics(path: str | Path, step: int) -> None:
    """Drop the rows of ``metrics.jsonl`` logged after ``step`` (a resumed run logs them again), atomically.

    A line that is not a JSON object with a positive integer ``step`` (the last write of a killed run, cut
    short; a list, a string, ``"step": "2"``) is set aside with a warning: appended to
    ``metrics.set-aside.jsonl`` beside it, and left out of ``metrics.jsonl``.
    """
    path = Path(path)
    if not path.exists():
        return
    kept, bad = [], []
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        row_step = _step_of(line)
        if row_step is None:
            bad.append(line)
        elif row_step <= step:
            kept.append(line)
    if bad:
        append_text(path.with_name(SET_ASIDE), "".join(f"{ln}\n" for ln in bad))
        warn(
            f"{path}: set aside {len(bad)} line(s) that are not a JSON object with an integer step "
            f"(a write cut short by a kill?) in {SET_ASIDE}"
        )
    atomic_write_text(path, "".join(f"{ln}\n" for ln in kept))


def as_tuple(x: Any) -> Any:
    """Nested lists as nested tuples (``random.Random.setstate`` wants tuples; ``torch.load`` may return lists)."""
    return tuple(as_tuple(v) for v in x) if isinstance(x, list | tuple) else x
