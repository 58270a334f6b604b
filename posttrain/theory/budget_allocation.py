r"""SFT:RL annotation-budget allocation: near-optimal regions, widths, transfer (Wang et al. 2026).

With budget ``B`` and SFT share ``r`` of a grid $\mathcal G$, the $\varepsilon$-near-optimal region is

$$
\hat{\mathcal R}_\varepsilon=\{r\in\mathcal G:\ \mathcal P(r)\ge(1-\varepsilon)\max_{r'}\mathcal P(r')\}
$$

(multiplicative tolerance; needs a non-negative metric; `near_optimal_region` also offers the
absolute variant $\mathcal P\ge\max\mathcal P-\delta$). Widths
$w^{rng}=\max\hat{\mathcal R}-\min\hat{\mathcal R}$, $w^{cnt}=|\hat{\mathcal R}|/|\mathcal G|$; cross-scale
transfer $T=|\hat{\mathcal R}_s\cap\hat{\mathcal R}_t|/|\hat{\mathcal R}_s|$; the proxy recommends the midpoint
of its region snapped to the nearest member, and *hits* when that lies in the target's region.
Cost asymmetry $\rho=c_{SFT}/c_{RL}$ converts a budget into counts (*reconstructed*):
$n_{SFT}=\lfloor rB/\rho\rfloor$, $n_{RL}=\lfloor(1-r)B\rfloor$.

Regions are boolean arrays over the grid with any leading batch (seeds, bootstrap resamples,
sizes); every function is vectorised over that batch.

Reference: Wang, Verma, Lin, Liu, Chen, Rus, Low (2026), "Scaling Near-Optimal SFT-RL Annotation
Budget Allocation from Small to Large LLMs", arXiv:2609.01573.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from posttrain.errors import DomainError, ShapeError
from posttrain.validate import check_in_range, check_positive

__all__ = [
    "RegionSummary",
    "bootstrap_hit_rate",
    "budget_split",
    "near_optimal_region",
    "proxy_hit",
    "proxy_ratio",
    "summarise_region",
    "transferability",
    "width_count",
    "width_range",
]

Array = NDArray[np.float64]
Mask = NDArray[np.bool_]


def _grid(grid: ArrayLike) -> Array:
    g = np.asarray(grid, dtype=np.float64)
    if g.ndim != 1 or g.size < 1 or np.any(np.diff(g) <= 0) or g[0] < 0 or g[-1] > 1:
        raise ShapeError(f"grid: expected a strictly increasing 1-d array in [0, 1], got {g.tolist()}")
    return g


def budget_split(r: ArrayLike, budget: float, *, rho: float = 1.0) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    r"""Counts $(n_{SFT}, n_{RL}) = (\lfloor rB/\rho\rfloor, \lfloor(1-r)B\rfloor)$ (RL unit cost 1, SFT cost $\rho$).

    Examples:
        >>> [a.tolist() for a in budget_split([0.0, 0.5, 1.0], 150, rho=2.0)]
        [[0, 37, 75], [150, 75, 0]]
    """
    rr = np.asarray(r, dtype=np.float64)
    if np.any(rr < 0) or np.any(rr > 1):
        raise DomainError(f"r: expected SFT shares in [0, 1], got {rr.tolist()}")
    b = check_positive("budget", budget, strict=False)
    rho = check_positive("rho", rho)
    # a tiny slack keeps exact products (0.3 * 150 = 45) from flooring to 44 in binary floating point
    n_sft = np.floor(rr * b / rho + 1e-9).astype(np.int64)
    n_rl = np.floor((1.0 - rr) * b + 1e-9).astype(np.int64)
    return n_sft, n_rl


def near_optimal_region(
    perf: ArrayLike, eps: float, *, absolute: bool = False, feasible: ArrayLike | None = None
) -> Mask:
    r"""The near-optimal region over the grid: ``[..., R]`` bool.

    Args:
        perf: ``[..., R]`` metric at each grid point (higher is better; non-negative when
            ``absolute=False``).
        eps: tolerance $\varepsilon\in[0,1]$ (multiplicative) or $\delta\ge0$ (``absolute=True``).
        feasible: ``[R]`` or ``[..., R]`` bool, grid points eligible at all (default all).

    Examples:
        >>> near_optimal_region([0.5, 0.9, 1.0, 0.95], 0.1).tolist()
        [False, True, True, True]
    """
    p = np.asarray(perf, dtype=np.float64)
    if p.ndim < 1 or p.shape[-1] < 1 or not np.all(np.isfinite(p)):
        raise ShapeError(f"perf: expected a finite array [..., R], got shape {list(p.shape)}")
    ok = (
        np.ones(p.shape, dtype=bool) if feasible is None else np.broadcast_to(np.asarray(feasible, dtype=bool), p.shape)
    )
    if not np.all(ok.any(axis=-1)):
        raise DomainError("feasible: every curve needs at least one feasible grid point")
    best = np.max(np.where(ok, p, -np.inf), axis=-1, keepdims=True)
    if absolute:
        threshold = best - check_positive("eps", eps, strict=False)
    else:
        if np.any(p[ok] < 0):
            raise DomainError("perf: the multiplicative tolerance needs a non-negative metric (use absolute=True)")
        threshold = (1.0 - check_in_range("eps", eps, 0.0, 1.0)) * best
    return np.asarray(ok & (p >= threshold))


def width_count(region: ArrayLike, *, feasible: ArrayLike | None = None) -> Array:
    r"""$w^{cnt}=|\hat{\mathcal R}|/|\mathcal G|$ (``|G|`` counts feasible points only).

    Examples:
        >>> float(width_count([True, False, True, True]))
        0.75
    """
    m = np.asarray(region, dtype=bool)
    size = m.shape[-1] if feasible is None else np.sum(np.asarray(feasible, dtype=bool), axis=-1)
    return np.asarray(m.sum(axis=-1) / size, dtype=np.float64)


def width_range(region: ArrayLike, grid: ArrayLike) -> Array:
    r"""$w^{rng}=\max\hat{\mathcal R}-\min\hat{\mathcal R}$ (ignores holes; 0 for an empty region).

    Examples:
        >>> float(width_range([True, False, True, False], [0.0, 0.25, 0.5, 0.75]))
        0.5
    """
    m = np.asarray(region, dtype=bool)
    g = _grid(grid)
    hi = np.max(np.where(m, g, -np.inf), axis=-1)
    lo = np.min(np.where(m, g, np.inf), axis=-1)
    return np.asarray(np.where(m.any(axis=-1), hi - lo, 0.0))


def transferability(source: ArrayLike, target: ArrayLike) -> Array:
    r"""$T=|\hat{\mathcal R}_s\cap\hat{\mathcal R}_t|/|\hat{\mathcal R}_s|\in[0,1]$ (``nan`` for an empty source).

    Examples:
        >>> float(transferability([True, True, False], [False, True, True]))
        0.5
    """
    s = np.asarray(source, dtype=bool)
    t = np.asarray(target, dtype=bool)
    size = s.sum(axis=-1)
    inter = (s & t).sum(axis=-1)
    return np.asarray(np.where(size > 0, inter / np.maximum(size, 1), np.nan), dtype=np.float64)


def proxy_ratio(region: ArrayLike, grid: ArrayLike) -> Array:
    """The proxy's recommendation: midpoint of the region's range snapped to the nearest member (ties: lower).

    Always a member of a non-empty region (``nan`` for an empty one).

    Examples:
        >>> float(proxy_ratio([True, False, False, True, True], [0.0, 0.25, 0.5, 0.75, 1.0]))
        0.75
    """
    m = np.asarray(region, dtype=bool)
    g = _grid(grid)
    hi = np.max(np.where(m, g, -np.inf), axis=-1, keepdims=True)
    lo = np.min(np.where(m, g, np.inf), axis=-1, keepdims=True)
    dist = np.where(m, np.abs(g - 0.5 * (hi + lo)), np.inf)
    idx = np.argmin(dist, axis=-1)
    return np.asarray(np.where(m.any(axis=-1), g[idx], np.nan))


def proxy_hit(source: ArrayLike, target: ArrayLike, grid: ArrayLike) -> Mask:
    """Whether the proxy's recommended ratio (from ``source``) lies in the ``target`` region.

    Examples:
        >>> bool(proxy_hit([True, True, True], [False, True, False], [0.0, 0.5, 1.0]))
        True
    """
    g = _grid(grid)
    r_hat = proxy_ratio(source, g)
    t = np.asarray(target, dtype=bool)
    at = np.isclose(g, r_hat[..., None]) & t
    return np.asarray(at.any(axis=-1))


def bootstrap_hit_rate(
    perf_source: ArrayLike,
    perf_target: ArrayLike,
    grid: ArrayLike,
    eps: float,
    *,
    n_boot: int = 500,
    seed: int = 0,
) -> float:
    """Proxy-midpoint hit rate over bootstrap resamples of seeds (source and target resampled independently).

    Args:
        perf_source, perf_target: ``[seeds, R]`` per-seed metrics of proxy and target.
        grid: ``[R]``; eps: tolerance; n_boot: resamples; seed: resampling seed.
    """
    ps = np.asarray(perf_source, dtype=np.float64)
    pt = np.asarray(perf_target, dtype=np.float64)
    if ps.ndim != 2 or pt.ndim != 2 or ps.shape[1] != pt.shape[1]:
        raise ShapeError(f"perf_source, perf_target: expected [seeds, R] with equal R, got {ps.shape}, {pt.shape}")
    rng = np.random.default_rng(seed)
    src = ps[rng.integers(0, ps.shape[0], size=(n_boot, ps.shape[0]))].mean(axis=1)
    tgt = pt[rng.integers(0, pt.shape[0], size=(n_boot, pt.shape[0]))].mean(axis=1)
    return float(proxy_hit(near_optimal_region(src, eps), near_optimal_region(tgt, eps), grid).mean())


@dataclass(frozen=True)
class RegionSummary:
    """The analysis of one seed-averaged curve at one tolerance."""

    region: Mask
    width_count: float
    width_range: float
    proxy_ratio: float
    best_ratio: float


def summarise_region(perf: ArrayLike, grid: ArrayLike, eps: float, *, absolute: bool = False) -> RegionSummary:
    """Region, widths, proxy midpoint and argmax of the seed mean of ``perf [seeds, R]`` (or ``[R]``).

    Examples:
        >>> s = summarise_region([[0.5, 0.9, 1.0]], [0.0, 0.5, 1.0], 0.1)
        >>> s.region.tolist(), s.width_range, s.proxy_ratio
        ([False, True, True], 0.5, 0.5)
    """
    p = np.asarray(perf, dtype=np.float64)
    mean = p.mean(axis=0) if p.ndim == 2 else p
    g = _grid(grid)
    region = near_optimal_region(mean, eps, absolute=absolute)
    return RegionSummary(
        region=region,
        width_count=float(width_count(region)),
        width_range=float(width_range(region, g)),
        proxy_ratio=float(proxy_ratio(region, g)),
        best_ratio=float(g[int(np.argmax(mean))]),
    )
