"""Evaluation on held-out prompts: unbiased pass@k and mean@k over n samples, greedy accuracy, length, entropy.

Held-out prompts come from ``random.Random(seed + HELD_OUT_OFFSET)``, a stream the training data
(``random.Random(seed)``) never uses; with a finite task (JSONL) the two can still overlap.

A reward that could not be computed (NaN: a reward function's None, a verifier out of time) is counted
in ``unjudged`` and never scored 0: ``pass@k`` / ``mean@k`` average over the prompts whose samples were
all judged (``judged_prompts``), ``reward_mean`` and ``greedy_accuracy`` over the judged samples; a metric
with nothing to average is NaN (the CLI prints it as "-" and says why).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from posttrain.errors import DomainError
from posttrain.estimators import mean_at_k, pass_at_k
from posttrain.llm.rollout.engine import HFEngine, RolloutEngine, SamplingConfig
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.rollout.tasks import Task
from posttrain.llm.rollout.text import encode_prompts, score_responses

__all__ = ["HELD_OUT_OFFSET", "eval_metric_names", "evaluate", "held_out_problems"]

HELD_OUT_OFFSET = 1_000_003


def eval_metric_names(ks: Sequence[int] = (1,)) -> list[str]:
    """The keys of `evaluate`'s result for ``ks`` (the trainer's validation uses ``ks=(1,)``:
    ``logging.eval_metric`` must be one of these).

    Examples:
        >>> eval_metric_names((1, 4))[:4]
        ['pass@1', 'pass@4', 'mean@1', 'mean@4']
    """
    return [
        *(f"pass@{k}" for k in ks),
        *(f"mean@{k}" for k in ks),
        "reward_mean",
        "greedy_accuracy",
        "response_len",
        "entropy",
        "unjudged",
        "judged_prompts",
        "zero_variance_prompts",
    ]


def _mean(values: np.ndarray) -> float:
    """The mean, NaN for no values (without numpy's empty-slice warning)."""
    return float(values.mean()) if values.size else math.nan


def held_out_problems(task: Task, seed: int, n: int) -> list[Any]:
    """``n`` evaluation problems, disjoint in RNG stream from training."""
    held_out = getattr(task, "held_out", None)  # a dataset task's evaluation split
    return (held_out or task.sample)(random.Random(seed + HELD_OUT_OFFSET), n)  # type: ignore[no-any-return]


def evaluate(
    model: Any,
    tokenizer: Any,
    task: Task,
    *,
    n_prompts: int,
    n_samples: int,
    ks: Sequence[int] = (1,),
    seed: int = 0,
    sampling: SamplingConfig | None = None,
    chat_template: bool = False,
    system: str | None = None,
    engine: RolloutEngine | None = None,
) -> dict[str, float]:
    """Metrics of ``model`` on ``n_prompts`` held-out problems, ``n_samples`` samples each.

    Returns a flat dict: ``pass@k`` and ``mean@k`` for each k (unbiased, Chen et al. 2021,
    averaged over the prompts whose samples were all judged), ``reward_mean`` (mean judged sampled
    reward), ``greedy_accuracy`` (over judged greedy answers), ``response_len`` (mean sampled tokens,
    ``<eos>`` included), ``entropy`` (mean token entropy along the sampled responses, nats),
    ``unjudged`` (sampled completions whose reward could not be computed), ``judged_prompts`` and
    ``zero_variance_prompts`` (the share of the judged prompts whose samples all got the same reward: a group
    advantage would be 0 on each; NaN with one sample per prompt).
    A metric with nothing to average is NaN.
    """
    if any(k < 1 or k > n_samples for k in ks):
        raise DomainError(f"ks: every k must be in [1, n_samples={n_samples}], got {list(ks)}")
    sampling = sampling or SamplingConfig()
    engine = engine or HFEngine(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, sampling=sampling)
    problems = held_out_problems(task, seed, n_prompts)
    prompts = encode_prompts(tokenizer, [p.prompt for p in problems], chat_template=chat_template, system=system)

    def rewards_of(r: Any, n: int) -> np.ndarray:
        return np.array(score_responses(tokenizer, task, problems, r.response_ids, r.mask, n)[0], dtype=np.float64)

    sampled = engine.generate(prompts, n=n_samples, seed=seed + HELD_OUT_OFFSET)
    rewards = rewards_of(sampled, n_samples).reshape(n_prompts, n_samples)
    judged = ~np.isnan(rewards)
    full = judged.all(axis=1)  # prompts whose n samples were all judged: unbiased pass@k needs all n
    correct = (rewards[full] >= 1.0).sum(axis=1)
    with torch.no_grad():
        _, entropy = token_logprobs(
            model,
            sampled.prompt_ids,
            sampled.prompt_mask,
            sampled.response_ids,
            sampled.mask,
            temperature=sampling.temperature,
            with_entropy=True,
            group_size=n_samples,
        )
    assert entropy is not None
    greedy = engine.generate(prompts, n=1, seed=seed, greedy=True)
    mask = sampled.mask
    greedy_rewards = rewards_of(greedy, 1)
    greedy_rewards = greedy_rewards[~np.isnan(greedy_rewards)]
    out = {f"pass@{k}": _mean(np.asarray(pass_at_k(n_samples, correct, k))) if full.any() else math.nan for k in ks}
    out.update(
        {f"mean@{k}": _mean(np.asarray(mean_at_k(n_samples, correct, k))) if full.any() else math.nan for k in ks}
    )
    out["reward_mean"] = _mean(rewards[judged])
    out["greedy_accuracy"] = _mean((greedy_rewards >= 1.0).astype(np.float64))
    out["response_len"] = float(mask.sum(dim=1).float().mean())
    out["entropy"] = float(entropy[mask].mean())
    out["unjudged"] = int((~judged).sum())
    out["judged_prompts"] = int(full.sum())
    constant = (rewards[full] == rewards[full][:, :1]).all(axis=1)
    out["zero_variance_prompts"] = _mean(constant.astype(np.float64)) if n_samples > 1 else math.nan
    return out
