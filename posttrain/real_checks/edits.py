r"""Checkpoint edits for the SAR experiment: the RL update kept at rank k in the base's frame, a random frame, or none.

For every target weight ($W_0$ of the base, $W_1$ of the RL-tuned model, $\Delta = W_1 - W_0$, targets as
`posttrain.llm.tools.sar.DEFAULT_TARGETS`) the edited model holds $W_0 + \Delta^\star$ with

- ``frame="base"``: SAR, $\Delta^\star$ = `sar_project` $(W_0, \Delta)$ (the base's singular frame, rank
  $r$ = ``base_rank``, default the full thin rank as in the official code);
- ``frame="random"``: the same projection in the singular frame of a Gaussian matrix of $W_0$'s shape
  (a Haar-random frame of the same rank): the mechanism SAR names (the base's frame) is what differs;
- ``frame="none"``: plain low rank, the rank-$k$ truncated SVD of $\Delta$ (no frame).

$k$ = `sar_rank` of ``delta_fraction`` (the kept share of the matrix's parameters), exact SVDs (no
randomized error). Non-target tensors are the base's. With a square weight and the full base rank
both projectors are the identity, so there SAR equals plain low rank: the frame only acts on
rectangular weights (and below full rank).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Literal

import torch

from posttrain.errors import DomainError
from posttrain.estimators.merging import sar_project, sar_rank
from posttrain.llm.tools.sar import DEFAULT_TARGETS, load_weights

__all__ = ["edit_model"]

Frame = Literal["base", "random", "none"]


def _low_rank(delta: torch.Tensor, k: int) -> torch.Tensor:
    u, s, vh = torch.linalg.svd(delta, full_matrices=False)
    return (u[:, :k] * s[:k]) @ vh[:k]


def edit_model(
    base_dir: str | Path,
    tuned_dir: str | Path,
    out_dir: str | Path,
    *,
    frame: Frame,
    delta_fraction: float = 0.01,
    base_rank: int | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """Write ``out_dir`` = the base with each target's update kept at rank k in ``frame``; returns a small report.

    Raises:
        DomainError: an unknown ``frame``; the two checkpoints hold different tensors.
    """
    from safetensors.torch import save_file

    if frame not in ("base", "random", "none"):
        raise DomainError(f"frame: expected 'base', 'random' or 'none', got {frame!r}")
    base, tuned = load_weights(base_dir, name="base_dir"), load_weights(tuned_dir, name="tuned_dir")
    if set(base) != set(tuned):
        raise DomainError(f"tuned_dir: tensor names differ from the base (e.g. {sorted(set(base) ^ set(tuned))[:3]})")
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    kept = total = moved = 0.0
    for name, w0_raw in base.items():
        if not (w0_raw.ndim == 2 and any(re.search(p, name) for p in DEFAULT_TARGETS)):
            out[name] = w0_raw.contiguous()
            continue
        w0, delta = w0_raw.double(), tuned[name].double() - w0_raw.double()
        m, n = w0.shape
        k = sar_rank(delta_fraction, m, n)
        if frame == "none":
            edit = _low_rank(delta, k)
        else:
            frame_of = w0 if frame == "base" else torch.randn(m, n, generator=gen, dtype=torch.float64)
            edit = sar_project(frame_of, delta, k=k, base_rank=base_rank, randomized=False)
        out[name] = (w0 + edit).to(w0_raw.dtype).contiguous()
        kept += float(edit.norm() ** 2)
        moved += float(delta.norm() ** 2)
        total += k * (m + n + 1)
    out_dir = Path(out_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    for f in sorted(Path(tuned_dir).iterdir()):
        if f.is_file() and "safetensors" not in f.name and not f.name.endswith(".bin"):
            shutil.copyfile(f, out_dir / f.name)
    save_file(out, str(out_dir / "model.safetensors"), metadata={"format": "pt", "posttrain_edit": f"sar-{frame}"})
    return {"kept_update_energy": kept / moved if moved > 0 else float("nan"), "stored_params": total}
