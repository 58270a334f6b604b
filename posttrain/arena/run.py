"""`judge`: run every section of the arena on one function and gather the `ArenaReport`."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posttrain.arena.contract import ContractReport, run_contract
from posttrain.arena.conventions import run_conventions
from posttrain.arena.curves import CurveConfig, Curves, judge_curves, reached_bounds, run_curves
from posttrain.arena.exact import Budget, GradientStats, ValueStats, default_toys, gradient_stats
from posttrain.arena.kinds import DEFAULT_BASELINES, Form, Kind, Subject, registered, subject
from posttrain.arena.properties import PROPERTIES, search
from posttrain.arena.report import ArenaReport, Cost, figure, write_report
from posttrain.errors import DomainError

__all__ = ["judge"]

_INDEPENDENCE = {
    Form.GROUPED: "groups-independent",
    Form.GROUPED_MASKED: "groups-independent",
    Form.TOKEN: "rows-independent",
    Form.LOSS: "rows-independent",
}


def _independent(s: Subject, contract: ContractReport | None = None) -> bool:
    """Whether ``s`` may be called on many draws' (seeds') groups at once: its independence property holds."""
    prop_id = _INDEPENDENCE.get(s.form)
    if prop_id is None:
        return True
    if contract is not None:
        return next(p.holds for p in contract.properties if p.id == prop_id)
    prop = next(p for p in PROPERTIES[s.form] if p.id == prop_id)
    return search(s.fn, s.form, prop, max_examples=40) is None


class _Clock:
    """CPU seconds per section of the run."""

    def __init__(self) -> None:
        self.sections: dict[str, float] = {}
        self._start = time.process_time()

    def lap(self, name: str) -> None:
        now = time.process_time()
        self.sections[name] = self.sections.get(name, 0.0) + now - self._start
        self._start = now


def judge(
    fn: Callable[..., Any],
    *,
    kind: Kind | str | None = None,
    baselines: Sequence[str] | None = None,
    seeds: int = 64,
    name: str | None = None,
    out: str | Path | None = None,
    budget: Budget = Budget(),
    curve_config: CurveConfig | None = None,
    max_examples: int = 120,
) -> ArenaReport:
    """Judge ``fn`` as an estimator of ``kind`` (inferred from its parameter names when None).

    Sections: the contract and the form's properties (`posttrain.arena.contract`), the registered
    estimators and framework modes it equals (`posttrain.arena.conventions`), its gradient's bias and
    variance on exact toys (`posttrain.arena.exact`), and learning curves against ``baselines``
    (registered names of the same kind; default `DEFAULT_BASELINES`) over ``seeds`` paired seeds,
    judged by the paper checks' statistics (`posttrain.arena.curves`). A section that raises is
    reported in ``errors`` and the others still run. With ``out`` the report is written there
    (``report.json``, ``report.md``, ``arena.png``).

    Raises:
        DomainError: an unknown kind, or ``fn`` without a signature of ``kind``.
        RegistryError: an unknown baseline name.
    """
    if int(seeds) < 2:
        raise DomainError(f"seeds: the learning curves' paired comparisons need at least 2 seeds, got {seeds!r}")
    wall, cpu = time.perf_counter(), time.process_time()
    clock = _Clock()
    s = subject(name or str(getattr(fn, "__name__", repr(fn))), fn, kind)
    base_names = tuple(baselines) if baselines else DEFAULT_BASELINES[s.kind]
    bases = [registered(s.kind, b) for b in base_names]
    cfg = curve_config or CurveConfig(seeds=seeds)
    errors: dict[str, str] = {}

    contract = run_contract(s, max_examples=max_examples)
    clock.lap("contract")
    conventions = run_conventions(s, max_examples=max_examples)
    clock.lap("conventions")
    everyone = [(s, _independent(s, contract))] + [(b, _independent(b)) for b in bases]

    gradients: dict[str, list[GradientStats]] = {}
    off_policy: dict[str, list[GradientStats]] = {}
    values: dict[str, list[ValueStats]] = {}
    toys = default_toys()
    for who, independent in everyone:
        try:
            gradients[who.name], vals = gradient_stats(who, toys, independent=independent, budget=budget)
            if vals:
                values[who.name] = vals
            if s.kind is Kind.LOSS:
                off_policy[who.name], _ = gradient_stats(
                    who, toys, independent=independent, budget=budget, off_policy=True
                )
        except Exception as exc:  # reported; the other sections still run
            errors[f"exact toys ({who.name})"] = f"{type(exc).__name__}: {exc}"
    clock.lap("exact toys")

    runs: dict[str, Curves] = {}
    for who, independent in everyone:
        try:
            runs[who.name] = run_curves(who, independent=independent, cfg=cfg)
        except Exception as exc:
            errors[f"learning curves ({who.name})"] = f"{type(exc).__name__}: {exc}"
    endpoints = []
    if s.name in runs:
        endpoints = judge_curves(runs[s.name], {b.name: runs[b.name] for b in bases if b.name in runs}, s.kind, cfg)
    clock.lap("learning curves")

    curves = {who: c.reward.mean(-1).tolist() for who, c in runs.items()}
    reached = {who: (c.reached, cfg.seeds, *reached_bounds(c, cfg)) for who, c in runs.items()}
    report = ArenaReport(
        s.name, s.kind.value, s.form.value, s.signature, base_names, contract, conventions, gradients, off_policy,
        values, cfg, curves, reached, endpoints, errors, Cost(0.0, 0.0, os.getloadavg()),
        {t.name: t.off_policy_kl() for t in toys},
    )  # fmt: skip
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        figure(report, Path(out) / "arena.png")
        clock.lap("report")
    cost = Cost(time.process_time() - cpu, time.perf_counter() - wall, os.getloadavg(), clock.sections)
    report = dataclasses.replace(report, cost=cost)
    if out is not None:
        write_report(report, Path(out), draw=False)
    return report
