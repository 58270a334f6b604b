r"""Per-seed numbers of a finished run, from its record (`posttrain.real_checks.runs`), by name.

Held-out metrics read the stored samples: $n$ samples of each of $P$ prompts with rewards $r_{pi}$,
$c_p = \#\{i : r_{pi} \ge 1\}$ correct.

- ``accuracy``: $\frac1P\sum_p c_p/n$ (mean@1; a share of exactly correct answers);
- ``pass@k``: $\frac1P\sum_p \bigl(1 - \binom{n-c_p}{k}/\binom{n}{k}\bigr)$ (unbiased, Chen et al. 2021), $k \le n$;
- ``reward``: the mean reward (partial credit counted);
- ``zero_coverage``: the share of prompts with $c_p = 0$;
- ``answer_entropy``: the mean over prompts of the entropy (nats) of the empirical distribution of the
  $n$ final answers (no number is one more answer);
- ``entropy``: the mean token entropy of the sampled responses; ``response_len``: mean tokens;
- ``accuracy[d]``: ``accuracy`` on the prompts of domain index ``d`` (mixtures);
- ``escape@t``: the first training step whose batch reward mean reaches ``t`` (the run's step count
  plus one when it never does: right-censored);
- ``train_reward``: the mean training batch reward over the run's last quarter of steps;
- ``gen_share``: generation's share of the training step time; ``flops_step``: the RACE FLOPs of a step
  (``flops/total``); ``step_s``: the mean step wall time.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["metric"]

_PASS = re.compile(r"^pass@(\d+)$")
_DOMAIN = re.compile(r"^accuracy\[(\d+)\]$")
_ESCAPE = re.compile(r"^escape@([0-9.]+)$")


def _correct(ev: Mapping[str, Any]) -> tuple[np.ndarray, int]:
    r = [np.asarray(x, dtype=np.float64) for x in ev["rewards"]]
    n = len(r[0]) if r else 0
    return np.array([(x >= 1.0).sum() for x in r], dtype=np.int64), n


def _entropy(answers: list[str]) -> float:
    counts = np.array(list(Counter(answers).values()), dtype=np.float64)
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


def metric(record: Mapping[str, Any], name: str) -> float:
    """The metric ``name`` of one run (module docstring); NaN when the run cannot give it.

    Raises:
        KeyError: an unknown metric name.
    """
    from posttrain.estimators import pass_at_k

    ev = record.get("eval", {})
    if name in ("entropy", "response_len"):
        return float(ev.get(name, math.nan))
    if name in ("gen_share", "flops_step", "step_s"):
        h = record.get("history", [])
        key = {"flops_step": "flops/total", "step_s": "step_time_s"}.get(name, "gen_time_s")
        values = [float(x[key]) for x in h if x.get(key) is not None]
        if name == "gen_share":
            total = sum(float(x.get("step_time_s") or 0.0) for x in h)
            return sum(values) / total if total > 0 else math.nan
        return float(np.mean(values)) if values else math.nan
    if name == "train_reward":
        h = [float(x["reward_mean"]) for x in record.get("history", []) if x.get("reward_mean") is not None]
        return float(np.mean(h[-max(1, len(h) // 4) :])) if h else math.nan
    if (m := _ESCAPE.match(name)) is not None:
        h = record.get("history", [])
        hit = [int(x["step"]) for x in h if x.get("reward_mean") is not None and x["reward_mean"] >= float(m.group(1))]
        return float(hit[0]) if hit else float(len(h) + 1)
    if not ev.get("rewards"):
        return math.nan
    c, n = _correct(ev)
    if name == "accuracy":
        return float((c / n).mean())
    if (m := _PASS.match(name)) is not None:
        k = int(m.group(1))
        return float(np.mean(pass_at_k(n, c, k))) if k <= n else math.nan
    if name == "reward":
        return float(np.mean([np.mean(x) for x in ev["rewards"]]))
    if name == "zero_coverage":
        return float((c == 0).mean())
    if name == "answer_entropy":
        return float(np.mean([_entropy(a) for a in ev["answers"]]))
    if (m := _DOMAIN.match(name)) is not None:
        d = int(m.group(1))
        rows = [i for i, dom in enumerate(ev.get("domains", [])) if dom == d]
        return float((c[rows] / n).mean()) if rows else math.nan
    raise KeyError(f"unknown metric {name!r}")
