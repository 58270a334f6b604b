r"""Seed plans and the suite's budget.

**Seeds.** The primary criterion ``P(d > margin) > 1/2`` is judged by the Clopper-Pearson lower bound on
the share of seeds whose difference clears the margin. With $n$ seeds it holds when at least
$k_{\min}(n)$ clear it (the smallest $k$ whose bound exceeds 1/2; $n < 6$ can never hold at
`ALPHA` = 0.025). If each seed clears the margin with probability $p$, the power is
$P(\mathrm{Bin}(n, p) \ge k_{\min}(n))$; `seeds_for_share` is the smallest $n$ with power >= 0.8
(p = 0.95: 9 seeds; p = 0.9: 12; p = 0.85: 15). $p$ comes from a pilot on seeds `PILOT_OFFSET` + i
(never evaluation seeds): $p = \Phi(\bar d / s)$ of the pilot's differences (normal approximation,
clipped to [0.55, 0.99]); without a recorded pilot the plan assumes $p = 0.95$ (an effect about 1.6
seed standard deviations above the margin) and says so.

**Budget.** `estimate` prices every (arm, seed) job of a plan from measured runs of the same arms (the
``measure`` profile: SmolLM2, 2 steps, a small evaluation): CPU seconds of the trainer build, of a
training step (ES: of an ES step) and of one held-out sample, each job counted once however many
experiments share it. Wall time on the 2-core machine is CPU seconds / 2 when the suite has both cores
(torch runs 2 threads), and up to the CPU seconds when other jobs share them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from posttrain.paper_checks import bounds
from posttrain.paper_checks.model import ALPHA

__all__ = ["DEFAULT_P", "MIN_SEEDS", "clearing_count", "estimate", "pilot_share", "power_at", "seeds_for_share"]

DEFAULT_P = 0.95
"""The per-seed probability of clearing the margin assumed without a pilot."""
MIN_SEEDS = 6
"""Below this a share criterion at level `ALPHA` cannot hold whatever the data (Clopper-Pearson, 1/2)."""


def clearing_count(n: int, share: float = 0.5, *, alpha: float = ALPHA) -> int | None:
    """The fewest of ``n`` seeds that must clear the margin for the criterion to hold (None: no count suffices).

    Examples:
        >>> clearing_count(6), clearing_count(9), clearing_count(12), clearing_count(5)
        (6, 8, 10, None)
    """
    ks = np.arange(n + 1)
    lower = np.asarray(bounds.proportion_bounds(ks, n, alpha=alpha)[0])
    hits = ks[lower > share]
    return int(hits[0]) if hits.size else None


def power_at(n: int, p: float, share: float = 0.5) -> float:
    """Probability that ``n`` seeds, each clearing the margin with probability ``p``, make the criterion hold."""
    k = clearing_count(n, share)
    return 0.0 if k is None else float(stats.binom.sf(k - 1, n, p))


def seeds_for_share(p: float, *, power: float = 0.8, share: float = 0.5, max_seeds: int = 200) -> int:
    """The smallest seed count whose `power_at` reaches ``power`` (module docstring).

    Examples:
        >>> seeds_for_share(0.95), seeds_for_share(0.9), seeds_for_share(0.99)
        (9, 12, 6)
    """
    for n in range(1, max_seeds + 1):
        if power_at(n, p, share) >= power:
            return n
    return max_seeds


def pilot_share(differences: Sequence[float], margin: float) -> float:
    r"""$\Phi((\bar d - \mathrm{margin}) / s)$ of pilot differences, clipped to [0.55, 0.99] (module docstring)."""
    d = np.asarray([x for x in differences if math.isfinite(x)], dtype=np.float64)
    if d.size < 2:
        return DEFAULT_P
    sd = float(d.std(ddof=1))
    z = (float(d.mean()) - margin) / sd if sd > 0 else (math.inf if d.mean() > margin else -math.inf)
    return float(np.clip(stats.norm.cdf(z), 0.55, 0.99))


def estimate(jobs: Iterable[tuple[str, int]], steps: Mapping[str, int], samples: Mapping[str, int],
             measured: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """CPU seconds of ``jobs`` (arm, seed) from ``measured`` records of the same arms (module docstring).

    ``steps[arm]``: training steps of the arm in the plan; ``samples[arm]``: its held-out samples. An arm
    without a measured record is priced as the median measured step / sample and listed in ``unmeasured``.
    """
    rates = {}
    for arm, rec in measured.items():
        n_steps = max(len(rec.get("history", [])), 1)
        build = float(rec.get("build_cpu_s") or 0.0)
        rates[arm] = {
            "build": build,
            "step": max(float(rec.get("train_cpu_s", 0.0)) - build, 0.0) / n_steps,
            "sample": float(rec.get("eval_cpu_s", 0.0)) / max(int(rec.get("eval", {}).get("generated") or 1), 1),
        }
    med = {
        k: float(np.median([r[k] for r in rates.values()])) if rates else math.nan for k in ("build", "step", "sample")
    }
    per_arm: dict[str, float] = {}
    unmeasured = set()
    for arm, _seed in jobs:
        r = rates.get(arm)
        if r is None:
            unmeasured.add(arm)
            r = med
        cost = r["build"] + r["step"] * steps.get(arm, 0) + r["sample"] * samples.get(arm, 0)
        per_arm[arm] = per_arm.get(arm, 0.0) + cost
    total = sum(per_arm.values())
    return {"cpu_s": total, "wall_s_two_cores": total / 2, "per_arm_cpu_s": per_arm, "rates": rates,
            "median_rates": med, "unmeasured": sorted(unmeasured)}  # fmt: skip
