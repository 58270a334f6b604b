"""Seed-wise pass criteria ("in every seed", "in >= 4/5 seeds") as single-number comparisons.

The harness asserts ``mean(differences) > margin`` with a paired CI. A spec criterion that must
hold in at least a fraction ``f`` of the seeds is exactly "the ``m``-th smallest per-seed value
exceeds the margin" with ``m = n - ceil(f n) + 1``; :func:`seedwise` builds that comparison from
the raw per-seed differences (which stay in the result's metrics).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from posttrain.errors import DomainError
from posttrain.paper_checks.base import Comparison

__all__ = ["order_statistic", "seedwise"]


def order_statistic(values: Sequence[float] | np.ndarray, *, fraction: float) -> float:
    """The largest ``v`` such that at least ``ceil(fraction * n)`` of the values are ``>= v``."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    if v.size == 0 or not 0.0 < fraction <= 1.0:
        raise DomainError(f"values/fraction: need values and fraction in (0, 1], got {v.size} values, {fraction}")
    need = math.ceil(fraction * v.size - 1e-12)
    return float(v[v.size - need])


def seedwise(
    name: str,
    differences: Sequence[float] | np.ndarray,
    *,
    margin: float,
    margin_reason: str,
    fraction: float = 1.0,
    asserted: bool = True,
) -> Comparison:
    """A comparison that passes iff ``differences > margin`` in at least ``fraction`` of the seeds."""
    label = "every seed" if fraction >= 1.0 else f">= {fraction:.0%} of seeds"
    return Comparison(
        name=f"{name} ({label})",  # no square brackets: rich would read them as markup
        differences=(order_statistic(differences, fraction=fraction),),
        margin=margin,
        margin_reason=margin_reason,
        asserted=asserted,
    )
