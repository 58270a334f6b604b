"""What ``posttrain eval PATH`` evaluates: any run directory, checkpoint or model directory, verified first.

- A run directory (it holds ``config.yaml``): its ES endpoint ``es/`` when there is one (written last), else its
  newest intact checkpoint (newer corrupt ones are skipped with a warning, never renamed: eval only reads),
  else ``initial/``, the policy before RL (a run interrupted before its first checkpoint).
- A checkpoint directory (``step_N/``, or its ``model/``): that checkpoint.
- A model directory (``config.json``, or a LoRA adapter's ``adapter_config.json``): that model.

Everything a run wrote (a checkpoint, ``initial/``, ``es/``) and any directory with a ``checksums.json`` is
verified before it is loaded (`posttrain.llm.train.rundir.verify_checksums`): a missing or invalid manifest,
an unlisted or changed file, or a symbolic link refuses it. A model directory outside any run, without a
manifest, is evaluated as it is (nothing vouches for it, nothing can be checked).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from posttrain.errors import DomainError
from posttrain.llm.train.checkpoint import intact_checkpoint
from posttrain.llm.train.rundir import CHECKSUMS, verify_checksums

__all__ = ["EvalTarget", "eval_target", "run_of"]

_MODEL_FILES = ("config.json", "adapter_config.json")
_RUN_MODELS = ("initial", "es")


@dataclass(frozen=True)
class EvalTarget:
    """The model directory to load, the run it belongs to (its ``config.yaml`` and ``eval.jsonl``), and why it was chosen."""

    model_dir: Path
    run_dir: Path | None
    note: str = ""


def _is_model(path: Path) -> bool:
    return any((path / name).is_file() for name in _MODEL_FILES)


def run_of(model_dir: Path) -> Path | None:
    """The run directory above a model directory (``RUN/initial``, ``RUN/checkpoints/step_N/model``, ``RUN/es``):
    the nearest of its parents, up to three levels, with a ``config.yaml``."""
    for parent in list(model_dir.absolute().parents)[:3]:
        if (parent / "config.yaml").is_file():
            return parent
    return None


def _owner(model_dir: Path) -> Path:
    """The directory whose manifest covers ``model_dir``: its checkpoint for ``step_N/model``, else itself."""
    parent = model_dir.parent
    return parent if model_dir.name == "model" and (parent / "state.pt").is_file() else model_dir


def _verify(model_dir: Path, run_dir: Path | None) -> None:
    owner = _owner(model_dir)
    written_by_run = owner != model_dir or (
        run_dir is not None and owner.name in _RUN_MODELS and owner.absolute().parent == run_dir.absolute()
    )
    if written_by_run or os.path.lexists(owner / CHECKSUMS):
        reason = verify_checksums(owner)
        if reason is not None:
            raise DomainError(f"CHECKPOINT: {owner} fails verification ({reason}); it is not evaluated")


def _in_run(run: Path) -> EvalTarget:
    es = run / "es"
    if _is_model(es):
        return EvalTarget(es, run, "the ES endpoint es/")
    ckpt = intact_checkpoint(run / "checkpoints")
    if ckpt is not None:
        return EvalTarget(ckpt / "model", run, f"its newest intact checkpoint, {ckpt.name}")
    if _is_model(run / "initial"):
        return EvalTarget(run / "initial", run, "no checkpoint yet: initial/, the policy before RL")
    raise DomainError(
        f"CHECKPOINT: {run} holds no checkpoint, es/ or initial/ to evaluate (the run stopped before saving a model)"
    )


def eval_target(path: Path) -> EvalTarget:
    """The verified model directory to evaluate for ``path`` (see the module docstring).

    Raises:
        DomainError: ``path`` is none of a run, checkpoint or model directory; it holds no model yet; or the
            chosen directory fails verification.
    """
    if (path / "config.yaml").is_file() and not _is_model(path):
        target = _in_run(path)
    elif _is_model(path / "model"):  # a checkpoint (a LoRA one holds its adapter)
        target = EvalTarget(path / "model", run_of(path / "model"))
    elif _is_model(path):
        target = EvalTarget(path, run_of(path))
    else:
        raise DomainError(f"CHECKPOINT: {path} is not a run directory, a checkpoint or a model directory")
    _verify(target.model_dir, target.run_dir)
    return target
