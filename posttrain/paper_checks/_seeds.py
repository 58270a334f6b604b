"""Seed-wise pass criteria ("in every seed", "in >= 4/5 seeds") as comparisons.

A spec criterion that must hold in at least a fraction ``f`` of the ``n`` seeds is the harness's
``min_seeds = ceil(f n)`` rule on the raw per-seed differences (the comparison keeps them all, so the
table still shows their paired CI). :func:`order_statistic` gives the same criterion as one number:
it passes iff the ``(n - ceil(f n) + 1)``-th smallest difference exceeds the margin.
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
    d = tuple(float(x) for x in np.asarray(differences, dtype=np.float64).ravel())
    if not d or not 0.0 < fraction <= 1.0:
        raise DomainError(f"differences/fraction: need differences and fraction in (0, 1], got {len(d)}, {fraction}")
    return Comparison(
        name=f"{name} ({label})",  # no square brackets: rich would read them as markup
        differences=d,
        margin=margin,
        margin_reason=margin_reason,
        asserted=asserted,
        min_seeds=math.ceil(fraction * len(d) - 1e-12),
    )
