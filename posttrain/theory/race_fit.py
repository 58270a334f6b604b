r"""RACE: the pilot-grid diagnostic that locates the allocation regime (Wilhelm & Kao 2026, Section 3.6).

Given pilot runs inside an IsoFLOP band with update fractions $p$ and a response $y$
(native reward, normalised reward, pass@1, ...), fit candidate response models $y(p)$
(constant, linear, quadratic in $p$; linear, quadratic in $\log p$), compare them by
leave-one-out and leave-one-group-out (e.g. LoRA rank) RMSE, and call the regime ``high-update``
when the quadratic's optimum is at $p\ge p_{thr}$. *Reconstructed*: the fitting details and
``p_thr = 0.6`` are our recommendation, not confirmed from the paper. RACE is a diagnostic,
not an optimiser.

Reference: Wilhelm, Kao (2026), arXiv:2607.13389.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np
from numpy.typing import ArrayLike, NDArray

from posttrain.errors import DomainError, ShapeError

__all__ = ["RaceFit", "ResponseModel", "in_band", "min_max_normalise", "race_fit"]

Array = NDArray[np.float64]


class ResponseModel(str, Enum):
    """Candidate response models ``y(p)``."""

    CONSTANT = "constant"
    LINEAR = "linear"
    QUADRATIC = "quadratic"
    LOG_LINEAR = "log-linear"
    LOG_QUADRATIC = "log-quadratic"


def _design(model: ResponseModel, p: Array) -> Array:
    x = np.log(p) if model in (ResponseModel.LOG_LINEAR, ResponseModel.LOG_QUADRATIC) else p
    degree = {
        ResponseModel.CONSTANT: 0,
        ResponseModel.LINEAR: 1,
        ResponseModel.LOG_LINEAR: 1,
        ResponseModel.QUADRATIC: 2,
        ResponseModel.LOG_QUADRATIC: 2,
    }[model]
    return np.stack([x**j for j in range(degree + 1)], axis=1)


@dataclass(frozen=True)
class RaceFit:
    """Result of `race_fit`."""

    best_model: ResponseModel
    """Lowest leave-one-out RMSE."""
    rmse_loo: dict[str, float]
    rmse_group: dict[str, float]
    """Leave-one-group-out RMSE (empty without groups)."""
    quadratic_coef: tuple[float, float, float]
    """``(c0, c1, c2)`` of ``y = c0 + c1 p + c2 p^2``."""
    p_opt: float
    """Vertex of the quadratic when concave and inside the observed range, else the observed ``p`` it rates best."""
    regime: str
    """``high-update`` if ``p_opt >= p_thr`` else ``low-update``."""


def in_band(totals: ArrayLike, low: float, high: float) -> NDArray[np.bool_]:
    """Which accounted ``C_total`` lie in the IsoFLOP band ``[low, high]`` (FLOPs, not log10)."""
    t = np.asarray(totals, dtype=np.float64)
    if not 0 < low <= high:
        raise DomainError(f"low, high: expected 0 < low <= high, got {low}, {high}")
    return np.asarray((t >= low) & (t <= high))


def min_max_normalise(y: ArrayLike) -> Array:
    r"""Per reward system, $\tilde r=(r-\min)/(\max-\min)$ over the grid (all zeros if constant).

    Examples:
        >>> min_max_normalise([1.0, 2.0, 3.0]).tolist()
        [0.0, 0.5, 1.0]
    """
    a = np.asarray(y, dtype=np.float64)
    span = a.max() - a.min()
    return np.zeros_like(a) if span == 0 else (a - a.min()) / span


def _loo_rmse(x: Array, y: Array) -> float:
    # closed-form leave-one-out residuals e_i / (1 - h_ii) of least squares
    pinv = np.linalg.pinv(x)
    resid = y - x @ (pinv @ y)
    h = np.sum(x * pinv.T, axis=1)
    denom = np.where(1.0 - h > 1e-12, 1.0 - h, np.nan)
    return float(np.sqrt(np.nanmean((resid / denom) ** 2)))


def _group_rmse(x: Array, y: Array, groups: Array) -> float:
    errs = []
    for gid in np.unique(groups):  # a handful of groups (LoRA ranks)
        test = groups == gid
        coef, *_ = np.linalg.lstsq(x[~test], y[~test], rcond=None)
        errs.append((y[test] - x[test] @ coef) ** 2)
    return float(np.sqrt(np.mean(np.concatenate(errs))))


def race_fit(p: ArrayLike, y: ArrayLike, *, groups: ArrayLike | None = None, p_thr: float = 0.6) -> RaceFit:
    """Fit the RACE response models to pilot runs and call the allocation regime.

    Args:
        p: ``[R]`` update fractions in (0, 1] of the runs inside the band.
        y: ``[R]`` response metric (higher is better).
        groups: ``[R]`` labels for leave-one-group-out CV (e.g. LoRA rank).
        p_thr: regime threshold.

    Examples:
        >>> pp = np.linspace(0.2, 0.9, 8)
        >>> fit = race_fit(pp, 1.0 - (pp - 0.7) ** 2)
        >>> round(fit.p_opt, 6), fit.regime
        (0.7, 'high-update')
    """
    pp = np.asarray(p, dtype=np.float64)
    yy = np.asarray(y, dtype=np.float64)
    if pp.ndim != 1 or pp.shape != yy.shape or pp.size < 4:
        raise ShapeError(f"p, y: expected equal 1-d shapes with >= 4 runs, got {list(pp.shape)}, {list(yy.shape)}")
    if np.any(pp <= 0) or np.any(pp > 1) or not np.all(np.isfinite(yy)):
        raise DomainError("p, y: expected p in (0, 1] and finite y")
    loo = {m.value: _loo_rmse(_design(m, pp), yy) for m in ResponseModel}
    grp: dict[str, float] = {}
    if groups is not None:
        gg = np.asarray(groups)
        if gg.shape != pp.shape:
            raise ShapeError(f"groups: expected shape {list(pp.shape)}, got {list(gg.shape)}")
        if np.unique(gg).size >= 2:
            grp = {m.value: _group_rmse(_design(m, pp), yy, gg) for m in ResponseModel}
    coef, *_ = np.linalg.lstsq(_design(ResponseModel.QUADRATIC, pp), yy, rcond=None)
    c0, c1, c2 = (float(c) for c in coef)
    vertex = -c1 / (2.0 * c2) if c2 < 0 else np.nan
    if np.isfinite(vertex) and pp.min() <= vertex <= pp.max():
        p_opt = float(vertex)
    else:
        p_opt = float(pp[np.argmax(c0 + c1 * pp + c2 * pp**2)])
    best = min(ResponseModel, key=lambda m: loo[m.value])
    return RaceFit(best, loo, grp, (c0, c1, c2), p_opt, "high-update" if p_opt >= p_thr else "low-update")
