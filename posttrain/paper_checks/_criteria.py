"""Pass criteria of the form "paired mean above m with at least a fraction f of the seeds positive".

`mean_and_seeds` turns one such criterion into the harness's comparisons: a mean criterion
(Student-t interval of the paired mean over seeds against ``mean_margin``) and, when the paper states
a seed count, a fraction criterion (``d > 0`` in at least ``f`` of the seeds, binomial-tested).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from posttrain.paper_checks.base import Comparison, fraction_criterion, mean_criterion

__all__ = ["mean_and_seeds"]


def mean_and_seeds(
    name: str,
    differences: Sequence[float] | np.ndarray,
    *,
    mean_margin: float,
    fraction: float | None,
    reason: str,
    asserted: bool = True,
    headline: bool = False,
) -> list[Comparison]:
    """Comparisons for ``E[d] > mean_margin`` and ``d > 0`` in at least ``fraction`` of the seeds."""
    d = np.asarray(differences, dtype=np.float64)
    out = [
        mean_criterion(
            f"{name} (paired mean)", d, margin=mean_margin, reason=reason, asserted=asserted, headline=headline
        )
    ]
    if fraction is not None:
        out.append(fraction_criterion(name, d, fraction=fraction, reason=reason, asserted=asserted))
    return out
