r"""The regime gate: the mediators of a transfer card measured on the real model, against the range the toy tested.

**Probe mediators** are measured on a first rollout batch of the base model before any training
(`posttrain.real_checks.probe`), each with a 95% bootstrap interval over the probe's prompts.

**Run mediators** are read from the first logged steps of the experiment's own arms (`RUN_MEDIATORS`),
for quantities that only exist once training runs (the SIS accept rate at a lag, the update RMS of an
optimizer). The regime counts as *not reached* only when the data exclude the toy's range: the
probe's interval lies entirely outside it (a run mediator, a point value: the value lies outside it), the
same logic as a verdict (a claim is only called false when the data exclude it). Then the experiment's
verdict is replaced by *regime not reached*, with the values that missed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["RUN_MEDIATORS", "gate_rows", "run_mediator"]

Records = Mapping[str, Mapping[str, Any]]
"""One seed's finished runs by arm name."""


def _lagged_mean(records: Records, arm: str, key: str) -> float:
    """The mean of ``key`` over ``arm``'s logged steps trained at a lag (``rollout/lag > 0``)."""
    values = [float(h[key]) for h in records.get(arm, {}).get("history", [])
              if h.get(key) is not None and (h.get("rollout/lag") or 0) > 0]  # fmt: skip
    return float(np.mean(values)) if values else math.nan


def _rms_ratio(records: Records, treatment: str, control: str) -> float:
    a, b = (records.get(x, {}).get("first_update_rms") for x in (treatment, control))
    return float(a) / float(b) if a and b else math.nan


def _replay_acceptance(records: Records, arm: str) -> float:
    h = records.get(arm, {}).get("history", [])
    kept, scanned = (sum(float(x.get(k) or 0.0) for x in h) for k in ("replay/groups", "replay/scanned"))
    return kept / scanned if scanned > 0 else math.nan


def _accuracy_gap(records: Records, arm: str, base: str) -> float:
    from posttrain.real_checks.metrics import metric

    if arm not in records or base not in records:
        return math.nan
    return metric(records[arm], "accuracy") - metric(records[base], "accuracy")


RUN_MEDIATORS: dict[str, Callable[..., float]] = {
    "lagged_mean": _lagged_mean,
    "rms_ratio": _rms_ratio,
    "replay_acceptance": _replay_acceptance,
    "accuracy_gap": _accuracy_gap,
}
"""Run mediators: ``"name:arg:arg"`` keys call ``RUN_MEDIATORS[name](records, *args)`` on one seed's records
(``lagged_mean:ARM:KEY`` the mean of a logged key over steps trained at a lag; ``rms_ratio:A:B`` the first
update's RMS of arm A over arm B's; ``replay_acceptance:ARM`` replayed over scanned groups;
``accuracy_gap:A:B`` held-out accuracy of A minus B's)."""


def run_mediator(key: str, records: Records) -> float:
    """The run mediator ``key`` (see `RUN_MEDIATORS`) of one seed's records; NaN for an unknown name."""
    name, *args = key.split(":")
    fn = RUN_MEDIATORS.get(name)
    return float(fn(records, *args)) if fn is not None else math.nan


def gate_rows(mediators: Sequence[Any], probes: Mapping[str, Mapping[str, Any]], runs: Records) -> list[dict[str, Any]]:
    """One row per mediator: its real value, the toy's range, whether it lies inside.

    ``probes`` maps a task name to its probe metrics; a probe mediator's key is ``"task:metric"``. A run
    mediator without ``runs`` (an experiment whose arms are not trained) is *not measured*: value NaN, ``inside``
    None, so that neither a page nor a lesson reads it as a miss.
    """
    rows = []
    for m in mediators:
        interval, toy = None, m.toy()
        if m.source.value == "probe":
            task, _, metric = m.key.partition(":")
            value = float(probes.get(task, {}).get(metric, math.nan))
            found = probes.get(task, {}).get("interval")
            interval = found.get(metric) if isinstance(found, Mapping) else None
        else:
            value = run_mediator(m.key, runs) if runs else math.nan
        measured = m.source.value == "probe" or bool(runs)
        reaches = interval is not None and math.isfinite(toy.lo) and interval[0] <= toy.hi and interval[1] >= toy.lo
        inside = (toy.contains(value) or reaches) if measured else None
        rows.append({"name": m.name, "key": m.key, "source": m.source.value, "value": value, "interval": interval,
                     "toy": toy.as_dict(), "inside": inside})  # fmt: skip
    return rows
