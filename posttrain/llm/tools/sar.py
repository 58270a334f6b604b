"""Post-hoc SAR edits and merges of checkpoint directories (safetensors in, safetensors out).

``edit_checkpoint(base_dir, [tuned_dir, ...], out_dir)`` applies, to every target linear weight,
$W = W_0 + \\sum_e \\alpha_e\\,\\mathrm{combine}(W_0, \\Delta_e)$ in float32 and writes a new
checkpoint: non-target tensors (embeddings, LM head, norms, biases) come from the base, as in the
official recipe (``keep_tuned_non_targets=True`` keeps the first tuned model's instead, an ablation);
config and tokenizer files come from the first tuned directory. The combine rule is ``sar``
(`posttrain.estimators.merging.sar_project`), or a merging baseline.

Precision (docs: methods/sar.md): RL deltas are ~1e-4..1e-3 of the weights, so casting to bf16 can
round the edit away; the report gives, per saved dtype, the fraction of target entries whose
saved value equals the saved base value although the edit changed them, and the relative error
of the realised delta. float16 is refused where a value exceeds 65504.

Output: a new directory written under a temporary name beside ``out_dir`` and renamed into place once
complete (with ``checksums.json``), so no stale weight shard or half-written file is ever left there and
nothing is written through a symbolic link in an old output. An existing non-empty ``out_dir`` needs
``overwrite`` (it is then replaced whole); it may not be, or hold, an input directory. The inputs are only
read. Non-finite weights in any input, and non-finite ``alphas``, are refused before anything is written.
Randomized SVD draws from its own seeded stream per tensor (``seed``), not the global RNG, so the same
inputs give the same bytes.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators.merging import sar_project, sar_rank, task_arithmetic_merge, ties_merge

__all__ = ["DEFAULT_TARGETS", "MERGE_METHODS", "EditReport", "edit_checkpoint", "load_weights"]

DEFAULT_TARGETS = (r"\.(q|k|v|o)_proj\.weight$", r"\.(gate|up|down)_proj\.weight$")
MERGE_METHODS = ("sar", "task_arithmetic", "average", "ties")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_FP16_MAX = 65504.0
_NOT_COPIED = {"model.safetensors.index.json", "checksums.json", "sar_report.json"}


@dataclass
class EditReport:
    """What an edit did: counts, storage, precision and verification numbers."""

    method: str
    targets: int = 0
    stored_factor_params: int = 0
    target_params: int = 0
    total_params: int = 0
    erased_fraction: float = 0.0
    delta_rel_error: float = 0.0
    randomized_check_rel_error: float | None = None
    seconds: float = 0.0
    per_tensor: dict[str, dict[str, float]] = field(default_factory=dict)


def load_weights(directory: str | Path, *, name: str = "directory") -> dict[str, Tensor]:
    """All tensors of a checkpoint directory's ``*.safetensors`` files (sharded or not).

    Raises ``DomainError`` naming ``name`` and the tensor when a floating-point tensor holds NaN or infinity.
    """
    from safetensors.torch import load_file

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise ShapeError(f"{name}: no *.safetensors file in {directory}")
    out: dict[str, Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    for key, w in out.items():
        if w.is_floating_point() and not bool(torch.isfinite(w).all()):
            raise DomainError(f"{name}: {directory} tensor {key} has non-finite values (NaN or infinity)")
    return out


def _check_output(out_dir: Path, inputs: Sequence[tuple[str, str | Path]], *, overwrite: bool) -> None:
    """Refuse an output that is, or holds, an input directory, and an existing non-empty one without ``overwrite``."""
    out = out_dir.resolve()
    for name, d in inputs:
        src = Path(d).resolve()
        if src == out:
            raise DomainError(f"out_dir: {out_dir} is {name}; writing there would overwrite the input weights")
        if out in src.parents:
            raise DomainError(f"out_dir: {out_dir} holds {name} ({d}); replacing it would delete the input")
    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        raise DomainError(f"out_dir: {out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise DomainError(f"out_dir: {out_dir} is not empty; pass --overwrite (overwrite=True) to replace it")


def _combine(method: str, w0: Tensor, deltas: list[Tensor], alphas: Sequence[float], sar_kwargs: dict) -> Tensor:
    if method == "sar":
        return sum(
            (a * sar_project(w0, d, **sar_kwargs) for a, d in zip(alphas, deltas, strict=True)), torch.zeros_like(w0)
        )
    if method == "task_arithmetic":
        return task_arithmetic_merge(w0, [a * d for a, d in zip(alphas, deltas, strict=True)]) - w0
    if method == "average":
        return task_arithmetic_merge(w0, deltas, scale=1.0 / len(deltas)) - w0
    return ties_merge(w0, deltas) - w0


def _cast(name: str, w: Tensor, dtype: torch.dtype) -> Tensor:
    if dtype == torch.float16 and bool((w.abs() > _FP16_MAX).any()):
        raise DomainError(f"save_dtype: {name} has |values| > 65504, which float16 cannot hold; use float32")
    return w.to(dtype).contiguous()


def edit_checkpoint(
    base_dir: str | Path,
    tuned_dirs: Sequence[str | Path],
    out_dir: str | Path,
    *,
    method: str = "sar",
    delta_fraction: float = 0.01,
    base_rank: int | None = None,
    mask: str = "full",
    alphas: Sequence[float] | None = None,
    targets: Sequence[str] = DEFAULT_TARGETS,
    save_dtype: str = "auto",
    randomized: bool = True,
    keep_tuned_non_targets: bool = False,
    seed: int = 0,
    overwrite: bool = False,
) -> EditReport:
    """Edit (one tuned dir) or merge (several) checkpoints onto ``base_dir``; write ``out_dir``.

    Args:
        method: ``sar`` (default), or a merge baseline ``task_arithmetic`` / ``average`` / ``ties``.
        delta_fraction, base_rank, mask: SAR options (`sar_project`).
        alphas: one scale per tuned model (default 1).
        targets: regexes selecting the target linear weights.
        save_dtype: ``auto`` (each tensor keeps the base's dtype), ``float32``, ``float16``, ``bfloat16``.
        randomized: randomized SVD for $\\Delta_k$ (the first target is also done exactly and
            the relative difference reported, as docs: methods/sar.md recommends).
        keep_tuned_non_targets: take non-target tensors from the first tuned model (ablation).
        seed: the randomized SVD's seed (each target tensor reseeds, so its result does not depend on the others).
        overwrite: replace an existing non-empty ``out_dir`` (else `DomainError`).

    Returns:
        An `EditReport` (also written to ``out_dir/sar_report.json``).

    Raises:
        DomainError: an unknown method or dtype; a non-finite alpha or input weight; ``out_dir`` is or holds an
            input, or is not empty and ``overwrite`` is False.
    """
    from safetensors.torch import save_file

    from posttrain.llm.train.rundir import atomic_directory

    if method not in MERGE_METHODS:
        raise DomainError(f"method: unknown {method!r}; valid: {', '.join(MERGE_METHODS)}")
    if not tuned_dirs:
        raise ShapeError("tuned_dirs: expected at least one tuned checkpoint directory")
    if save_dtype != "auto" and save_dtype not in _DTYPES:
        raise DomainError(f"save_dtype: expected auto or one of {sorted(_DTYPES)}, got {save_dtype!r}")
    inputs = [("base_dir", base_dir), *((f"tuned_dirs[{i}]", t) for i, t in enumerate(tuned_dirs))]
    _check_output(Path(out_dir), inputs, overwrite=overwrite)
    alphas = [1.0] * len(tuned_dirs) if alphas is None else list(alphas)
    if len(alphas) != len(tuned_dirs):
        raise ShapeError(f"alphas: expected {len(tuned_dirs)} values (one per tuned dir), got {len(alphas)}")
    for i, a in enumerate(alphas):
        if not isinstance(a, int | float) or isinstance(a, bool) or not math.isfinite(a):
            raise DomainError(f"alphas[{i}]: expected a finite number (--alpha), got {a!r}")
    start = time.perf_counter()
    base = load_weights(base_dir, name="base_dir")
    tuned = [load_weights(d, name=f"tuned_dirs[{i}]") for i, d in enumerate(tuned_dirs)]
    for i, t in enumerate(tuned):
        if set(t) != set(base):
            diff = sorted(set(t) ^ set(base))[:5]
            raise ShapeError(f"tuned_dirs[{i}]: tensor names differ from the base (e.g. {diff})")
    report = EditReport(method=method)
    out: dict[str, Tensor] = {}
    erased = changed = 0
    err_num = err_den = 0.0
    for name, w0_raw in base.items():
        report.total_params += w0_raw.numel()
        dtype = w0_raw.dtype if save_dtype == "auto" else _DTYPES[save_dtype]
        is_target = w0_raw.ndim == 2 and any(re.search(p, name) for p in targets)
        if not is_target:
            src = tuned[0][name] if keep_tuned_non_targets else w0_raw
            out[name] = src.contiguous()
            continue
        w0 = w0_raw.float()
        deltas = []
        for i, t in enumerate(tuned):
            if t[name].shape != w0.shape:
                raise ShapeError(f"tuned_dirs[{i}]: {name} has shape {list(t[name].shape)}, base {list(w0.shape)}")
            deltas.append(t[name].float() - w0)
        m, n = w0.shape
        k = sar_rank(delta_fraction, m, n)
        sar_kwargs: dict[str, Any] = dict(k=k, base_rank=base_rank, mask=mask, randomized=randomized)
        with torch.random.fork_rng(devices=[]):  # svd_lowrank draws from the global RNG: a private, seeded one
            torch.manual_seed(seed)
            edit = _combine(method, w0, deltas, alphas, sar_kwargs)
        if method == "sar" and randomized and report.randomized_check_rel_error is None:
            exact = sum(
                (
                    a * sar_project(w0, d, **{**sar_kwargs, "randomized": False})
                    for a, d in zip(alphas, deltas, strict=True)
                ),
                torch.zeros_like(w0),
            )
            report.randomized_check_rel_error = float((edit - exact).norm() / exact.norm().clamp_min(1e-30))
        if not bool(torch.isfinite(edit).all()):  # e.g. a float32 overflow of huge deltas
            raise DomainError(f"alphas: the edit of {name} is not finite; no output was written")
        saved = _cast(name, w0 + edit, dtype)
        realised = saved.float() - w0_raw.to(dtype).float()
        moved = edit != 0
        erased_here = int((moved & (saved == w0_raw.to(dtype))).sum())
        erased += erased_here
        changed += int(moved.sum())
        err_num += float((realised - edit).norm() ** 2)
        err_den += float(edit.norm() ** 2)
        out[name] = saved
        report.targets += 1
        report.target_params += m * n
        report.stored_factor_params += len(deltas) * k * (m + n + 1)
        report.per_tensor[name] = {"k": float(k), "erased": erased_here / max(int(moved.sum()), 1)}
    report.erased_fraction = erased / max(changed, 1)
    report.delta_rel_error = (err_num / err_den) ** 0.5 if err_den > 0 else 0.0
    with atomic_directory(Path(out_dir)) as tmp:  # a fresh directory, renamed over out_dir once complete
        for f in sorted(Path(tuned_dirs[0]).iterdir()):
            if f.is_file() and not f.name.endswith((".safetensors", ".bin")) and f.name not in _NOT_COPIED:
                shutil.copyfile(f, tmp / f.name)  # the bytes only: a new file in a new directory
        save_file(out, str(tmp / "model.safetensors"), metadata={"format": "pt", "posttrain_edit": method})
        report.seconds = time.perf_counter() - start
        (tmp / "sar_report.json").write_text(json.dumps(asdict(report), indent=2))
    return report
