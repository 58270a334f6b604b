"""Slow, obviously correct reference implementations of the core estimators.

Plain Python loops over groups, sequences and tokens with ``math`` scalars (float64), written
from the formulas in the docstrings and ``shared/specs/integrations.md`` section 6, not from the
vectorised code. ``tests/estimators/test_reference.py`` compares the two at explicit tolerances.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

Matrix = list[list[float]]
Mask = list[list[bool]]


def group_normalized_advantages(rewards: Matrix, *, scale_by_std: bool = True, eps: float = 1e-6) -> Matrix:
    """(R - mean) / (Bessel std + eps) per group; constant and singleton groups give 0."""
    out = []
    for group in rewards:
        k = len(group)
        mean = sum(group) / k
        if all(r == group[0] for r in group):
            out.append([0.0] * k)
            continue
        if not scale_by_std or k == 1:
            out.append([r - mean for r in group])
            continue
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (k - 1))
        out.append([(r - mean) / (std + eps) for r in group])
    return out


def rloo_advantages(rewards: Matrix) -> Matrix:
    """R_i minus the mean of the other K-1 rewards of its group."""
    out = []
    for group in rewards:
        row = []
        for i, r in enumerate(group):
            others = [x for j, x in enumerate(group) if j != i]
            row.append(r - sum(others) / len(others))
        out.append(row)
    return out


def _whiten(values: Matrix, mask: Mask, eps: float) -> Matrix:
    valid = [v for row, mrow in zip(values, mask, strict=True) for v, m in zip(row, mrow, strict=True) if m]
    n = len(valid)
    mean = sum(valid) / n
    var = sum((v - mean) ** 2 for v in valid) / max(n - 1, 1)
    scale = 1.0 / math.sqrt(var + eps)
    return [
        [(v - mean) * scale if m else 0.0 for v, m in zip(row, mrow, strict=True)]
        for row, mrow in zip(values, mask, strict=True)
    ]


def reinforce_pp_advantages(token_rewards: Matrix, mask: Mask, *, gamma: float = 1.0, eps: float = 1e-8) -> Matrix:
    """Discounted return over valid tokens, G_t = sum_{t' >= t} gamma^(t'-t) m r, whitened over valid tokens."""
    returns = []
    for row, mrow in zip(token_rewards, mask, strict=True):
        t_len = len(row)
        g_row = []
        for t in range(t_len):
            g_row.append(sum(gamma ** (u - t) * row[u] for u in range(t, t_len) if mrow[u]))
        returns.append(g_row)
    return _whiten(returns, mask, eps)


def reinforce_pp_baseline_advantages(rewards: Matrix, mask: Mask, *, eps: float = 1e-8) -> Matrix:
    """Group-centred outcome on every token of its response, whitened over all valid tokens."""
    centred = group_normalized_advantages(rewards, scale_by_std=False)
    flat = [s for group in centred for s in group]
    scores = [[flat[i]] * len(mask[i]) for i in range(len(mask))]
    return _whiten(scores, mask, eps)


def clipped_ratio_loss(
    logp: Matrix,
    logp_old: Matrix,
    advantages: Matrix,
    mask: Mask,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[Matrix, dict[str, float]]:
    """Per token: r = exp(clamp(l - l_old, -20, 20)); L = max(-A r, -A clip(r)); dual clip min(L, -cA) for A < 0."""
    loss: Matrix = []
    n = clipped = dual = 0
    kl = ratio_sum = 0.0
    for i in range(len(logp)):
        row = []
        for t in range(len(logp[i])):
            if not mask[i][t]:
                row.append(0.0)
                continue
            a = advantages[i][t]
            lr = min(max(logp[i][t] - logp_old[i][t], -20.0), 20.0)
            r = math.exp(lr)
            unclipped = -a * r
            clipped_value = -a * min(max(r, 1.0 - clip_low), 1.0 + clip_high)
            value = max(unclipped, clipped_value)
            is_dual = dual_clip is not None and a < 0 and value > -dual_clip * a
            if is_dual:
                value = -dual_clip * a  # type: ignore[operator]
            row.append(value)
            n += 1
            dual += is_dual
            clipped += (clipped_value > unclipped) and not is_dual
            kl += -lr
            ratio_sum += r
        loss.append(row)
    return loss, {
        "clip_frac": clipped / n,
        "dual_clip_frac": dual / n,
        "approx_kl": kl / n,
        "ratio_mean": ratio_sum / n,
    }


def gspo_loss(
    logp: Matrix, logp_old: Matrix, advantages: Matrix, mask: Mask, *, clip_low: float = 3e-4, clip_high: float = 4e-4
) -> Matrix:
    """Value of GSPO's per-token loss: s_i = exp(mean over valid tokens of l - l_old), clipped like PPO."""
    loss = []
    for i in range(len(logp)):
        valid = [t for t in range(len(logp[i])) if mask[i][t]]
        s = math.exp(min(sum(logp[i][t] - logp_old[i][t] for t in valid) / max(len(valid), 1), 10.0))
        row = []
        for t in range(len(logp[i])):
            a = advantages[i][t]
            row.append(max(-a * s, -a * min(max(s, 1.0 - clip_low), 1.0 + clip_high)) if mask[i][t] else 0.0)
        loss.append(row)
    return loss


def aggregate(values: Matrix, mask: Mask, mode: str, *, horizon: int | None = None) -> float:
    """The five aggregation modes, summing token by token; fully masked rows leave sequence means."""
    sums = [sum(v for v, m in zip(row, mrow, strict=True) if m) for row, mrow in zip(values, mask, strict=True)]
    counts = [sum(mrow) for mrow in mask]
    rows = [i for i, c in enumerate(counts) if c > 0]
    if mode == "token-mean":
        return sum(sums) / sum(counts)
    if mode == "token-sum":
        return sum(sums)
    if mode == "seq-mean-token-mean":
        return sum(sums[i] / counts[i] for i in rows) / len(rows)
    if mode == "seq-mean-token-sum":
        return sum(sums[i] for i in rows) / len(rows)
    if mode == "seq-mean-token-sum-norm":
        h = len(values[0]) if horizon is None else horizon
        return sum(sums) / (len(rows) * h)
    raise ValueError(mode)


def k1(logp: float, logp_ref: float) -> float:
    return logp - logp_ref


def k2(logp: float, logp_ref: float) -> float:
    return 0.5 * (logp - logp_ref) ** 2


def k3(logp: float, logp_ref: float) -> float:
    ratio = math.exp(logp_ref - logp)
    return ratio - (logp_ref - logp) - 1.0


def token_entropy(logits: list[Matrix]) -> Matrix:
    """-sum_v p log p with p the softmax of each position's logits."""
    out = []
    for row in logits:
        out_row = []
        for position in row:
            top = max(position)
            weights = [math.exp(x - top) for x in position]
            z = sum(weights)
            out_row.append(-sum((w / z) * math.log(w / z) for w in weights if w > 0))
        out.append(out_row)
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k), exactly (rational arithmetic)."""
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def pass_at_k_enumerated(n: int, c: int, k: int) -> float:
    """Fraction of the size-k subsets of n samples (the first c correct) that hold a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def mean_at_k_enumerated(n: int, c: int, k: int) -> float:
    """Average over the size-k subsets of the subset's fraction correct."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(sum(i < c for i in s) / k for s in subsets) / len(subsets)
