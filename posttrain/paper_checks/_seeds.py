"""Seed-wise pass criteria ("in every seed", "in >= 4/5 seeds") as comparisons.

A criterion that must hold in at least a fraction ``f`` of the seeds is a
`fraction_criterion`: at least ``ceil(f n)`` seeds clear the margin
and the exact binomial test against 1/2 rejects at the harness level. `order_statistic` gives
the count part as one number: at least ``ceil(f n)`` values are ``>=`` it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from posttrain.errors import DomainError
from posttrain.paper_checks.base import Comparison, fraction_criterion

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
    headline: bool = False,
) -> Comparison:
    """A fraction criterion: ``differences > margin`` in at least ``fraction`` of the seeds (binomial-tested)."""
    d = np.asarray(differences, dtype=np.float64).ravel()
    if d.size == 0 or not 0.0 < fraction <= 1.0:
        raise DomainError(f"differences/fraction: need differences and fraction in (0, 1], got {d.size}, {fraction}")
    return fraction_criterion(
        name, d, fraction=fraction, margin=margin, reason=margin_reason, asserted=asserted, headline=headline
    )
