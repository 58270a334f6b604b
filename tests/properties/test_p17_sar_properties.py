"""Spec 17 section 8: properties of the SAR projection (float64, tolerance 1e-8 (1 + ||D||_F))."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators.merging import sar_merge, sar_project, sar_rank, task_arithmetic_merge

dims = st.integers(2, 16)
seeds = st.integers(0, 2**31 - 1)


def _pair(m: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, n, generator=g, dtype=torch.float64), torch.randn(m, n, generator=g, dtype=torch.float64)


def _tol(d: torch.Tensor) -> float:
    return 1e-8 * (1 + float(torch.linalg.matrix_norm(d)))


def _frame(w0: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    u, _, vh = torch.linalg.svd(w0, full_matrices=False)
    return u[:, :r], vh[:r].T


@given(m=dims, n=dims, seed=seeds, k=st.integers(1, 16), r=st.integers(1, 16))
def test_idempotent_rank_bounded_and_orthogonal(m: int, n: int, seed: int, k: int, r: int) -> None:
    w0, d = _pair(m, n, seed)
    out = sar_project(w0, d, k=k, base_rank=r)
    again = sar_project(w0, out, k=k, base_rank=r)
    torch.testing.assert_close(again, out, atol=_tol(d), rtol=0)
    assert int(torch.linalg.matrix_rank(out, atol=1e-9)) <= min(k, r, m, n)
    u, s, vh = torch.linalg.svd(d, full_matrices=False)
    dk = u[:, :k] * s[:k] @ vh[:k]
    assert abs(float((out * (dk - out)).sum())) <= _tol(d) * (1 + float(torch.linalg.matrix_norm(d)))
    assert float(torch.linalg.matrix_norm(out)) <= float(torch.linalg.matrix_norm(dk)) + _tol(d)
    assert float(torch.linalg.matrix_norm(dk)) <= float(torch.linalg.matrix_norm(d)) + _tol(d)


@given(m=dims, n=dims, seed=seeds, r=st.integers(1, 15))
def test_annihilates_updates_outside_the_base_frame(m: int, n: int, seed: int, r: int) -> None:
    w0, a = _pair(m, n, seed)
    r = min(r, min(m, n) - 1) if min(m, n) > 1 else 1
    ur, vr = _frame(w0, r)
    left = a - ur @ (ur.T @ a)  # (I - P_L) A
    right = a - (a @ vr) @ vr.T  # A (I - P_R)
    for d in (left, right):
        torch.testing.assert_close(
            sar_project(w0, d, k=min(m, n), base_rank=r), torch.zeros_like(d), atol=_tol(d), rtol=0
        )


@given(m=dims, n=dims, seed=seeds, r=st.integers(1, 16), rank_b=st.integers(1, 4))
def test_identity_on_aligned_low_rank_updates(m: int, n: int, seed: int, r: int, rank_b: int) -> None:
    w0, _ = _pair(m, n, seed)
    r = min(r, m, n)
    ur, vr = _frame(w0, r)
    g = torch.Generator().manual_seed(seed + 1)
    rank_b = min(rank_b, r)
    b = torch.randn(r, rank_b, generator=g, dtype=torch.float64) @ torch.randn(
        rank_b, r, generator=g, dtype=torch.float64
    )
    d = ur @ b @ vr.T
    torch.testing.assert_close(sar_project(w0, d, k=rank_b, base_rank=r), d, atol=_tol(d), rtol=0)


@given(n=dims, seed=seeds, k=st.integers(1, 16))
def test_square_full_rank_base_is_eckart_young_truncation(n: int, seed: int, k: int) -> None:
    w0, d = _pair(n, n, seed)
    k = min(k, n)
    out = sar_project(w0, d, k=k)
    s = torch.linalg.svdvals(d)
    assert float(torch.linalg.matrix_norm(d - out) ** 2) == pytest.approx(float((s[k:] ** 2).sum()), abs=_tol(d))


@given(m=dims, n=dims, seed=seeds, c=st.floats(-3, 3), cb=st.floats(0.1, 10))
def test_homogeneity_and_base_scale_invariance(m: int, n: int, seed: int, c: float, cb: float) -> None:
    w0, d = _pair(m, n, seed)
    k = min(m, n)
    base = sar_project(w0, d, k=k)
    torch.testing.assert_close(sar_project(w0, c * d, k=k), c * base, atol=_tol(d) * (1 + abs(c)), rtol=0)
    torch.testing.assert_close(sar_project(cb * w0, d, k=k), base, atol=_tol(d), rtol=0)
    torch.testing.assert_close(sar_project(-w0, d, k=k), base, atol=_tol(d), rtol=0)


@given(m=dims, n=dims, seed=seeds, k=st.integers(1, 16))
def test_rotation_equivariance(m: int, n: int, seed: int, k: int) -> None:
    w0, d = _pair(m, n, seed)
    g = torch.Generator().manual_seed(seed + 2)
    ql = torch.linalg.qr(torch.randn(m, m, generator=g, dtype=torch.float64)).Q
    qr = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64)).Q
    torch.testing.assert_close(
        sar_project(ql @ w0 @ qr, ql @ d @ qr, k=k),
        ql @ sar_project(w0, d, k=k) @ qr,
        atol=1e-7 * (1 + float(torch.linalg.matrix_norm(d))),
        rtol=0,
    )


@given(m=dims, n=dims, seed=seeds, k=st.integers(1, 16))
def test_masks_split_the_rewiring_matrix(m: int, n: int, seed: int, k: int) -> None:
    w0, d = _pair(m, n, seed)
    full = sar_project(w0, d, k=k)
    diag, off = sar_project(w0, d, k=k, mask="diagonal"), sar_project(w0, d, k=k, mask="off_diagonal")
    torch.testing.assert_close(diag + off, full, atol=_tol(d), rtol=0)
    ur, vr = _frame(w0, min(m, n))
    md, mo = ur.T @ diag @ vr, ur.T @ off @ vr
    torch.testing.assert_close(md, torch.diag_embed(md.diagonal()), atol=_tol(d), rtol=0)
    torch.testing.assert_close(mo.diagonal(), torch.zeros(min(m, n), dtype=torch.float64), atol=_tol(d), rtol=0)


def test_zero_update_and_k_formula() -> None:
    w0 = torch.randn(5, 7, dtype=torch.float64)
    out = sar_project(w0, torch.zeros_like(w0))
    assert torch.equal(out, torch.zeros_like(w0))
    for rho in (1e-6, 0.01, 0.5, 1.0):
        assert sar_rank(rho, 5, 7) >= 1
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(DomainError, match="delta_fraction"):
            sar_rank(bad, 5, 7)


@given(n=dims, seed=seeds)
def test_full_rank_merge_equals_task_arithmetic(n: int, seed: int) -> None:
    w0, d1 = _pair(n, n, seed)
    _, d2 = _pair(n, n, seed + 1)
    torch.testing.assert_close(
        sar_merge(w0, [d1, d2], k=n), task_arithmetic_merge(w0, [d1, d2]), atol=2 * _tol(d1 + d2), rtol=0
    )


def test_bad_inputs_name_the_argument() -> None:
    with pytest.raises(ShapeError, match="delta"):
        sar_project(torch.zeros(3, 4), torch.zeros(4, 3))
    with pytest.raises(DomainError, match="mask"):
        sar_project(torch.eye(3), torch.eye(3), mask="nope")
    with pytest.raises(ShapeError, match="w0"):
        sar_project(torch.zeros(3), torch.zeros(3))


@given(m=dims, n=dims, seed=seeds, k=st.integers(1, 16))
def test_qr_fast_path_equals_svd_frame(m: int, n: int, seed: int, k: int) -> None:
    """Full base rank: the QR path (default) equals the explicit SVD frame with r = min(m, n)."""
    w0, d = _pair(m, n, seed)
    torch.testing.assert_close(
        sar_project(w0, d, k=k), sar_project(w0, d, k=k, base_rank=min(m, n)), atol=_tol(d), rtol=0
    )


def test_rank_deficient_base_drops_null_directions() -> None:
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(6, 2, generator=g, dtype=torch.float64) @ torch.randn(2, 6, generator=g, dtype=torch.float64)
    d = torch.randn(6, 6, generator=g, dtype=torch.float64)
    out = sar_project(w0, d, k=6)
    u, _, vh = torch.linalg.svd(w0)
    expected = u[:, :2] @ (u[:, :2].T @ d @ vh[:2].T) @ vh[:2]
    torch.testing.assert_close(out, expected, atol=1e-9, rtol=0)


def test_randomized_truncation_close_to_exact_for_low_rank_delta() -> None:
    g = torch.Generator().manual_seed(1)
    w0 = torch.randn(40, 30, generator=g, dtype=torch.float64)
    d = torch.randn(40, 3, generator=g, dtype=torch.float64) @ torch.randn(3, 30, generator=g, dtype=torch.float64)
    torch.testing.assert_close(sar_project(w0, d, k=3, randomized=True), sar_project(w0, d, k=3), atol=1e-8, rtol=0)
