"""Synthetic run records (the shape `posttrain.real_checks.runs.Runner.record` writes) for fast tests."""

from __future__ import annotations

from typing import Any

import numpy as np


def record(accuracy: float, *, prompts: int = 40, samples: int = 4, seed: int = 0, history: list | None = None,
           texts: str = "85", domains: list | None = None, rms: float | None = None) -> dict[str, Any]:  # fmt: skip
    """A record whose held-out samples are correct with probability ``accuracy`` (fixed draw per ``seed``)."""
    rng = np.random.default_rng(seed)
    rewards = (rng.random((prompts, samples)) < accuracy).astype(float).tolist()
    return {
        "eval": {
            "rewards": rewards,
            "answers": [["85" if r >= 1 else "84" for r in row] for row in rewards],
            "texts": [[texts] * samples for _ in range(prompts)],
            "domains": domains if domains is not None else [None] * prompts,
            "entropy": 0.5,
            "response_len": 4.0,
            "generated": prompts * samples,
        },
        "history": history or [],
        "first_update_rms": rms,
        "train_cpu_s": 10.0,
        "eval_cpu_s": 2.0,
    }
