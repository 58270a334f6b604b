"""Slow verifier inputs cannot stall a step: a batch is judged in parallel and returns within its budget.

Findings covered: slow Math-Verify inputs (``9**9**9**9``, ``\\boxed{9^{9^{9^{9}}}}``) judged one at a
time, each costing its deadline plus a worker restart, so a batch of them stalled the step.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest

from posttrain.errors import DomainError
from posttrain.llm.rollout.judge_pool import JudgePool
from posttrain.llm.rollout.tasks import make_task
from tests.llm.rollout._sleepy_worker import sleepy_worker


def _pool(workers: int, deadline_s: float) -> JudgePool:
    pool = JudgePool(sleepy_worker, workers=workers, deadline_s=deadline_s, ready_budget_s=60.0)
    pool.warm_up()
    return pool


def test_pairs_run_in_parallel_and_slow_ones_time_out() -> None:
    pool = _pool(workers=3, deadline_s=1.0)
    try:
        pairs = [("9", "9"), ("9", "9")] + [("0", "0"), ("1", "0")] * 3  # two slow, six instant
        start = time.monotonic()
        out = pool.judge(pairs, budget_s=5.0)
        elapsed = time.monotonic() - start
        assert [s for s, _ in out[:2]] == ["timeout", "timeout"] and all(math.isnan(r) for _, r in out[:2])
        assert out[2:] == [("ok", 1.0), ("ok", 0.0)] * 3  # the third worker served them meanwhile
        assert elapsed < 1.0 + 0.8, elapsed  # one deadline, not two (plus the time to kill)
        sleeps = [("0.4", "0.4")] * 3
        pool.warm_up()  # the replacements of the two killed workers are ready
        start = time.monotonic()
        assert pool.judge(sleeps, budget_s=5.0) == [("ok", 1.0)] * 3
        assert time.monotonic() - start < 0.4 * 2, "three 0.4 s verdicts on three workers run side by side"
    finally:
        pool.close()


def test_the_budget_bounds_the_batch_and_the_rest_is_unjudged() -> None:
    pool = _pool(workers=2, deadline_s=10.0)
    try:
        start = time.monotonic()
        out = pool.judge([("30", "30")] * 5, budget_s=1.0)
        elapsed = time.monotonic() - start
        assert elapsed < 1.0 + 0.8, elapsed
        assert [s for s, _ in out] == ["over_budget"] * 5 and all(math.isnan(r) for _, r in out)
        again = pool.judge([("0", "0")], budget_s=30.0)  # killed workers were replaced; the pool serves on
        assert again == [("ok", 1.0)]
    finally:
        pool.close()


def test_a_dead_worker_is_replaced_and_its_pair_retried_once() -> None:
    pool = _pool(workers=1, deadline_s=30.0)
    try:
        pid = pool.pids[0]
        os.kill(pid, 9)
        out = pool.judge([("0", "0")], budget_s=30.0)
        assert out == [("ok", 1.0)] and pool.pids != [pid]
    finally:
        pool.close()
    assert pool.pids == []


def test_the_budget_is_a_task_option(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "q", "answer": "1"}) + "\n")
    task = make_task("jsonl", path=str(path), verifier_budget_s=5.0)
    assert task.verifier_budget_s == 5.0  # type: ignore[attr-defined]
    for bad in (0, -1.0, math.nan, math.inf, True, "5"):
        with pytest.raises(DomainError, match=r"data\.options\.verifier_budget_s"):
            make_task("jsonl", path=str(path), verifier_budget_s=bad)


SLOW = ["9**9**9**9", "\\boxed{9^{9^{9^{9}}}}", "$10^{10^{10^{10}}}$", "\\boxed{100000!}"]


def _batch(tmp_path: Path, budget: float) -> tuple[object, list[object], list[str]]:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+0=", "answer": str(i)}) + "\n" for i in range(8)))
    task: object = make_task("jsonl", path=str(path), verifier="math", verifier_budget_s=budget)
    problems = task._problems  # type: ignore[attr-defined]
    return task, [problems[0]] * len(SLOW) + problems, SLOW + [f"\\boxed{{{p.answer}}}" for p in problems]


@pytest.mark.slow
def test_slow_math_inputs_finish_within_the_task_budget(tmp_path: Path) -> None:
    """A task's batch of 4 slow and 8 ordinary completions returns within its budget, on the default pool; no
    slow one is rewarded, no ordinary one is scored wrong (each is right, or unjudged when the budget ran out)."""
    pytest.importorskip("math_verify", reason="needs math-verify")
    budget = 8.0
    task, problems, completions = _batch(tmp_path, budget)
    verifier = task._score  # type: ignore[attr-defined]
    try:
        verifier.warm_up()
        start = time.monotonic()
        rewards = task.rewards(problems, completions)  # type: ignore[attr-defined]
        elapsed = time.monotonic() - start
        print(f"default pool ({verifier.workers} workers): batch of {len(completions)} ({len(SLOW)} slow) "
              f"{elapsed:.1f} s, budget {budget} s, load {os.getloadavg()[0]:.1f}, rewards {rewards}")  # fmt: skip
        assert elapsed < budget + 1.0, elapsed
        assert all(math.isnan(r) or r == 0.0 for r in rewards[: len(SLOW)])  # unjudged, or judged wrong
        assert all(math.isnan(r) or r == 1.0 for r in rewards[len(SLOW) :])
    finally:
        verifier.close()


@pytest.mark.slow
def test_with_more_workers_than_slow_inputs_the_rest_is_judged(tmp_path: Path) -> None:
    """The slow inputs hold one worker each until their deadline; the remaining worker judges the rest meanwhile."""
    pytest.importorskip("math_verify", reason="needs math-verify")
    from posttrain.llm.rollout.verifiers import MathVerifier, judge_all

    _, problems, completions = _batch(tmp_path, 8.0)
    verifier = MathVerifier(workers=len(SLOW) + 1, deadline_s=2.0)
    try:
        verifier.warm_up()
        start = time.monotonic()
        rewards = judge_all(verifier, completions, [p.answer for p in problems], budget_s=8.0)  # type: ignore[attr-defined]
        elapsed = time.monotonic() - start
        print(f"{verifier.workers} workers: {elapsed:.1f} s, load {os.getloadavg()[0]:.1f}, rewards {rewards}")
        assert elapsed < 8.0 + 1.0, elapsed
        assert rewards[len(SLOW) :] == [1.0] * (len(completions) - len(SLOW))
        assert all(math.isnan(r) or r == 0.0 for r in rewards[: len(SLOW)])
    finally:
        verifier.close()


def test_a_mixture_scores_each_domain_as_one_batch(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(4)))
    task = make_task("mixture", tasks={"file": {"task": "jsonl", "options": {"path": str(path)}}, "add": "addition"})
    import random

    problems = task.sample(random.Random(0), 12)
    completions = [p.answer if i % 3 else "x" for i, p in enumerate(problems)]
    batched = task.rewards(problems, completions)  # type: ignore[attr-defined]
    assert batched == [task.reward(p, c) for p, c in zip(problems, completions, strict=True)]
    assert {p.domain for p in problems} == {0, 1} and 0.0 in batched and 1.0 in batched


EXITING = """
import sys
from posttrain.llm.rollout.judge_pool import JudgePool
from tests.llm.rollout._sleepy_worker import sleepy_worker

pool = JudgePool(sleepy_worker, workers=2, deadline_s=5.0, ready_budget_s=60.0)
assert pool.judge([("0", "0"), ("30", "30")], budget_s=0.5)[0] == ("ok", 1.0)
print(" ".join(map(str, pool.pids)), flush=True)
raise SystemExit(3) if sys.argv[1] == "exit" else RuntimeError("the trainer failed")
"""


@pytest.mark.parametrize("how", ["exit", "error"])
def test_workers_end_with_the_process_that_owns_them(tmp_path: Path, how: str) -> None:
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-c", EXITING, how], cwd=repo, capture_output=True, text=True, timeout=120)
    assert done.returncode in (1, 3), done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) >= 2  # the workers and the spare left after the over-budget one was killed
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.1)
    assert alive == [], "worker processes outlived their owner"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/status") as f:  # a zombie is dead but not yet reaped by its (dead) parent
        return "zombie" not in f.read()
