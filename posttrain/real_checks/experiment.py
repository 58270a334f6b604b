"""A real-model experiment: its transfer card, arms, paired statistics, seed plan, and its judgement.

An experiment's per-seed numbers are `Stat` s of one seed's records (a paired difference of a metric
between two arms trained with the same seed, a retention, a log-ratio of escape steps ...). Its
`Contrast` s turn them into the toy checks' `Comparison` s, judged by the same code
(`posttrain.paper_checks.stats`): the primary is a quantile criterion ``P(d > margin) > 1/2`` (the
method beats its control on most training seeds; exact Clopper-Pearson bound, valid for any law of the
per-seed differences), so a verdict is possible from 6 seeds on; a bounded statistic also gets a context
row with its mean and the betting bound. Why not the bounded mean as primary: on a difference of two
accuracies in ``[-1, 1]`` the betting bound needs ~90 seeds to detect an effect of 0.05 with 80%
power (`posttrain.paper_checks.bounds.seeds_for_power`), i.e. ~90 training runs per arm.

The verdict: *reproduced* / *contradicted* / *inconclusive* (with its minimum detectable effect) as for
the toys, replaced by *regime not reached* when a gate mediator falls outside the toy's range, *blocked*
when the trainer lacks what the experiment needs, *out of scope* when the claim cannot be tested on this
model (the reason is stated).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from posttrain.paper_checks.model import MEDIAN, Comparison, Metric, Result, Role, mean_criterion, quantile_criterion
from posttrain.real_checks.card import TransferCard
from posttrain.real_checks.metrics import metric

__all__ = ["Contrast", "RealExperiment", "RealVerdict", "Stat", "diff", "judge", "log_ratio", "retention"]

Records = Mapping[str, Mapping[str, Any]]
"""One seed's finished runs by arm name."""
_BOUNDED = ("accuracy", "reward", "zero_coverage")


class RealVerdict(StrEnum):
    """The toy checks' three outcomes, and what replaces them on a real model."""

    REPRODUCED = "reproduced"
    CONTRADICTED = "contradicted"
    INCONCLUSIVE = "inconclusive"
    REGIME_NOT_REACHED = "regime not reached"
    BLOCKED = "blocked"
    OUT_OF_SCOPE = "out of scope"
    NOT_RUN = "not run"
    ERROR = "error"


@dataclass(frozen=True)
class Stat:
    """A per-seed number from one seed's records; ``bounds``: the range it can take (None: unbounded)."""

    text: str
    arms: tuple[str, ...]
    fn: Callable[[Records], float]
    bounds: tuple[float, float] | None = None


def _bounded(name: str) -> bool:
    return name in _BOUNDED or name.startswith(("pass@", "accuracy["))


def diff(name: str, treatment: str, control: str) -> Stat:
    """``name(treatment) - name(control)`` on the same seed."""
    return Stat(f"{name}({treatment}) - {name}({control})", (treatment, control),
                lambda r: metric(r[treatment], name) - metric(r[control], name),
                (-1.0, 1.0) if _bounded(name) else None)  # fmt: skip


def retention(edited: str, tuned: str, base: str, name: str = "accuracy") -> Stat:
    """The share of the tuned model's gain over the base that the edited model keeps (NaN without a gain)."""

    def fn(r: Records) -> float:
        gain = metric(r[tuned], name) - metric(r[base], name)
        return (metric(r[edited], name) - metric(r[base], name)) / gain if gain > 0 else math.nan

    return Stat(f"({name}({edited}) - {name}({base})) / ({name}({tuned}) - {name}({base}))", (edited, tuned, base), fn)


def log_ratio(name: str, numerator: str, denominator: str) -> Stat:
    """``log(name(numerator) / name(denominator))`` (e.g. escape steps of the baseline over the method's)."""
    return Stat(f"log({name}({numerator}) / {name}({denominator}))", (numerator, denominator),
                lambda r: math.log(metric(r[numerator], name) / metric(r[denominator], name)))  # fmt: skip


@dataclass(frozen=True)
class Contrast:
    """A judged comparison: ``P(stat > margin) > share`` over seeds (primary or secondary)."""

    name: str
    stat: Stat
    role: Role = Role.SECONDARY
    margin: float = 0.0
    reason: str = "the method beats its control on most training seeds"
    share: float = MEDIAN


@dataclass(frozen=True)
class RealExperiment:
    """One paper's claim on the real model (module docstring).

    ``context``: ``(arm, metric)`` numbers shown per seed; ``probe_tasks``: the tasks whose first batch the
    gate probes; ``coverage``: the arms are scored with the profile's ``coverage_samples`` per prompt (pass@k);
    ``seeds``: the power plan's seed count (`posttrain.real_checks.plan`); ``needs``: returns why the trainer
    cannot run it yet ("" when it can); ``scope``: non-empty when the claim is out of scope (the reason).
    """

    id: str
    title: str
    card: TransferCard
    contrasts: tuple[Contrast, ...] = ()
    context: tuple[tuple[str, str], ...] = ()
    probe_tasks: tuple[str, ...] = ("add",)
    coverage: bool = False
    seeds: int = 9
    seed_reason: str = "power plan: share criterion at an assumed P(d > margin) = 0.95 (no pilot recorded) -> 9"
    needs: Callable[[], str] = field(default=lambda: "")
    scope: str = ""

    @property
    def arms(self) -> tuple[str, ...]:
        names = [a for c in self.contrasts for a in c.stat.arms] + [a for a, _ in self.context]
        return tuple(dict.fromkeys(names))

    @property
    def primary(self) -> Contrast:
        return next(c for c in self.contrasts if c.role is Role.PRIMARY)


def _values(stat: Stat, per_seed: Sequence[Records]) -> np.ndarray:
    out = []
    for records in per_seed:
        try:
            out.append(float(stat.fn(records)))
        except (KeyError, ZeroDivisionError, ValueError):
            out.append(math.nan)
    return np.asarray(out, dtype=np.float64)


def result_of(exp: RealExperiment, per_seed: Sequence[Records]) -> Result:
    """The experiment's `Result` (the toy checks' type) from its records, one mapping per seed."""
    metrics = [
        Metric(f"{name} {arm}", tuple(float(metric(r[arm], name)) for r in per_seed)) for arm, name in exp.context
    ]
    comparisons: list[Comparison] = []
    for c in exp.contrasts:
        d = _values(c.stat, per_seed)
        judged = d[np.isfinite(d)]
        comparisons.append(quantile_criterion(c.name, judged, margin=c.margin, share=c.share,
                                              reason=f"{c.reason}; statistic {c.stat.text}", role=c.role))  # fmt: skip
        if c.stat.bounds is not None and judged.size:
            lo, hi = c.stat.bounds
            comparisons.append(mean_criterion(f"{c.name} (mean, betting bound)", np.clip(judged, lo, hi),
                                              margin=c.margin, bounds=c.stat.bounds, role=Role.CONTEXT,
                                              reason="shown: the bounded mean and its finite-sample bound"))  # fmt: skip
        metrics.append(Metric(c.stat.text, tuple(float(x) for x in d)))
    return Result(tuple(metrics), tuple(comparisons))


def judge(exp: RealExperiment, per_seed: Sequence[Records], gate: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Summary rows, the harness verdict and the real verdict (gate applied) of a finished experiment."""
    from posttrain.paper_checks.report import summarise
    from posttrain.paper_checks.stats import verdict_of

    result = result_of(exp, per_seed)
    summary = summarise(result)
    primary = result.primary
    ungated = verdict_of(result).value if primary.differences else RealVerdict.INCONCLUSIVE.value
    missed = [g for g in gate if not g["inside"]]
    verdict = RealVerdict.REGIME_NOT_REACHED.value if missed else ungated
    return {**summary, "ungated_verdict": ungated, "verdict": verdict, "seeds_run": len(per_seed),
            "gate_missed": [g["name"] for g in missed]}  # fmt: skip
