"""GRPO advantages end to end: token rewards ``[B, T]`` + mask -> per-token advantages ``[B, T]``.

Ours: ``masked_sum`` of the token rewards per row, ``group_normalized_advantages`` on the
``[G, K]`` scores, ``broadcast_sequence_advantages`` back over the mask (validated, NaN-safe off
the mask). Anchors, interleaved with ours in the same run (``median [min-max]``):

- verl's ``compute_grpo_vectorized_outcome_advantage`` (its vectorised path; prompt ids as a numpy
  array, mask as floats, as verl holds it) when verl is importable; goal: ours <= 0.9x its time;
- verl's ``compute_grpo_outcome_advantage`` (the per-sample Python loop), reported;
- without verl both rows are skipped and the table says so.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch

from benchmarks._timing import Row, Spread, interleaved
from posttrain.estimators import broadcast_sequence_advantages, group_normalized_advantages, masked_sum

TARGET_OVER_VERL = 0.9


def ours(token_rewards: torch.Tensor, mask: torch.Tensor, k: int) -> torch.Tensor:
    scores = masked_sum(token_rewards, mask, dim=-1)
    return broadcast_sequence_advantages(group_normalized_advantages(scores.view(-1, k)), mask)


def verl_functions() -> dict[str, Callable[..., Any]] | None:
    try:
        from verl.trainer.ppo import core_algos
    except Exception:  # verl or one of its imports missing
        return None
    return {
        "verl vectorised": core_algos.compute_grpo_vectorized_outcome_advantage,
        "verl loop": core_algos.compute_grpo_outcome_advantage,
    }


def run(*, b: int, t: int, k: int, repeats: int, seed: int = 0) -> list[Row]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(-1)
    correct = (torch.rand(b, generator=gen) < 0.5).to(torch.float32)
    token_rewards = torch.zeros(b, t)
    token_rewards[torch.arange(b), lengths - 1] = correct  # outcome reward on the last response token
    fns: dict[str, Callable[[], object]] = {"ours": lambda: ours(token_rewards, mask, k)}
    verl = verl_functions()
    label = f"GRPO advantages end to end [B={b}, T={t}, K={k}]"
    if verl is None:
        mine = interleaved(fns, repeats=repeats)["ours"]
        return [Row(label + " (verl not importable: no anchor)", mine.median, float("nan"), "-", None, False, mine)]
    index = np.array([f"prompt-{i // k}" for i in range(b)], dtype=object)  # verl's uid strings
    float_mask = mask.to(torch.float32)
    for name, fn in verl.items():
        want, _ = fn(token_rewards, float_mask, index)
        torch.testing.assert_close(ours(token_rewards, mask, k), want, rtol=1e-4, atol=1e-5)
        fns[name] = partial(fn, token_rewards, float_mask, index)
    if b * t > 2**22:  # verl's per-sample loop costs seconds at the size: time it on fewer repeats
        loop = fns.pop("verl loop")
    else:
        loop = None
    times = interleaved(fns, repeats=repeats)
    rows = [_row(label, times["ours"], times["verl vectorised"], "verl vectorised", TARGET_OVER_VERL)]
    if loop is not None:
        times.update(interleaved({"ours": fns["ours"], "verl loop": loop}, repeats=3))
    rows.append(_row("  ... against verl's loop", times["ours"], times["verl loop"], "verl loop", None))
    return rows


def _row(name: str, mine: Spread, ref: Spread, ref_name: str, target: float | None) -> Row:
    return Row(name, mine.median, ref.median, ref_name, target, False, mine, ref)
