"""The contract between a paper check and the harness.

A check module (one per paper, ``posttrain/paper_checks/pNN_<name>.py``) defines:

- a module docstring stating the claim, citing the paper, and listing every simplification;
- a frozen ``Config`` dataclass holding the paper's/spec's values, with a ``seeds: int`` field and
  a ``smoke()`` classmethod returning the small variant that CI runs;
- ``run(config) -> Result`` returning raw per-seed numbers; it neither prints nor asserts;
- a registration ``register_check(PaperCheck(id="NN", ...))`` at import time, and an entry in
  :data:`posttrain.paper_checks.MODULES`.

The verdict is computed here from :class:`Comparison` objects: each holds per-seed *paired*
differences oriented so that the claim says "greater than ``margin``". A comparison is asserted
(part of the verdict) or reported only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
from scipy import stats

from posttrain.errors import DomainError, ShapeError

__all__ = [
    "Comparison",
    "ComparisonStats",
    "Metric",
    "PaperCheck",
    "Result",
    "Verdict",
    "compare",
    "paired_bootstrap_ci",
    "sign_test",
    "verdict_of",
]


class Verdict(str, Enum):
    REPRODUCED = "reproduced"
    NOT_REPRODUCED = "not reproduced"
    ERROR = "error"


@dataclass(frozen=True)
class Metric:
    """One measured quantity: its per-seed values and, when the paper reports it, the paper's value."""

    name: str
    per_seed: tuple[float, ...]
    paper_value: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Comparison:
    """A claim as an inequality on paired per-seed differences: ``mean(differences) > margin``.

    ``differences[s]`` is (treatment - control) for seed ``s`` with both arms run on the same seed,
    oriented so that larger supports the claim. ``margin`` is declared and justified in the
    check's config (``margin_reason``). ``asserted=False`` marks a comparison the spec reports
    without asserting.
    """

    name: str
    differences: tuple[float, ...]
    margin: float = 0.0
    margin_reason: str = ""
    asserted: bool = True
    paper_value: float | None = None
    every_seed: bool = False
    """Stricter rule for claims stated per seed ("in every seed"): also require every difference > margin."""
    min_seeds: int | None = None
    """Rule for claims stated as "in at least m of n seeds": pass when at least ``min_seeds`` differences
    exceed the margin (replaces the CI rule when set)."""


@dataclass(frozen=True)
class Result:
    """What ``run(config)`` returns: raw per-seed numbers, no verdict."""

    metrics: tuple[Metric, ...]
    comparisons: tuple[Comparison, ...]
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PaperCheck:
    """A registered check: the paper, the claim, its config type and its ``run``."""

    id: str
    paper: str
    claim: str
    config_type: Any
    run: Callable[[Any], Result]

    def config(self, *, smoke: bool = False, seeds: int | None = None) -> Any:
        cfg = self.config_type.smoke() if smoke else self.config_type()
        if seeds is not None:
            cfg = dataclasses.replace(cfg, seeds=int(seeds))
        return cfg


@dataclass(frozen=True)
class ComparisonStats:
    mean: float
    ci_low: float
    ci_high: float
    sign_p: float
    n: int
    passed: bool


def paired_bootstrap_ci(
    differences: np.ndarray, *, level: float = 0.95, n_boot: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of paired differences (resampling seeds), vectorised."""
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 1 or d.size == 0:
        raise ShapeError(f"differences: expected a non-empty 1-d array, got shape {d.shape}")
    if not 0.0 < level < 1.0:
        raise DomainError(f"level: expected a value in (0, 1), got {level!r}")
    if d.size == 1:
        return float(d[0]), float(d[0])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.size, size=(n_boot, d.size))
    means = d[idx].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def sign_test(differences: np.ndarray, *, margin: float = 0.0) -> float:
    """One-sided exact sign test p-value for ``median(differences) > margin`` (ties dropped)."""
    d = np.asarray(differences, dtype=np.float64) - margin
    pos, neg = int((d > 0).sum()), int((d < 0).sum())
    if pos + neg == 0:
        return 1.0
    return float(stats.binomtest(pos, pos + neg, 0.5, alternative="greater").pvalue)


def compare(c: Comparison, *, level: float = 0.95) -> ComparisonStats:
    """Paired statistics of a comparison; it passes when the CI's lower end is above the margin."""
    d = np.asarray(c.differences, dtype=np.float64)
    if d.size == 0 or not np.all(np.isfinite(d)):
        return ComparisonStats(math.nan, math.nan, math.nan, 1.0, int(d.size), False)
    lo, hi = paired_bootstrap_ci(d, level=level)
    if c.min_seeds is not None:
        passed = int((d > c.margin).sum()) >= c.min_seeds
    else:
        passed = lo > c.margin and (not c.every_seed or bool(np.all(d > c.margin)))
    return ComparisonStats(float(d.mean()), lo, hi, sign_test(d, margin=c.margin), int(d.size), passed)


def verdict_of(result: Result) -> Verdict:
    """Reproduced when every asserted comparison passes; a check with none asserted cannot reproduce."""
    asserted = [c for c in result.comparisons if c.asserted]
    if not asserted:
        return Verdict.NOT_REPRODUCED
    return Verdict.REPRODUCED if all(compare(c).passed for c in asserted) else Verdict.NOT_REPRODUCED
