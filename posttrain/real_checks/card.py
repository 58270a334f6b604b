"""Transfer cards: what a toy check's effect becomes on a real model, what explains it, and the regime it needs.

A card is written before any run (it is part of the experiment's declaration and is stored with its
results). It names

- the toy checks it transfers (``toy_ids``); their primary endpoint is *read* from the registered
  check (`PaperCheck.abstract`, `PaperCheck.claim`) and from the stored toy results
  (``docs/paper_checks/results.json``: the primary comparison's name, numbers and verdict), never
  copied, so the card follows the toy when its primary changes (`toy_primary`);
- ``effect``: the toy's primary effect in a unit that carries over to a language model (e.g. the paired
  difference of held-out accuracy at equal samples);
- ``mediators``: the diagnostics that explain the effect, each with the range the toy tested (`ToyRange`,
  read from the toy's stored per-seed metrics where the toy measures it, else declared with its origin);
  the regime gate (`posttrain.real_checks.gate`) measures them on the real model;
- ``regime``: the regime variables of the real experiment (reward granularity, base accuracy p0,
  off-policy lag, rollout budget), as text.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

__all__ = [
    "TOY_RESULTS",
    "Mediator",
    "Source",
    "ToyRange",
    "TransferCard",
    "declared",
    "toy_metric_range",
    "toy_primary",
]

TOY_RESULTS = Path(__file__).resolve().parents[2] / "docs" / "paper_checks" / "results.json"
"""The stored full run of the toy checks (written by ``posttrain check --out ... --update-readme``)."""


@functools.cache
def _toy_results(path: str) -> dict[str, dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        return {}
    return {c["id"]: c for c in json.loads(p.read_text()).get("checks", [])}


@dataclass(frozen=True)
class ToyRange:
    """The values of a mediator the toy check tested, ``[lo, hi]``, and where they come from."""

    lo: float
    hi: float
    origin: str

    def contains(self, value: float) -> bool:
        return math.isfinite(value) and self.lo <= value <= self.hi

    def as_dict(self) -> dict[str, Any]:
        return {"lo": self.lo, "hi": self.hi, "origin": self.origin}


def declared(lo: float, hi: float, origin: str) -> Callable[[], ToyRange]:
    """A range fixed by the toy's construction (``origin`` says which config field or design fixes it)."""
    return lambda: ToyRange(float(lo), float(hi), origin)


def toy_metric_range(
    check_id: str, *names: str, combine: Callable[..., float] | None = None, path: Path = TOY_RESULTS
) -> Callable[[], ToyRange]:
    """The range of the per-seed values of the toy check's stored metrics ``names`` (read when the gate runs).

    With ``combine``, the range of ``combine(*values of names on one seed)`` over seeds (e.g. a difference).
    An unknown check or metric gives ``[nan, nan]`` (no regime can be matched; the gate says why).
    """

    def read() -> ToyRange:
        check = _toy_results(str(path)).get(check_id, {})
        found = {m["name"]: m["per_seed"] for m in check.get("metrics", []) if m["name"] in names}
        rows: list[Any] = []
        if combine is None:
            rows = [v for n in names for v in found.get(n, [])]
        elif all(n in found for n in names):
            rows = [combine(*vals) for vals in zip(*(found[n] for n in names), strict=True)]
        values = [float(v) for v in rows if v is not None and math.isfinite(float(v))]
        what = ", ".join(repr(n) for n in names)
        where = f"toy {check_id}: per-seed {what}{' combined' if combine else ''} in {path.name}"
        if not values:
            return ToyRange(math.nan, math.nan, f"{where} (not found)")
        return ToyRange(min(values), max(values), where)

    return read


class Source(StrEnum):
    """Where a mediator is measured: a first rollout batch of the base model, or the first steps of a run."""

    PROBE = "probe"
    RUN = "run"


@dataclass(frozen=True)
class Mediator:
    """A diagnostic that explains the toy's effect, the range the toy tested, and where the real one is measured.

    ``key``: the probe's metric (`posttrain.real_checks.probe.probe_metrics`) or, for a run mediator, a
    function of the arms' first-step logs (`posttrain.real_checks.gate.RUN_MEDIATORS`).
    """

    name: str
    key: str
    meaning: str
    toy: Callable[[], ToyRange]
    source: Source = Source.PROBE

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "meaning": self.meaning, "source": self.source.value,
                "toy": self.toy().as_dict()}  # fmt: skip


def toy_primary(check_id: str, *, path: Path = TOY_RESULTS) -> dict[str, Any]:
    """The toy check's claim and abstract sentence (registered check) and its primary row (stored results)."""
    from posttrain.paper_checks import CHECKS, load_all

    load_all()
    out: dict[str, Any] = {"id": check_id}
    if check_id in CHECKS.names():
        check = CHECKS.get(check_id)
        out.update(paper=check.paper, claim=check.claim, abstract=check.abstract)
    stored = _toy_results(str(path)).get(check_id)
    if stored is not None:
        rows = [c for c in stored["comparisons"] if c["role"] == "primary"]
        out["verdict"] = stored["verdict"]
        if rows:
            p = rows[0]
            out["primary"] = {
                k: p.get(k) for k in ("name", "kind", "estimate", "lower", "upper", "margin", "mean", "n")
            }
            out["primary"]["differences"] = list(p.get("differences", []))
    return out


@dataclass(frozen=True)
class TransferCard:
    """The declaration written before any run (module docstring)."""

    toy_ids: tuple[str, ...]
    effect: str
    mediators: tuple[Mediator, ...] = ()
    regime: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "toy": [toy_primary(i) for i in self.toy_ids],
            "effect": self.effect,
            "mediators": [m.as_dict() for m in self.mediators],
            "regime": dict(self.regime),
        }
