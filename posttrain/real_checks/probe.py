r"""The probe: the base model's first rollout batch on a task, and the mediators measured on it.

**Probe mediators** are measured on a first rollout batch of the base model (`probe_metrics`):
``probe_prompts`` x ``probe_samples`` samples of the profile's base model on the arm's task, from an RNG
stream neither training nor evaluation uses (`PROBE_OFFSET`), before any training. With the per-group
rewards $r_{gk}$ ($G$ groups of $K$), the probe reports

- ``p0``: the share of exactly correct samples ($r \ge 1$), the base accuracy;
- ``reward_mean``: the mean reward (partial credit included);
- ``zero_variance_groups``: the share of groups whose $K$ rewards are all equal (a group baseline gives
  them zero advantage), ``all_wrong_groups``: the share whose rewards are all 0;
- ``advantage_abs_mean``: mean $|A|$ of the group-normalised advantages (GRPO's scale);
- ``coverage_gap``: pass@K - pass@1 (unbiased), the headroom of sampling over one answer;
- ``tie_rate``: the share of within-prompt pairs with equal rewards (a preference label would be a tie);
- ``inversion_rate``: with the gold answer appended to every group at reward 1 (naive injection),
  the share of sampled rows above their group's mean whose advantage becomes $\le 0$
  (`posttrain.estimators.metrics.inversion_rate`);
- ``length_ratio``: the longest over the shortest domain's mean response length (token-share imbalance
  of a mixture; 1 for one domain).

Each probe mediator comes with a 95% percentile-bootstrap interval over the probe's prompts (`probe_intervals`).
This module decides a probe's numbers, so its source is part of a cached probe's key; the gate that reads
them (`posttrain.real_checks.gate`) is not.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["BOOTSTRAP", "PROBE_OFFSET", "probe_intervals", "probe_metrics", "reward_metrics"]

PROBE_OFFSET = 2_000_003
"""The probe's problems come from ``random.Random(seed + PROBE_OFFSET)`` (training uses ``seed``, evaluation
``seed + HELD_OUT_OFFSET``)."""


def reward_metrics(
    rewards: np.ndarray, domains: Sequence[int | None] = (), lengths: np.ndarray | None = None
) -> dict[str, float]:
    """The probe's mediators (module docstring) from rewards ``[G, K]`` (and per-row domains / lengths ``[G, K]``)."""
    from posttrain.estimators import group_normalized_advantages, naive_injection_advantages, pass_at_k
    from posttrain.estimators.metrics import inversion_rate

    r = np.asarray(rewards, dtype=np.float64)
    g, k = r.shape
    correct = (r >= 1.0).sum(axis=1)
    t = torch.as_tensor(r)
    adv = group_normalized_advantages(t)
    naive = naive_injection_advantages(t, torch.ones(g, dtype=torch.float64))[:, :-1]
    pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
    ties = np.mean([[r[x, i] == r[x, j] for i, j in pairs] for x in range(g)]) if pairs else math.nan
    out = {
        "p0": float((r >= 1.0).mean()),
        "reward_mean": float(r.mean()),
        "zero_variance_groups": float((r == r[:, :1]).all(axis=1).mean()),
        "all_wrong_groups": float((r == 0).all(axis=1).mean()),
        "advantage_abs_mean": float(adv.abs().mean()),
        "coverage_gap": float(np.mean(pass_at_k(k, correct, k)) - np.mean(pass_at_k(k, correct, 1))),
        "tie_rate": float(ties),
        "inversion_rate": float(inversion_rate(t, naive)),
        "length_ratio": 1.0,
    }
    if lengths is not None and len(domains) == g and len({d for d in domains if d is not None}) > 1:
        means = [float(np.asarray(lengths)[[i for i, d in enumerate(domains) if d == dom]].mean())
                 for dom in sorted({d for d in domains if d is not None})]  # fmt: skip
        out["length_ratio"] = max(means) / max(min(means), 1e-9)
    return out


BOOTSTRAP = 400
"""Resamples of the probe's prompts behind each probe mediator's 95% interval."""


def probe_intervals(rewards: np.ndarray, domains: Sequence[int | None], lengths: np.ndarray,
                    *, reps: int = BOOTSTRAP, seed: int = 0) -> dict[str, list[float]]:  # fmt: skip
    """95% percentile-bootstrap intervals of `reward_metrics` over the probe's prompts (groups resampled whole)."""
    rng = np.random.default_rng(seed)
    g = rewards.shape[0]
    draws: dict[str, list[float]] = {}
    for _ in range(reps):
        idx = np.asarray(rng.integers(0, g, size=g), dtype=np.int64)
        picked: list[int | None] = [domains[int(i)] for i in idx] if len(domains) == g else []
        m = reward_metrics(rewards[idx], picked, lengths[idx])
        for k, v in m.items():
            draws.setdefault(k, []).append(v)
    return {k: [float(np.nanpercentile(v, 2.5)), float(np.nanpercentile(v, 97.5))] for k, v in draws.items()}


def probe_metrics(model_dir: str, config: Any, *, prompts: int, samples: int, seed: int) -> dict[str, Any]:
    """The probe mediators of the model in ``model_dir`` on ``config``'s task (module docstring), with their
    bootstrap intervals (``"interval"``) and the raw rewards, lengths and domains they come from."""
    from posttrain.llm.rollout.engine import HFEngine
    from posttrain.llm.rollout.tasks import make_task
    from posttrain.llm.rollout.text import score_responses
    from posttrain.llm.run import load_model

    model, tokenizer = load_model(model_dir, config)
    task = make_task(config.data.task, **config.data.options)
    problems = task.sample(random.Random(seed + PROBE_OFFSET), prompts)
    ids = config.model.prompt_format().encode(tokenizer, [p.prompt for p in problems])
    engine = HFEngine(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id,
                      sampling=config.rollout.sampling())  # fmt: skip
    r = engine.generate(ids, n=samples, seed=seed + PROBE_OFFSET)
    rewards, _ = score_responses(tokenizer, task, problems, r.response_ids, r.mask, samples)
    lengths = r.mask.sum(dim=1).reshape(prompts, samples).float().mean(dim=1).numpy()
    grid, domains = np.asarray(rewards, dtype=np.float64).reshape(prompts, samples), [p.domain for p in problems]
    out: dict[str, Any] = dict(reward_metrics(grid, domains, lengths))
    out["response_len"] = float(lengths.mean())
    out["interval"] = probe_intervals(grid, domains, lengths)
    out["raw"] = {"rewards": grid.tolist(), "lengths": lengths.tolist(), "domains": domains}
    return out
