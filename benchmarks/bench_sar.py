"""SAR edit of a Qwen2.5-0.5B-shaped stack of target matrices (random weights), float32 CPU.

Reports the full edit time (24 layers x 7 matrices) and, on one layer, the ratio of our path
(QR base frame + randomized rank-k SVD of the delta) to the straightforward one (full SVD of the
base and of the delta), both measured in the same run.
"""

from __future__ import annotations

import time

import torch

from benchmarks._timing import Row, time_pair
from posttrain.estimators.merging import sar_project, sar_rank

# Qwen2.5-0.5B: hidden 896, intermediate 4864, 14 heads of 64, 2 KV heads -> k/v 128 x 896.
SHAPES = {
    "q": (896, 896),
    "k": (128, 896),
    "v": (128, 896),
    "o": (896, 896),
    "gate": (4864, 896),
    "up": (4864, 896),
    "down": (896, 4864),
}


def _layer(g: torch.Generator, scale: float = 1.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(scale * torch.randn(*s, generator=g), 1e-3 * torch.randn(*s, generator=g)) for s in SHAPES.values()]


def run(*, layers: int = 24, repeats: int = 1) -> list[Row]:
    g = torch.Generator().manual_seed(0)
    one = _layer(g)

    def ours() -> None:
        for w0, d in one:
            sar_project(w0, d, k=sar_rank(0.01, *w0.shape), randomized=True)

    def naive() -> None:
        for w0, d in one:
            sar_project(w0, d, k=sar_rank(0.01, *w0.shape), base_rank=min(w0.shape))  # full SVDs

    t_ours, t_naive = time_pair(ours, naive, repeats=repeats)
    start = time.perf_counter()
    for _ in range(layers - 1):
        for w0, d in _layer(g):
            sar_project(w0, d, k=sar_rank(0.01, *w0.shape), randomized=True)
    full = t_ours + time.perf_counter() - start
    return [
        Row(
            "SAR one 0.5B layer (7 matrices)", t_ours, t_naive, "full-SVD SAR, same layer", None, higher_is_better=True
        ),
        Row(
            f"SAR full 0.5B edit ({layers} layers): {full:.1f} s",
            full,
            60.0,
            "the 60 s budget",
            1.0,
            higher_is_better=True,
        ),
    ]
