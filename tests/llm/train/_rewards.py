"""Reward functions for the off-policy tests (``data.reward: "tests.llm.train._rewards:..."``, TRL's signature)."""

from __future__ import annotations

from typing import Any


def by_length(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
    """A reward that varies within a group: the completion's length mod 3, halved (0, 0.5 or 1)."""
    return [float(len(c) % 3) / 2.0 for c in completions]


def fails_on_batches(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
    """Scores the single completion the config check tries, then fails on every rollout batch."""
    if len(completions) > 1:
        raise RuntimeError("reward function failed on purpose")
    return [0.0] * len(completions)
