"""Checks run in worker processes give the same outcomes as in this process (`runner.run_jobs`)."""

from __future__ import annotations

import json

from posttrain.paper_checks.runner import CheckOutcome, default_workers, run_jobs, select_checks


def _portable(o: CheckOutcome) -> str:
    """The outcome as text (NaN spreads of one-seed metrics compare equal as text)."""
    return json.dumps([o.check.id, o.mutant, o.verdict.value, o.error, o.summary], default=float)


def test_two_workers_match_one_in_job_order() -> None:
    checks = select_checks(["20a", "20c"])
    jobs = [(checks[1], None), (checks[0], None), (checks[0], checks[0].mutants[0].name)]
    seen: list[str] = []
    here = run_jobs(jobs, smoke=True, workers=1)
    there = run_jobs(jobs, smoke=True, workers=2, on_done=lambda o: seen.append(o.check.id))
    assert [_portable(o) for o in there] == [_portable(o) for o in here]
    assert sorted(seen) == sorted(c.id for c, _ in jobs)
    assert all(o.config is not None and o.cpu_time_s > 0 for o in there)


def test_default_workers_never_exceed_the_runs() -> None:
    assert default_workers(1) == 1
    assert 1 <= default_workers(50) <= 50
