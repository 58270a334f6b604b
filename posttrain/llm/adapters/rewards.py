"""Reward functions over our verifiers and tasks, in verl's ``compute_score`` and TRL's ``reward_funcs`` signatures.

Neither verl nor TRL is imported here. Both call rewards from threads (verl runs a synchronous
``compute_score`` in an executor; TRL may too), where Math-Verify's own ``SIGALRM`` timeouts fail: the
``math`` verifier is our `MathVerifier` (worker processes, our
deadline), built and warmed once per process by `scorer` and safe from any thread.

- verl: ``reward.custom_reward_function.path=<this file>`` (``python -c "import posttrain.llm.adapters.rewards
  as m; print(m.__file__)"``), ``.name=compute_score``. `compute_score` scores ``data_source
  "posttrain/<task>"`` rows with the task (``extra_info`` carries ``prompt`` and ``data``, see
  `verl_rows`) and any other row with the verifier named by ``extra_info["verifier"]``, else by
  ``data_source`` when it names one (``exact``, ``numeric``, ``math``), else ``math``.
- TRL: ``reward_funcs=[task_reward("countdown")]`` or ``[verifier_reward("math")]`` over a dataset with
  ``prompt`` and ``answer`` columns (and ``data`` for tasks, see `trl_rows`).
"""

from __future__ import annotations

import math
import random
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from posttrain.llm.rollout.tasks import Problem, Task, make_task
from posttrain.llm.rollout.verifiers import VERIFIERS

__all__ = [
    "DEFAULT_VERIFIER",
    "TASK_PREFIX",
    "compute_score",
    "scorer",
    "task_reward",
    "text_of",
    "trl_rows",
    "verifier_reward",
    "verl_rows",
]

DEFAULT_VERIFIER = "math"
"""Verifier of rows whose ``data_source`` names neither a task nor a verifier (math datasets)."""

TASK_PREFIX = "posttrain/"
"""``data_source`` prefix of rows scored by one of our synthetic tasks."""

RewardFn = Callable[..., list[float | None]]


def _judged(score: float) -> float | None:
    """TRL's "no reward" for a verdict not reached (NaN from the verifier): ``None`` is excluded from the group."""
    return None if math.isnan(score) else score


_LOCK = threading.Lock()
_SCORERS: dict[tuple[str, tuple[tuple[str, Any], ...]], Callable[[str, str], float]] = {}


def scorer(name: str, **options: Any) -> Callable[[str, str], float]:
    """The verifier registered as ``name`` with ``options``, built once per process (Math-Verify warmed up).

    Examples:
        >>> scorer("numeric")("so 4.0", "4")
        1.0
    """
    key = (name, tuple(sorted(options.items())))
    with _LOCK:
        if key not in _SCORERS:
            factory: Any = VERIFIERS.get(name)
            verifier = factory(**options)
            warm_up = getattr(verifier, "warm_up", None)
            if callable(warm_up):
                warm_up()  # import Math-Verify in the workers now, outside any verdict's deadline
            _SCORERS[key] = verifier
        return _SCORERS[key]


def _task(name: str, options: Sequence[tuple[str, Any]] = ()) -> Task:
    return make_task(name, **dict(options))


def text_of(item: Any) -> str:
    """A completion or prompt as text: a string as is, a chat message list as its last message's content.

    Examples:
        >>> text_of("12"), text_of([{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}])
        ('12', '2')
    """
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        return str(item.get("content", ""))
    if isinstance(item, Sequence) and item:
        return text_of(item[-1])
    return ""


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None, **_: Any
) -> float:
    """verl's custom reward function: a reward in ``[0, 1]`` for one response, within the verifier's deadline.

    Args:
        data_source: ``"posttrain/<task>"`` (a task of `posttrain.llm.rollout.tasks`), a verifier name, or
            anything else (scored by `DEFAULT_VERIFIER`).
        solution_str: the decoded response.
        ground_truth: the gold answer (``reward_model.ground_truth``).
        extra_info: ``prompt`` and ``data`` (task rows), ``verifier`` (overrides the choice), ``task_options``.

    Examples:
        >>> compute_score("posttrain/countdown", "3*5+7", "3*5+7", {"prompt": "3,5,7>22:", "data": [3, 5, 7]})
        1.0
        >>> compute_score("numeric", "the answer is 0.5", "1/2"), compute_score("exact", " 42", "42")
        (0.0, 1.0)
    """
    info = extra_info or {}
    if data_source.startswith(TASK_PREFIX):
        task = _task(data_source[len(TASK_PREFIX) :], tuple(sorted(dict(info.get("task_options") or {}).items())))
        problem = Problem(str(info.get("prompt", "")), str(ground_truth), tuple(int(x) for x in info.get("data") or ()))
        return float(task.reward(problem, solution_str))
    name = info.get("verifier") or (data_source if data_source in VERIFIERS else DEFAULT_VERIFIER)
    score = float(scorer(str(name))(solution_str, str(ground_truth)))
    if math.isnan(score):  # verl has no per-sample exclusion: 0, but never silently
        warnings.warn(
            f"compute_score: the {name!r} verifier's verdict was not judged (timeout or no worker); scored 0.0",
            RuntimeWarning,
            stacklevel=2,
        )
        return 0.0
    return score


def task_reward(name: str, **options: Any) -> RewardFn:
    """TRL reward function scoring completions with the task ``name`` (columns ``answer`` and ``data``).

    Examples:
        >>> r = task_reward("multiple")
        >>> r(prompts=["m7<50:", "m7<50:"], completions=["14", "15"], answer=["7", "7"], data=[[7, 50], [7, 50]])
        [1.0, 0.0]
    """
    task = _task(name, tuple(sorted(options.items())))

    def reward(
        prompts: list[Any], completions: list[Any], answer: list[Any], data: list[Any] | None = None, **_: Any
    ) -> list[float | None]:
        datas = data if data is not None else [()] * len(prompts)
        return [
            _judged(float(task.reward(Problem(text_of(p), str(a), tuple(int(x) for x in d or ())), text_of(c))))
            for p, c, a, d in zip(prompts, completions, answer, datas, strict=True)
        ]

    reward.__name__ = f"posttrain_{name}"  # TRL logs rewards under the function's name
    return reward


def verifier_reward(name: str = DEFAULT_VERIFIER, **options: Any) -> RewardFn:
    """TRL reward function scoring completions against the ``answer`` column with the verifier ``name``.

    Examples:
        >>> verifier_reward("numeric")(prompts=["q", "q"], completions=["x = 3", "4"], answer=["3", "3"])
        [1.0, 0.0]
    """

    def reward(prompts: list[Any], completions: list[Any], answer: list[Any], **_: Any) -> list[float | None]:
        score = scorer(name, **options)
        return [_judged(float(score(text_of(c), str(a)))) for c, a in zip(completions, answer, strict=True)]

    reward.__name__ = f"posttrain_{name}"
    return reward


def trl_rows(name: str, n: int, *, seed: int = 0, **options: Any) -> list[dict[str, Any]]:
    """``n`` problems of task ``name`` as TRL dataset rows ``{"prompt", "answer", "data"}``.

    Examples:
        >>> trl_rows("addition", 1, seed=0, digits=1)[0].keys()
        dict_keys(['prompt', 'answer', 'data'])
    """
    problems = make_task(name, **options).sample(random.Random(seed), n)
    return [{"prompt": p.prompt, "answer": p.answer, "data": list(p.data)} for p in problems]


def verl_rows(name: str, n: int, *, seed: int = 0, **options: Any) -> list[dict[str, Any]]:
    """``n`` problems of task ``name`` as verl dataset rows (write them to parquet for ``data.train_files``).

    Each row has ``data_source = "posttrain/<name>"``, a chat ``prompt``, ``reward_model.ground_truth``
    and ``extra_info`` with the raw prompt, task data and options, which `compute_score` reads.
    """
    return [
        {
            "data_source": TASK_PREFIX + name,
            "prompt": [{"role": "user", "content": row["prompt"]}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": row["answer"]},
            "extra_info": {"prompt": row["prompt"], "data": row["data"], "index": i}
            | ({"task_options": dict(options)} if options else {}),  # parquet cannot store an empty struct
        }
        for i, row in enumerate(trl_rows(name, n, seed=seed, **options))
    ]
