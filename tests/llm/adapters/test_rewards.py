"""Reward functions in verl's and TRL's signatures: the task/verifier verdicts, from threads, within the deadline."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from posttrain.llm.adapters.rewards import compute_score, scorer, task_reward, trl_rows, verifier_reward, verl_rows
from posttrain.llm.rollout.tasks import Problem, make_task
from posttrain.llm.rollout.verifiers import numeric_match


@pytest.mark.parametrize("name", ["addition", "countdown", "multiple"])
def test_compute_score_on_task_rows_is_the_task_reward(name: str) -> None:
    task = make_task(name)
    rows = verl_rows(name, 8, seed=1)
    rng = random.Random(2)
    for row in rows:
        info = row["extra_info"]
        problem = Problem(info["prompt"], row["reward_model"]["ground_truth"], tuple(info["data"]))
        for completion in (task.solution(problem, rng), problem.answer + "1", ""):
            expected = task.reward(problem, completion)
            assert compute_score(row["data_source"], completion, problem.answer, info) == expected
        assert compute_score(row["data_source"], task.solution(problem, rng), problem.answer, info) == 1.0


def test_compute_score_routes_to_the_named_verifier() -> None:
    assert compute_score("numeric", "so x = 2.50", "2.5") == numeric_match("so x = 2.50", "2.5") == 1.0
    assert compute_score("exact", "2.50", "2.5") == 0.0
    assert compute_score("gsm8k", "2.50", "2.5", {"verifier": "numeric"}) == 1.0


def test_trl_reward_functions_score_strings_and_chat_messages() -> None:
    rows = trl_rows("countdown", 6, seed=3)
    task = make_task("countdown")
    rng = random.Random(0)
    problems = [Problem(r["prompt"], r["answer"], tuple(r["data"])) for r in rows]
    completions = [task.solution(p, rng) if i % 2 else "1+1" for i, p in enumerate(problems)]
    expected = [task.reward(p, c) for p, c in zip(problems, completions, strict=True)]
    reward = task_reward("countdown")
    cols = {"answer": [r["answer"] for r in rows], "data": [r["data"] for r in rows]}
    assert reward(prompts=[r["prompt"] for r in rows], completions=completions, **cols) == expected
    chat = [[{"role": "assistant", "content": c}] for c in completions]
    prompts = [[{"role": "user", "content": r["prompt"]}] for r in rows]
    assert reward(prompts=prompts, completions=chat, trainer_state=None, **cols) == expected
    assert reward.__name__ == "posttrain_countdown"
    assert verifier_reward("numeric")(prompts=["q"], completions=[[{"content": "it is 7"}]], answer=["7"]) == [1.0]


@pytest.mark.slow
def test_math_compute_score_from_threads_returns_within_the_deadline() -> None:
    """verl calls a sync compute_score in executor threads: Math-Verify's SIGALRM timeouts cannot work there."""
    deadline = 2.0
    scorer("math")  # built and warmed once per process (not counted in any verdict's deadline)
    cases = [
        ("The answer is $\\boxed{\\frac{1}{2}}$", "0.5", 1.0),
        ("so $x = 3$", "4", 0.0),
        ("$" + "{" * 3000 + "}" * 3000 + "$", "1", 0.0),  # deeply nested LaTeX
        ("9" * 3500 + "^" + "9" * 400, "1", 0.0),  # huge exponent
        ("__import__('os').system('false')", "0", 0.0),  # code-looking, never executed
    ]
    with ThreadPoolExecutor(max_workers=3) as pool:
        start = time.monotonic()
        futures = [pool.submit(compute_score, "math_dapo", c, g) for c, g, _ in cases]
        results = [f.result(timeout=len(cases) * (deadline + 5)) for f in futures]
    assert results == [expected for _, _, expected in cases]
    # calls are serialised by the verifier's lock: at most one deadline (plus a worker restart) each
    assert time.monotonic() - start < len(cases) * (deadline + 5)
