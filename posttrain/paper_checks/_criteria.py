"""Spec pass criteria of the form "paired mean above m with at least n of S seeds positive".

:func:`mean_and_seeds` turns one such criterion into the harness's comparisons: the paired mean as
a single number against its margin, the seed count through :func:`~posttrain.paper_checks._seeds.seedwise`
(both asserted, exactly the spec's wording), and the paired-bootstrap comparison against zero as a
reported-only row so the table always shows the CI and sign test.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from posttrain.paper_checks._seeds import seedwise
from posttrain.paper_checks.base import Comparison

__all__ = ["mean_and_seeds"]


def mean_and_seeds(
    name: str,
    differences: Sequence[float] | np.ndarray,
    *,
    mean_margin: float,
    fraction: float | None,
    reason: str,
    asserted: bool = True,
) -> list[Comparison]:
    """Comparisons for ``mean(d) > mean_margin`` and ``d > 0`` in at least ``fraction`` of the seeds."""
    d = np.asarray(differences, dtype=np.float64)
    out = [
        Comparison(
            f"{name} (paired mean)", (float(d.mean()),), margin=mean_margin, margin_reason=reason, asserted=asserted
        )
    ]
    if fraction is not None:
        out.append(seedwise(name, d.tolist(), margin=0.0, margin_reason=reason, fraction=fraction, asserted=asserted))
    out.append(
        Comparison(
            f"{name} (paired CI)",
            tuple(d.tolist()),
            margin=0.0,
            margin_reason="paired statistics, reported",
            asserted=False,
        )
    )
    return out
