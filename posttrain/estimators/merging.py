r"""Spectral projections of weight updates: SAR (Subspace-Aligned Rewiring) and merging baselines.

For a base weight $W_0 = U\Sigma V^\top$ (``[m, n]`` = ``d_out x d_in``) and an RL update
$\Delta = W_{RL} - W_0$, SAR keeps the rank-k truncation of $\Delta$ projected on the
base's leading r singular subspaces:

$$
\Delta^\star = P_L\,\Delta_k\,P_R = U_r M V_r^\top,\qquad M = U_r^\top \Delta_k V_r,
$$

with $P_L = U_rU_r^\top$, $P_R = V_rV_r^\top$. The diagonal of $M$ rescales base
directions, its off-diagonal part rewires them. All functions accept leading batch dimensions.

Reference: Zhang et al. 2026, Spectral rewiring for exploration, purification and model merging
(arXiv:2607.03065); official code defaults ``delta_fraction = 0.01``, full base rank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.registry import registry
from posttrain.shapes import Float
from posttrain.validate import check_choice, check_float, check_in_range

__all__ = [
    "SARMask",
    "dare_merge",
    "low_rank_truncation",
    "random_subspace_projection",
    "sar_merge",
    "sar_project",
    "sar_rank",
    "task_arithmetic_merge",
    "ties_merge",
]

PROJECTIONS = registry("projection")


class SARMask(str, Enum):
    """Which part of the rewiring matrix $M$ to keep."""

    FULL = "full"
    DIAGONAL = "diagonal"
    OFF_DIAGONAL = "off_diagonal"


def sar_rank(delta_fraction: float, m: int, n: int) -> int:
    r"""$k = \max(1, \lfloor \rho_\Delta \min(m, n) \rfloor)$ for $\rho_\Delta \in (0, 1]$.

    Examples:
        >>> sar_rank(0.01, 896, 4864), sar_rank(1.0, 32, 64)
        (8, 32)
    """
    if not 0.0 < float(delta_fraction) <= 1.0:
        raise DomainError(f"delta_fraction: expected a value in (0, 1], got {delta_fraction!r}")
    return max(1, math.floor(delta_fraction * min(m, n)))


def _check_pair(w0: Tensor, delta: Tensor) -> None:
    check_float("w0", w0)
    check_float("delta", delta)
    if w0.ndim < 2:
        raise ShapeError(f"w0: expected a matrix [..., m, n], got shape {list(w0.shape)}")
    if delta.shape[-2:] != w0.shape[-2:]:
        raise ShapeError(f"delta: expected trailing shape {list(w0.shape[-2:])} (that of w0), got {list(delta.shape)}")


def low_rank_truncation(
    delta: Float[Tensor, "... m n"], k: int, *, randomized: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    r"""Factors of the best rank-k approximation $\Delta_k = U_k\,\mathrm{diag}(s_k)\,V_k^\top$ (Eckart-Young).

    ``randomized=True`` uses ``torch.svd_lowrank`` (Halko et al. 2011) with oversampling 10 and 4
    power iterations: approximate, much faster when k is small. Returns
    ``(U_k [..., m, k], s_k [..., k], V_k [..., n, k])``.
    """
    k = min(int(k), delta.shape[-1], delta.shape[-2])
    if randomized:
        u, s, v = torch.svd_lowrank(delta, q=min(k + 10, delta.shape[-1], delta.shape[-2]), niter=4)
        return u[..., :k], s[..., :k], v[..., :k]
    u, s, vh = torch.linalg.svd(delta, full_matrices=False)
    return u[..., :k], s[..., :k], vh[..., :k, :].mT


def _orthonormal_basis(a: Tensor, tol: float) -> Tensor | None:
    """Q of a reduced QR of a tall ``a`` (column space), or None when ``a`` looks rank-deficient."""
    q, r = torch.linalg.qr(a)
    diag = r.diagonal(dim1=-2, dim2=-1).abs()
    if bool((diag <= tol * diag.max(dim=-1, keepdim=True).values).any()):
        return None
    return q


def _full_rank_projection(w0: Tensor, uk: Tensor, sk: Tensor, vk: Tensor, tol: float) -> Tensor | None:
    r"""$P_L \Delta_k P_R$ with full base rank via QR: one side is the identity for a full-rank base."""
    m, n = w0.shape[-2:]
    if m <= n:  # wide: column space is all of R^m, project the row side
        q = _orthonormal_basis(w0.mT, tol)
        return None if q is None else (uk * sk.unsqueeze(-2)) @ ((vk.mT @ q) @ q.mT)
    q = _orthonormal_basis(w0, tol)
    return None if q is None else (q @ (q.mT @ uk)) * sk.unsqueeze(-2) @ vk.mT


def _base_frame(w0: Tensor, base_rank: int | None, tol: float) -> tuple[Tensor, Tensor]:
    """Leading left/right singular vectors of ``w0``; directions with s_i <= tol * s_1 are dropped."""
    u, s, vh = torch.linalg.svd(w0, full_matrices=False)
    q = s.shape[-1]
    r = q if base_rank is None else min(int(base_rank), q)
    if r < 1:
        raise DomainError(f"base_rank: expected a positive integer, got {base_rank!r}")
    keep = (s[..., :r] > tol * s[..., :1]).to(w0.dtype)  # zero columns for a rank-deficient base
    return u[..., :r] * keep.unsqueeze(-2), vh[..., :r, :].mT * keep.unsqueeze(-2)


def sar_project(
    w0: Float[Tensor, "... m n"],
    delta: Float[Tensor, "... m n"],
    *,
    k: int | None = None,
    delta_fraction: float = 0.01,
    base_rank: int | None = None,
    mask: SARMask | str = SARMask.FULL,
    tol: float = 1e-6,
    randomized: bool = False,
) -> Float[Tensor, "... m n"]:
    r"""SAR's projected update $\Delta^\star = U_r\,\mathrm{mask}(M)\,V_r^\top$, $M = (U_r^\top U_{\Delta,k}) S_{\Delta,k} (V_{\Delta,k}^\top V_r)$.

    Args:
        w0: ``[..., m, n]`` base weight (``d_out x d_in``).
        delta: ``[..., m, n]`` update $W_{RL} - W_0$.
        k: rank of the truncation; default `sar_rank` of ``delta_fraction``.
        delta_fraction: $\rho_\Delta \in (0, 1]$ (official default 0.01).
        base_rank: r; default the full thin rank ``min(m, n)`` (official code).
        mask: keep the full $M$, its diagonal (rescaling only) or off-diagonal part (rewiring).
        tol: base directions with $s_i \le$ ``tol`` $\cdot s_1$ are dropped (rank-deficient bases).
        randomized: compute $\Delta_k$ with ``torch.svd_lowrank`` (q = k + 10, 4 power
            iterations) instead of a full SVD; for large matrices with k << min(m, n).

    With the full base rank and no mask, the projectors depend on $W_0$ only through its
    column/row spaces, so a QR factorisation replaces the SVD of $W_0$ (same result, faster);
    a numerically rank-deficient base falls back to the SVD path.

    Returns:
        ``[..., m, n]``; add ``alpha * result`` to ``w0``. Zero ``delta`` gives exactly 0.

    Examples:
        >>> w0 = torch.eye(3, dtype=torch.float64)
        >>> d = torch.diag(torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64))
        >>> sar_project(w0, d, k=2).diagonal().tolist()  # square full-rank base: rank-2 truncation
        [3.0, 2.0, 0.0]
    """
    _check_pair(w0, delta)
    m, n = w0.shape[-2:]
    k = sar_rank(delta_fraction, m, n) if k is None else int(k)
    if k < 1:
        raise DomainError(f"k: expected a positive integer, got {k!r}")
    mask = check_choice("mask", mask, SARMask)
    uk, sk, vk = low_rank_truncation(delta, k, randomized=randomized)
    if mask is SARMask.FULL and base_rank is None:
        fast = _full_rank_projection(w0, uk, sk, vk, tol)
        if fast is not None:
            return fast
    ur, vr = _base_frame(w0, base_rank, tol)
    rew = (ur.mT @ uk) * sk.unsqueeze(-2) @ (vk.mT @ vr)  # M = U_r^T U_k S_k V_k^T V_r, [..., r, r]
    if mask is SARMask.DIAGONAL:
        rew = torch.diag_embed(rew.diagonal(dim1=-2, dim2=-1))
    elif mask is SARMask.OFF_DIAGONAL:
        rew = rew - torch.diag_embed(rew.diagonal(dim1=-2, dim2=-1))
    return ur @ rew @ vr.mT


def random_subspace_projection(
    delta: Float[Tensor, "... m n"], k: int, rank: int, *, generator: torch.Generator
) -> Float[Tensor, "... m n"]:
    """Control: project $\\Delta_k$ on random orthonormal left/right frames of dimension ``rank``."""
    check_float("delta", delta)
    m, n = delta.shape[-2:]
    uk, sk, vk = low_rank_truncation(delta, k)
    dk = uk * sk.unsqueeze(-2) @ vk.mT
    ql = torch.linalg.qr(torch.randn(m, rank, generator=generator, dtype=delta.dtype)).Q
    qr = torch.linalg.qr(torch.randn(n, rank, generator=generator, dtype=delta.dtype)).Q
    return ql @ (ql.T @ dk @ qr) @ qr.T


def sar_merge(
    w0: Float[Tensor, "... m n"],
    deltas: Sequence[Tensor],
    *,
    alphas: Sequence[float] | None = None,
    **sar_options: object,
) -> Float[Tensor, "... m n"]:
    r"""SAR merging of experts fine-tuned from the same base: $W_0 + \sum_e \alpha_e\,P_L(\Delta_e)_kP_R$ (reconstructed rule)."""
    if not deltas:
        raise ShapeError("deltas: expected at least one expert update")
    alphas = [1.0] * len(deltas) if alphas is None else list(alphas)
    if len(alphas) != len(deltas):
        raise ShapeError(f"alphas: expected {len(deltas)} values (one per delta), got {len(alphas)}")
    out = w0
    for a, d in zip(alphas, deltas, strict=True):
        out = out + a * sar_project(w0, d, **sar_options)  # type: ignore[arg-type]
    return out


def task_arithmetic_merge(w0: Tensor, deltas: Sequence[Tensor], *, scale: float = 1.0) -> Tensor:
    r"""Task arithmetic $W_0 + \lambda\sum_e\Delta_e$ (``scale = 1/E`` is the average merge)."""
    if not deltas:
        raise ShapeError("deltas: expected at least one expert update")
    return w0 + scale * torch.stack(list(deltas)).sum(0)


def ties_merge(w0: Tensor, deltas: Sequence[Tensor], *, density: float = 0.2, scale: float = 1.0) -> Tensor:
    r"""TIES merging (Yadav et al. 2023, arXiv:2306.01708): trim to the top-``density`` magnitudes per
    expert, elect the sign of the summed trimmed deltas, average the agreeing entries (disjoint mean)."""
    check_in_range("density", density, 0.0, 1.0)
    d = torch.stack(list(deltas))  # [E, ..., m, n]
    flat = d.abs().flatten(start_dim=-2)
    keep_n = max(1, round(density * flat.shape[-1]))
    thresh = flat.topk(keep_n, dim=-1).values[..., -1:].unsqueeze(-1)
    trimmed = torch.where(d.abs() >= thresh, d, torch.zeros((), dtype=d.dtype))
    sign = torch.sign(trimmed.sum(0))
    agree = (torch.sign(trimmed) == sign) & (trimmed != 0)
    count = agree.sum(0).clamp(min=1)
    return w0 + scale * torch.where(agree, trimmed, torch.zeros((), dtype=d.dtype)).sum(0) / count


def dare_merge(
    w0: Tensor, deltas: Sequence[Tensor], *, drop: float = 0.9, scale: float = 1.0, generator: torch.Generator
) -> Tensor:
    r"""DARE (Yu et al. 2024, arXiv:2311.03099): drop entries with probability p, rescale by 1/(1-p), then add."""
    check_in_range("drop", drop, 0.0, 1.0)
    if drop >= 1.0:
        raise DomainError(f"drop: expected a value in [0, 1), got {drop!r}")
    d = torch.stack(list(deltas))
    keep = torch.rand(d.shape, generator=generator, dtype=d.dtype) >= drop
    return w0 + scale * (torch.where(keep, d, torch.zeros((), dtype=d.dtype)) / (1.0 - drop)).sum(0)


PROJECTIONS.add("sar", sar_project, paper="Zhang et al. 2026, SAR, arXiv:2607.03065")
PROJECTIONS.add("sar_merge", sar_merge, paper="Zhang et al. 2026, SAR, arXiv:2607.03065 (merge rule reconstructed)")
PROJECTIONS.add("ties_merge", ties_merge, paper="Yadav et al. 2023, TIES-merging, arXiv:2306.01708")
PROJECTIONS.add("dare_merge", dare_merge, paper="Yu et al. 2024, DARE, arXiv:2311.03099")
PROJECTIONS.add("task_arithmetic", task_arithmetic_merge, paper="Ilharco et al. 2023, arXiv:2212.04089")
