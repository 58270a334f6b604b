"""Helpers for the paper-check tests: the recorded full-run verdicts and the smoke-size directions.

:func:`assert_matches_recorded` compares a full-config run with what the full ``posttrain check`` run
recorded in ``docs/paper_checks/results.json`` (the file the README method table is generated from):
the same verdict and the same outcome (holds / excluded / undecided) of every judged comparison, the
primary and the secondary ones. :func:`smoke_misses` lists the judged comparisons whose direction
fails on a smoke run, which is too small for their bounds but large enough to show the effect's sign.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from posttrain.paper_checks.model import Criterion, Result, Role
from posttrain.paper_checks.readme_table import STORED_RESULTS
from posttrain.paper_checks.stats import Outcome, compare, verdict_of

ROOT = Path(__file__).resolve().parents[2]


def recorded(check_id: str) -> dict[str, Any]:
    path = ROOT / STORED_RESULTS
    assert path.exists(), f"{path} is missing: run `posttrain check --out reports --mutants --update-readme`"
    checks = {c["id"]: c for c in json.loads(path.read_text())["checks"]}
    assert check_id in checks, f"check {check_id} is not in {path}"
    return checks[check_id]


def assert_matches_recorded(check_id: str, result: Result) -> None:
    """The full run's verdict and every judged comparison's outcome equal the recorded ones."""
    rec = recorded(check_id)
    now = {c.name: compare(c).outcome.value for c in result.comparisons if c.role is not Role.CONTEXT}
    then = {c["name"]: c["outcome"] for c in rec["comparisons"] if c["role"] != Role.CONTEXT.value}
    assert now == then, {k: (then.get(k), now.get(k)) for k in now.keys() | then.keys() if now.get(k) != then.get(k)}
    assert verdict_of(result).value == rec["verdict"]


def smoke_misses(result: Result, prefix: str | tuple[str, ...] = "") -> list[str]:
    """Judged comparisons (names starting with ``prefix``, or one of several) whose direction fails at smoke size.

    A quantile criterion must clear its margin in every smoke seed, a mean criterion must have its
    mean above the margin, an exact one must hold.
    """
    misses = []
    for c in result.comparisons:
        if c.role is Role.CONTEXT or not c.name.startswith(prefix):
            continue
        d = np.asarray(c.differences)
        if c.kind is Criterion.QUANTILE:
            ok = bool(np.all(d > c.margin))
        elif c.kind is Criterion.MEAN:
            ok = bool(d.mean() > c.margin)
        else:
            ok = compare(c).outcome is Outcome.HOLDS
        if not ok:
            misses.append(c.name)
    return misses
