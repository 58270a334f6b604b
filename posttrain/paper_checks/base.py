"""The contract between a paper check and the harness, and the statistics behind every verdict.

A check module (one per paper, ``posttrain/paper_checks/pNN_<name>.py``) defines:

- a module docstring stating the claim, citing the paper, and listing every simplification;
- a frozen ``Config`` dataclass holding the paper's values, with a ``seeds: int`` field (at least
  10 by default) and a ``smoke()`` classmethod returning the small variant that CI runs;
- ``run(config) -> Result`` returning raw per-seed numbers; it neither prints nor asserts;
- a registration ``register_check(PaperCheck(id="NN", ...))`` at import time, and an entry in
  `posttrain.paper_checks.MODULES`.

Every criterion is a `Comparison` of per-seed *paired* differences (treatment - control on
the same seed, oriented so that larger supports the claim) against a margin declared and justified
in the check. There are three kinds (`Criterion`), all judged at one level, one-sided
`ALPHA` = 0.025 (the lower end of a two-sided 95% interval):

- **mean**: the claim ``E[d] > margin``. Student-t interval of the mean over seeds; passes when its
  lower end clears the margin (the one-sided t-test at level ``ALPHA``), which has exact coverage
  for normal differences at any ``n >= 2``. An asserted mean needs at least two seeds: a mean over
  seeds checked as one number would be a point estimate.
- **fraction**: the claim "``d > margin`` in at least a fraction ``f`` of the seeds", ``f`` taken
  from the paper's wording. Passes when at least ``ceil(f n)`` seeds clear the margin *and* the
  exact one-sided binomial test rejects "a seed clears the margin no more often than not"
  (``P(X >= k | n, 1/2) <= ALPHA``), so the rule's false-pass rate at that boundary is at most
  ``ALPHA``.
- **exact**: a deterministic number (a closed form, an enumeration, a bit-identity flag), with no
  sampling noise to account for; passes when every value exceeds the margin. The reason must say
  why the value is deterministic.

A comparison is asserted (part of the verdict) or reported only; a reported one flagged
``headline`` is shown in the overview beside the verdict.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
from scipy import stats
from torch import Tensor

from posttrain.errors import DomainError, ShapeError

__all__ = [
    "ALPHA",
    "LEVEL",
    "Comparison",
    "ComparisonStats",
    "Criterion",
    "Metric",
    "PaperCheck",
    "Result",
    "Verdict",
    "binomial_rule",
    "compare",
    "exact_criterion",
    "fraction_criterion",
    "mean_criterion",
    "sign_test",
    "t_interval",
    "verdict_of",
]

ALPHA = 0.025
"""One-sided level of every asserted criterion."""
LEVEL = 1.0 - 2.0 * ALPHA
"""Two-sided level of the intervals shown (0.95); a mean criterion passes when the lower end clears the margin."""


class Verdict(str, Enum):
    REPRODUCED = "reproduced"
    NOT_REPRODUCED = "not reproduced"
    ERROR = "error"


class Criterion(str, Enum):
    """How a comparison is judged (see the module docstring)."""

    MEAN = "mean"
    FRACTION = "fraction"
    EXACT = "exact"


@dataclass(frozen=True)
class Metric:
    """One measured quantity: its per-seed values and, when the paper reports it, the paper's value."""

    name: str
    per_seed: tuple[float, ...]
    paper_value: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Comparison:
    """A claim as an inequality on paired per-seed differences, judged by its `Criterion`.

    ``differences[s]`` is (treatment - control) for seed ``s`` with both arms run on the same seed,
    oriented so that larger supports the claim. ``margin`` is declared and justified in the
    check (``margin_reason``). ``asserted=False`` marks a comparison reported without asserting;
    ``headline=True`` puts a reported comparison in the overview. ``fraction`` is the share of
    seeds a `Criterion.FRACTION` claim needs (1.0 = every seed).
    """

    name: str
    differences: tuple[float, ...]
    margin: float = 0.0
    margin_reason: str = ""
    asserted: bool = True
    paper_value: float | None = None
    kind: Criterion = Criterion.MEAN
    fraction: float | None = None
    headline: bool = False

    def __post_init__(self) -> None:
        if self.kind is Criterion.FRACTION and (self.fraction is None or not 0.0 < self.fraction <= 1.0):
            raise DomainError(f"fraction: a fraction criterion needs a fraction in (0, 1], got {self.fraction!r}")
        if self.kind is not Criterion.FRACTION and self.fraction is not None:
            raise DomainError(f"fraction: only a fraction criterion takes a fraction, got kind {self.kind.value!r}")


Values = Sequence[float] | np.ndarray | Tensor
"""Per-seed numbers as a sequence, a numpy array or a (CPU) tensor."""


def _floats(values: Values) -> tuple[float, ...]:
    return tuple(float(x) for x in np.asarray(values, dtype=np.float64).ravel())


def mean_criterion(
    name: str,
    differences: Values,
    *,
    margin: float,
    reason: str,
    asserted: bool = True,
    paper_value: float | None = None,
    headline: bool = False,
) -> Comparison:
    """``E[d] > margin`` over seeds, judged by the Student-t interval of the mean."""
    return Comparison(name, _floats(differences), margin, reason, asserted, paper_value, Criterion.MEAN, None, headline)


def fraction_criterion(
    name: str,
    differences: Values,
    *,
    fraction: float,
    reason: str,
    margin: float = 0.0,
    asserted: bool = True,
    headline: bool = False,
) -> Comparison:
    """``d > margin`` in at least ``fraction`` of the seeds, with the exact binomial test against 1/2."""
    label = "every seed" if fraction >= 1.0 else f">= {fraction:.0%} of seeds"
    return Comparison(
        f"{name} ({label})",  # no square brackets: rich would read them as markup
        _floats(differences),
        margin,
        reason,
        asserted,
        None,
        Criterion.FRACTION,
        float(fraction),
        headline,
    )


def exact_criterion(
    name: str,
    values: Values,
    *,
    margin: float,
    reason: str,
    asserted: bool = True,
    paper_value: float | None = None,
) -> Comparison:
    """A deterministic quantity (no sampling noise): every value must exceed ``margin``."""
    return Comparison(name, _floats(values), margin, reason, asserted, paper_value, Criterion.EXACT)


@dataclass(frozen=True)
class Result:
    """What ``run(config)`` returns: raw per-seed numbers, no verdict."""

    metrics: tuple[Metric, ...]
    comparisons: tuple[Comparison, ...]
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PaperCheck:
    """A registered check: the paper, the asserted claim, what is only reported, its config type and ``run``."""

    id: str
    paper: str
    claim: str
    config_type: Any
    run: Callable[[Any], Result]
    reported_claim: str = ""
    """The part of the paper's claim this check reports without asserting (empty: none)."""

    def config(self, *, smoke: bool = False, seeds: int | None = None) -> Any:
        cfg = self.config_type.smoke() if smoke else self.config_type()
        if seeds is not None:
            cfg = dataclasses.replace(cfg, seeds=int(seeds))
        return cfg


@dataclass(frozen=True)
class ComparisonStats:
    """Statistics of one comparison.

    ``ci_low``/``ci_high``: the Student-t `LEVEL` interval of the mean (the point when all values
    agree or ``n = 1``). ``p``: the criterion's one-sided p-value (t-test for a mean, binomial for a
    fraction, 0/1 for an exact value). ``sign_p``: the exact sign test against the margin, for
    reference. ``count``/``required``: seeds clearing the margin and how many a fraction needs.
    ``passed``: the criterion holds at level `ALPHA`.
    """

    mean: float
    ci_low: float
    ci_high: float
    sign_p: float
    n: int
    passed: bool
    p: float = 1.0
    count: int = 0
    required: int = 0
    rate_low: float = math.nan


def t_interval(differences: Sequence[float] | np.ndarray, *, level: float = LEVEL) -> tuple[float, float]:
    """Two-sided Student-t interval of the mean, ``mean -/+ t_{n-1} s / sqrt(n)``, vectorised over leading axes.

    ``differences`` is ``[..., N]``; returns arrays (floats for 1-d input). With ``N = 1`` or zero spread
    the interval is the point.
    """
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim < 1 or d.shape[-1] == 0:
        raise ShapeError(f"differences: expected a non-empty [..., N] array, got shape {d.shape}")
    if not 0.0 < level < 1.0:
        raise DomainError(f"level: expected a value in (0, 1), got {level!r}")
    n = d.shape[-1]
    mean = d.mean(-1)
    if n == 1:
        return _out(mean), _out(mean)
    half = stats.t.ppf(0.5 + level / 2.0, n - 1) * d.std(-1, ddof=1) / math.sqrt(n)
    return _out(mean - half), _out(mean + half)


def _out(x: np.ndarray) -> Any:
    return float(x) if np.ndim(x) == 0 else x


def t_test_greater(differences: np.ndarray, margin: float) -> np.ndarray:
    """One-sided t-test p-value for ``E[d] > margin`` over the last axis (``[..., N]``, ``N >= 2``).

    Zero spread: p = 0 when the common value exceeds the margin, else 1.
    """
    d = np.asarray(differences, dtype=np.float64)
    n = d.shape[-1]
    mean, sd = d.mean(-1), d.std(-1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (mean - margin) / (sd / math.sqrt(n))
    p = stats.t.sf(t, n - 1)
    return np.where(sd > 0, p, np.where(mean > margin, 0.0, 1.0))


def binomial_rule(n: int, fraction: float, *, alpha: float = ALPHA) -> int:
    """Seeds (of ``n``) a fraction criterion needs: ``max(ceil(f n), min{k : P(X >= k | n, 1/2) <= alpha})``.

    Returns ``n + 1`` when no count can pass (too few seeds).

    Examples:
        >>> binomial_rule(10, 0.8), binomial_rule(10, 1.0), binomial_rule(5, 1.0)
        (9, 10, 6)
    """
    ks = np.arange(n + 1)
    tail = stats.binom.sf(ks - 1, n, 0.5)  # P(X >= k)
    ok = ks[tail <= alpha]
    k_test = int(ok[0]) if ok.size else n + 1
    return max(math.ceil(fraction * n - 1e-12), k_test)


def sign_test(differences: np.ndarray, *, margin: float = 0.0) -> float:
    """One-sided exact sign test p-value for ``median(differences) > margin`` (ties dropped)."""
    d = np.asarray(differences, dtype=np.float64) - margin
    pos, neg = int((d > 0).sum()), int((d < 0).sum())
    if pos + neg == 0:
        return 1.0
    return float(stats.binomtest(pos, pos + neg, 0.5, alternative="greater").pvalue)


def compare(c: Comparison) -> ComparisonStats:
    """Statistics of a comparison and whether its criterion holds at level `ALPHA`.

    Raises:
        DomainError: an asserted mean criterion with fewer than two values (a point estimate).
    """
    d = np.asarray(c.differences, dtype=np.float64)
    n = int(d.size)
    if c.kind is Criterion.MEAN and c.asserted and n < 2:
        raise DomainError(
            f"comparison {c.name!r}: an asserted mean criterion needs per-seed values (got {n}); "
            "use exact_criterion for a deterministic number"
        )
    if n == 0 or not np.all(np.isfinite(d)):
        return ComparisonStats(math.nan, math.nan, math.nan, 1.0, n, False)
    lo, hi = t_interval(d)
    count = int((d > c.margin).sum())
    sp = sign_test(d, margin=c.margin)
    if c.kind is Criterion.EXACT:
        passed = bool(np.all(d > c.margin))
        return ComparisonStats(float(d.mean()), lo, hi, sp, n, passed, 0.0 if passed else 1.0, count, n)
    if c.kind is Criterion.FRACTION:
        assert c.fraction is not None
        required = binomial_rule(n, c.fraction)
        p = float(stats.binom.sf(count - 1, n, 0.5))
        rate_low = float(stats.beta.ppf(ALPHA, count, n - count + 1)) if count > 0 else 0.0  # Clopper-Pearson
        passed = count >= math.ceil(c.fraction * n - 1e-12) and p <= ALPHA
        return ComparisonStats(float(d.mean()), lo, hi, sp, n, passed, p, count, required, rate_low)
    if n < 2:  # a reported single number: shown, never passing
        return ComparisonStats(float(d.mean()), lo, hi, sp, n, False, 1.0, count, 0)
    p = float(t_test_greater(d, c.margin))
    return ComparisonStats(float(d.mean()), lo, hi, sp, n, p <= ALPHA, p, count, 0)


def verdict_of(result: Result) -> Verdict:
    """Reproduced when every asserted comparison passes; a check with none asserted cannot reproduce."""
    asserted = [c for c in result.comparisons if c.asserted]
    if not asserted:
        return Verdict.NOT_REPRODUCED
    return Verdict.REPRODUCED if all(compare(c).passed for c in asserted) else Verdict.NOT_REPRODUCED
