"""The issue-6 benchmark script at a tiny size, so that it cannot rot."""

from __future__ import annotations

from benchmarks.bench_offpolicy import main


def test_offpolicy_benchmark_runs_small(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--small"]) == 0
    out = capsys.readouterr().out
    assert "SIS loss" in out and "replay_select" in out
