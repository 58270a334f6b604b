"""What a paper check is and what its run returns: metrics, comparisons, the primary endpoint, mutants.

A check module (one per paper, ``posttrain/paper_checks/pNN_<name>.py``) defines a frozen ``Config``
(a ``seeds`` field and a ``smoke()`` classmethod), a ``run(config) -> Result`` that returns raw
per-seed numbers (it neither prints nor asserts nor sets global state), and registers a
`PaperCheck`. Every claim is a `Comparison` of per-seed *paired* differences (treatment - control
on the same seed, oriented so that larger supports the claim) against a declared margin, judged
by `posttrain.paper_checks.stats.compare` at one-sided level `ALPHA`.

- **One primary endpoint** per check (`Role.PRIMARY`): the comparison that tests the sentence of
  the paper's abstract quoted in `PaperCheck.abstract`. It alone decides the three-way `Verdict`:
  *reproduced* when its confidence bound excludes the null in the claimed direction,
  *contradicted* when the other bound excludes the claim, *inconclusive* otherwise.
- **Secondary** comparisons (`Role.SECONDARY`) are pre-declared criteria, judged and reported,
  never deciding; **context** rows (`Role.CONTEXT`) are numbers shown beside them.
- **Kinds** (`Criterion`): a *mean* declares the range of its differences (``bounds``; judged with
  a bound valid in finite samples for every distribution on that range) or, for an unbounded
  quantity, the ``assumption`` under which the location method applies; a *quantile* claims
  ``P(d > margin) > share`` and is judged by the exact Clopper-Pearson bound on the share of seeds
  clearing the margin; an *exact* value is deterministic (no sampling noise).
- **Mutants** (`Mutant`): wrong methods (the baseline in the method's place, the method without its
  key ingredient) as a config transformation; a check that cannot call them anything but
  *reproduced* tests nothing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
from torch import Tensor

from posttrain.errors import DomainError

__all__ = [
    "ALPHA",
    "LEVEL",
    "MEDIAN",
    "Comparison",
    "Criterion",
    "Metric",
    "Mutant",
    "PaperCheck",
    "Result",
    "Role",
    "Verdict",
    "exact_criterion",
    "mean_criterion",
    "quantile_criterion",
]

ALPHA = 0.025
"""One-sided level of every bound (the lower end of a two-sided 95% interval)."""
LEVEL = 1.0 - 2.0 * ALPHA
"""Two-sided level of the intervals shown: the lower and upper one-sided bounds at `ALPHA` each."""
MEDIAN = 0.5
"""The share of a quantile criterion that says "the median of d clears the margin"."""


class Verdict(StrEnum):
    """The outcome of a check: its primary endpoint's outcome, or *error* when ``run`` raised."""

    REPRODUCED = "reproduced"
    CONTRADICTED = "contradicted"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"


class Criterion(StrEnum):
    """How a comparison is judged (see the module docstring)."""

    MEAN = "mean"
    QUANTILE = "quantile"
    EXACT = "exact"


class Role(StrEnum):
    """What a comparison does in the verdict."""

    PRIMARY = "primary"
    SECONDARY = "secondary"
    CONTEXT = "context"


@dataclass(frozen=True)
class Metric:
    """One measured quantity: its per-seed values and, when the paper reports it, the paper's value."""

    name: str
    per_seed: tuple[float, ...]
    paper_value: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Comparison:
    """A claim as an inequality on paired per-seed differences (see the module docstring).

    ``differences[s]`` is (treatment - control) on seed ``s``, oriented so that larger supports the
    claim ``E[d] > margin`` (mean), ``P(d > margin) > share`` (quantile) or ``d > margin`` (exact).
    ``bounds`` is the range every difference can take (a mean of a bounded quantity);
    ``assumption`` states why the location method applies to an unbounded one.
    """

    name: str
    differences: tuple[float, ...]
    margin: float = 0.0
    margin_reason: str = ""
    role: Role = Role.SECONDARY
    kind: Criterion = Criterion.MEAN
    bounds: tuple[float, float] | None = None
    assumption: str = ""
    share: float | None = None
    paper_value: float | None = None
    headline: bool = False

    def __post_init__(self) -> None:
        if self.kind is Criterion.QUANTILE:
            if self.share is None or not 0.0 < self.share < 1.0:
                raise DomainError(
                    f"share: a quantile criterion needs a share in (0, 1), got {self.share!r} ({self.name})"
                )
        elif self.share is not None:
            raise DomainError(f"share: only a quantile criterion takes a share, got kind {self.kind.value!r}")
        if self.kind is not Criterion.MEAN:
            return
        if (self.bounds is None) == (not self.assumption):
            raise DomainError(
                f"bounds/assumption: the mean criterion {self.name!r} declares either the range of its differences "
                f"(bounds=(lo, hi)) or the assumption that lets an unbounded quantity be judged, not "
                f"{'both' if self.bounds is not None else 'neither'}"
            )
        if self.bounds is not None:
            lo, hi = self.bounds
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise DomainError(f"bounds: expected finite lo < hi, got {self.bounds!r} ({self.name})")
            if not lo <= self.margin < hi:
                raise DomainError(f"margin: {self.margin!r} lies outside the bounds {self.bounds!r} ({self.name})")
            d, tol = np.asarray(self.differences, dtype=np.float64), 1e-9 * (hi - lo)  # tol: rounding at the ends
            outside = d[np.isfinite(d) & ((d < lo - tol) | (d > hi + tol))]
            if outside.size:
                raise DomainError(
                    f"differences: {outside.size} values of {self.name!r} lie outside the declared bounds "
                    f"{self.bounds!r} (e.g. {float(outside[0])!r})"
                )


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
    bounds: tuple[float, float] | None = None,
    assumption: str = "",
    role: Role = Role.SECONDARY,
    paper_value: float | None = None,
    headline: bool = False,
) -> Comparison:
    """``E[d] > margin`` over seeds, for ``d`` in ``bounds`` (or an unbounded ``d`` under ``assumption``)."""
    return Comparison(
        name,
        _floats(differences),
        margin,
        reason,
        role,
        Criterion.MEAN,
        bounds,
        assumption,
        None,
        paper_value,
        headline,
    )


def quantile_criterion(
    name: str,
    differences: Values,
    *,
    margin: float,
    share: float,
    reason: str,
    role: Role = Role.SECONDARY,
    headline: bool = False,
) -> Comparison:
    """``P(d > margin) > share``: a seed clears the margin more often than ``share`` (Clopper-Pearson)."""
    return Comparison(
        name, _floats(differences), margin, reason, role, Criterion.QUANTILE, None, "", share, None, headline
    )


def exact_criterion(
    name: str,
    values: Values,
    *,
    margin: float,
    reason: str,
    role: Role = Role.SECONDARY,
    paper_value: float | None = None,
) -> Comparison:
    """A deterministic quantity (no sampling noise): every value must exceed ``margin``."""
    return Comparison(name, _floats(values), margin, reason, role, Criterion.EXACT, None, "", None, paper_value)


@dataclass(frozen=True)
class Result:
    """What ``run(config)`` returns: raw per-seed numbers, no verdict."""

    metrics: tuple[Metric, ...]
    comparisons: tuple[Comparison, ...]
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def primary(self) -> Comparison:
        """The one primary comparison.

        Raises:
            DomainError: the result marks no comparison, or more than one, as primary.
        """
        found = [c for c in self.comparisons if c.role is Role.PRIMARY]
        if len(found) != 1:
            names = ", ".join(repr(c.name) for c in found) or "none"
            raise DomainError(f"comparisons: a check marks exactly one primary comparison, got {len(found)} ({names})")
        return found[0]


@dataclass(frozen=True)
class Mutant:
    """A wrong method the check must not call *reproduced*.

    ``apply`` maps the check's config to one where the method is replaced (by the baseline, or by
    the method without its key ingredient). ``test_config`` gives the config the mutant test starts
    from (default: the check's smoke config), for a mutant that needs more seeds to be told apart.
    """

    name: str
    description: str
    apply: Callable[[Any], Any]
    test_config: Callable[[], Any] | None = None


@dataclass(frozen=True)
class PaperCheck:
    """A registered check: the paper, the claim, the abstract sentence its primary endpoint tests, ``run``, mutants."""

    id: str
    paper: str
    claim: str
    config_type: Any
    run: Callable[[Any], Result]
    abstract: str = ""
    """The sentence of the paper's abstract that the primary comparison tests, quoted."""
    reported_claim: str = ""
    """The part of the paper's claim this check reports without judging it (empty: none)."""
    mutants: tuple[Mutant, ...] = ()

    def config(self, *, smoke: bool = False, seeds: int | None = None) -> Any:
        cfg = self.config_type.smoke() if smoke else self.config_type()
        if seeds is not None:
            cfg = dataclasses.replace(cfg, seeds=int(seeds))
        return cfg

    def mutant(self, name: str) -> Mutant:
        """The mutant called ``name``.

        Raises:
            KeyError: no such mutant (the message lists the declared ones).
        """
        for m in self.mutants:
            if m.name == name:
                return m
        valid = ", ".join(m.name for m in self.mutants) or "(none declared)"
        raise KeyError(f"check {self.id} has no mutant {name!r}; declared: {valid}")
