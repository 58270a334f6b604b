"""Atomic checkpoints: a directory written under a temporary name, then renamed.

``<run>/checkpoints/step_000010/`` holds ``model/`` (``save_pretrained`` model + tokenizer, so
``posttrain eval`` and ``from_pretrained`` load it directly) and ``state.pt`` (optimizer,
scheduler, RNG states, step, data position). Everything is first written to
``.tmp-step_000010-<pid>/`` in the same directory and renamed with ``os.replace`` once complete,
so a process killed mid-write leaves only a temporary directory, which :func:`latest_checkpoint`
ignores and the next save removes.

:func:`save_training_state` and :func:`load_training_state` add what a trainer needs on top: the
optimizer (under FSDP2 the gathered full weights and full optimizer state, written by rank 0; on
resume every rank keeps its shards) and the check that the weights match the model;
:func:`truncate_metrics` drops the ``metrics.jsonl`` rows of steps after a resumed checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "as_tuple",
    "latest_checkpoint",
    "load_state",
    "load_training_state",
    "save_checkpoint",
    "save_training_state",
    "truncate_metrics",
]

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
    result = load_full_state_dict(model, weights) if sharded else policy.load_state_dict(weights, strict=False)
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


def truncate_metrics(path: str | Path, step: int) -> None:
    """Drop the rows of ``metrics.jsonl`` logged after ``step`` (a resumed run logs them again)."""
    path = Path(path)
    if path.exists():
        kept = [ln for ln in path.read_text().splitlines() if json.loads(ln).get("step", 0) <= step]
        path.write_text("".join(f"{ln}\n" for ln in kept))


def as_tuple(x: Any) -> Any:
    """Nested lists as nested tuples (``random.Random.setstate`` wants tuples; ``torch.load`` may return lists)."""
    return tuple(as_tuple(v) for v in x) if isinstance(x, list | tuple) else x
