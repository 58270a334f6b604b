"""The pair-design benchmark runs end to end at a tiny size and both solvers agree there."""

from __future__ import annotations

import re

import pytest

from benchmarks.bench_dpo_design import main


def test_small_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--small"])
    out = capsys.readouterr().out
    rel = float(re.search(r"FW objective vs cvxpy: ([+-][0-9.]+)%", out).group(1))  # type: ignore[union-attr]
    assert rel <= 1.0  # FW stops at a 1% relative duality gap, an upper bound on its suboptimality
    assert "speed-up cvxpy / FW" in out
