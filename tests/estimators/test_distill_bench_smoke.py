"""The issue-5 benchmark script at a tiny size, so that it cannot rot (its loop reference is asserted equal)."""

from __future__ import annotations

import pytest

from benchmarks.bench_distill import main


def test_distill_benchmark_runs_small(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--small"])
    out = capsys.readouterr().out
    assert "OPD token reverse KL" in out and "top-k reverse KL" in out
