"""The real-model tier of the paper checks: each paper's primary claim on SmolLM2-135M-Instruct, beside its toy verdict.

``posttrain real-check [IDS] [--profile full|measure|smoke]`` (`posttrain.real_checks.cli`). The parts:
``card`` (transfer cards: the toy's primary, mediators with the toy's range, regime variables),
``arms`` / ``arm_table`` (profiles, the shared arms, the run's content key), ``runs`` (train or resume,
evaluate, cache), ``evaluation`` and ``metrics`` (held-out samples and the numbers read from them),
``gate`` (the regime gate), ``experiment`` (contrasts, the same statistics as the toys, the verdict),
``suite_rl`` / ``suite_distill`` / ``suite_analyses`` (the experiments), ``plan`` (seed plans and the
budget), ``suite`` (running a selection), ``outputs`` (results file, docs sections, the transfer table,
the README column) and ``edits`` (SAR's checkpoint edits).
"""

from __future__ import annotations

from typing import Any

__all__ = ["experiments", "select_experiments"]


def experiments() -> dict[str, Any]:
    """Every real-model experiment by paper id, in id order."""
    from posttrain.real_checks import suite_analyses, suite_distill, suite_rl

    found = [*suite_rl.EXPERIMENTS, *suite_distill.EXPERIMENTS, *suite_analyses.EXPERIMENTS]
    return {e.id: e for e in sorted(found, key=lambda e: e.id)}


def select_experiments(ids: list[str] | tuple[str, ...] = ()) -> list[Any]:
    """The experiments named by ``ids`` (all when empty; ``"2"`` means ``"02"``).

    Raises:
        KeyError: an unknown id (the message lists the valid ones).
    """
    table = experiments()
    if not ids:
        return list(table.values())
    out = []
    for wanted in ids:
        key = wanted.zfill(2) if wanted.isdigit() else wanted
        if key not in table:
            raise KeyError(f"unknown real-model experiment {wanted!r}; valid: {', '.join(table)}")
        out.append(table[key])
    return out
