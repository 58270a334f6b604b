"""The contract section: the package's estimator contract and the properties of the function's form.

Three passes, each finding one line:

1. `posttrain.testing.contract_findings` on fixed inputs with a distinct size per dimension
   (G=2, K=3, B=6, T=5), in float32 and float64: the list every public estimator of the package
   passes. Bad-input items (wrong rank, dtype, shapes, empty mask: ``ShapeError`` / ``DomainError``
   naming the argument) are *validation* findings, grouped one line per item;
2. the valid-input items (no exception, documented shape, finite values and gradients, no input
   mutation, masked positions ignored) searched with hypothesis over `valid_inputs` (continuous and
   binary rewards, constant groups, fully masked rows): a failure is a *defect*, shown with the
   shrunk input;
3. the `PROPERTIES` of the form: contract ones are defects when broken, the others are reported
   as characteristics (holds, or a shrunk counterexample).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import find, settings
from hypothesis.errors import NoSuchExample

from posttrain.arena.inputs import ARGS, SEARCH, describe, valid_inputs
from posttrain.arena.kinds import Form, Subject
from posttrain.arena.properties import PROPERTIES, search
from posttrain.testing import VALID_INPUT_ITEMS, ContractFinding, contract_findings

__all__ = ["ContractReport", "Finding", "PropertyResult", "run_contract"]

G, K, T = 2, 3, 5
B = G * K
SEARCHED_ITEMS = frozenset({"valid-call", "output-shape", "finite", "mutation", "gradient", "masked"})


@dataclass(frozen=True)
class Finding:
    """A broken contract item: ``severity`` is ``defect`` (wrong on valid input), ``validation`` (bad
    input not rejected as the package does) or ``annotation``; ``example`` a shrunk input, if searched."""

    item: str
    severity: str
    message: str
    example: str = ""

    def line(self) -> str:
        return f"{self.item}: {self.message}" + (f" (e.g. {self.example})" if self.example else "")


@dataclass(frozen=True)
class PropertyResult:
    """One property of the form: whether hypothesis found a counterexample, and the shrunk one."""

    id: str
    statement: str
    contract: bool
    holds: bool
    reason: str = ""
    counterexample: str = ""


@dataclass(frozen=True)
class ContractReport:
    findings: tuple[Finding, ...]
    properties: tuple[PropertyResult, ...]

    @property
    def defects(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == "defect")


def _fixed(form: Form, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Canonical valid inputs of ``form`` (a hole and right padding in the mask, a constant group)."""
    g = torch.Generator().manual_seed(1234)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 3:] = False
    mask[1, 1] = False
    rewards = (torch.rand(G, K, generator=g, dtype=torch.float64) < 0.5).to(torch.float64)
    rewards[0] = torch.tensor([0.2, 0.9, 0.4], dtype=torch.float64)
    rewards[1] = 0.7  # a constant group
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) - 0.1
    delta = torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5
    values = {
        "rewards": rewards,
        "mask": mask,
        "token_rewards": torch.randn(B, T, generator=g, dtype=torch.float64),
        "logp": logp,
        "logp_old": logp - delta,
        "advantages": torch.randn(B, generator=g, dtype=torch.float64),
        "logp_ref": logp + delta,
    }
    return {n: (values[n] if n == "mask" else values[n].to(dtype)) for n in ARGS[form]}


def _named(s: Subject, ex: dict[str, Any]) -> dict[str, Any]:
    """Canonical names -> the function's own parameter names (so errors naming them match)."""
    return {mine: ex[canon] for canon, mine in zip(ARGS[s.form], s.params, strict=True)}


def _options(s: Subject) -> dict[str, Any]:
    first = s.params[0]
    if s.form is Form.GROUPED:
        return {"output_shape": lambda kw: tuple(kw[first].shape), "mask_arg": None}
    mask = s.params[1] if s.form in (Form.GROUPED_MASKED, Form.TOKEN) else s.params[3] if s.form is Form.LOSS else None
    shape: Callable[[Any], tuple[int, ...]] = lambda kw: tuple(kw[mask or first].shape)  # noqa: E731
    return {"output_shape": shape, "mask_arg": mask, **({"grad_args": [first]} if s.form is Form.LOSS else {})}


def _call_by_keyword(s: Subject) -> Callable[..., Any]:
    def call(**kw: Any) -> Any:
        return s.fn(*(kw[p] for p in s.params))

    call.__name__ = s.name
    return call


def _fixed_findings(s: Subject) -> list[Finding]:
    found = contract_findings(s.fn, lambda dt: _named(s, _fixed(s.form, dt)), **_options(s))
    by_item: dict[str, list[ContractFinding]] = {}
    for f in found:
        by_item.setdefault(f.item, []).append(f)
    out = []
    for item, fs in by_item.items():
        severity = "annotation" if item == "annotations" else "defect" if item in VALID_INPUT_ITEMS else "validation"
        more = f" (and {len(fs) - 1} more)" if len(fs) > 1 else ""
        out.append(Finding(item, severity, fs[0].message + more))
    return out


def _searched_findings(s: Subject, skip: set[str], max_examples: int) -> list[Finding]:
    """Valid-input items broken on some drawn input: the shrunk input of each (up to three searches)."""
    call, options = _call_by_keyword(s), _options(s)
    out: list[Finding] = []
    remaining = set(SEARCHED_ITEMS) - skip

    def broken(ex: dict[str, Any], items: set[str]) -> list[ContractFinding]:
        named = _named(s, ex)
        return contract_findings(call, lambda dt: named, items=items, dtypes=(torch.float64,), **options)

    for _ in range(3):
        if not remaining:
            break
        items = set(remaining)

        def fails(ex: dict[str, Any], it: set[str] = items) -> bool:
            return bool(broken(ex, it))

        try:
            ex = find(valid_inputs(s.form), fails, settings=settings(SEARCH, max_examples=max_examples))
        except NoSuchExample:
            break
        fs = broken(ex, items)
        for f in {f.item: f for f in fs}.values():
            out.append(Finding(f.item, "defect", f.message, describe(ex)))
            remaining.discard(f.item)
    return out


def run_contract(s: Subject, *, max_examples: int = 120) -> ContractReport:
    """The three passes of the module docstring for ``s``."""
    findings = _fixed_findings(s)
    findings += _searched_findings(s, {f.item for f in findings if f.severity == "defect"}, max_examples)
    results = []
    for prop in PROPERTIES[s.form]:
        hit = search(s.fn, s.form, prop, max_examples=max_examples)
        if hit is None:
            results.append(PropertyResult(prop.id, prop.statement, prop.contract, True))
            continue
        reason, ex = hit
        results.append(PropertyResult(prop.id, prop.statement, prop.contract, False, reason, describe(ex)))
        if prop.contract:
            findings.append(Finding(prop.id, "defect", f"{prop.statement}: {reason}", describe(ex)))
    return ContractReport(tuple(findings), tuple(results))
