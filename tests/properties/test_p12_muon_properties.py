"""Spec 12 section 8: Newton-Schulz and Muon/AdamW properties (float64 unless stated)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators.optim import (
    NS_COEFFICIENTS,
    adamw_init,
    adamw_steady_state_rms,
    adamw_update,
    group_update_rms,
    muon_init,
    muon_scale,
    muon_update,
    newton_schulz5,
    route_muon_parameters,
    update_rms,
)

dims = st.integers(2, 12)
seeds = st.integers(0, 2**31 - 1)


def _orth(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(n, k, generator=g, dtype=torch.float64)).Q


def _matrix_with_spectrum(m: int, n: int, s: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    q = min(m, n)
    p, qq = _orth(m, q, g), _orth(n, q, g)
    return p @ torch.diag(s) @ qq.T, p, qq


def _phi5(x: torch.Tensor) -> torch.Tensor:
    a, b, c = NS_COEFFICIENTS
    for _ in range(5):
        x = a * x + b * x**3 + c * x**5
    return x


@given(m=dims, n=dims, seed=seeds)
def test_ns_band_and_spectral_equivariance(m: int, n: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    q = min(m, n)
    s = torch.exp(torch.empty(q, dtype=torch.float64).uniform_(math.log(3e-3), 0.0, generator=g))
    s = s / s.norm()  # normalised singular values
    s = torch.where(s < 3e-3, torch.full_like(s, 3e-3), s)
    G, p, qq = _matrix_with_spectrum(m, n, s, g)
    out = newton_schulz5(G, eps=0.0, compute_dtype=None)
    sv = torch.linalg.svdvals(out)
    assert float(sv.min()) >= 0.65 and float(sv.max()) <= 1.25
    expected = p @ torch.diag(_phi5(s / torch.linalg.matrix_norm(G))) @ qq.T
    torch.testing.assert_close(out, expected, atol=1e-9, rtol=0)


@given(m=dims, n=dims, seed=seeds, c=st.floats(0.1, 10.0))
def test_ns_symmetries(m: int, n: int, seed: int, c: float) -> None:
    g = torch.Generator().manual_seed(seed)
    G = torch.randn(m, n, generator=g, dtype=torch.float64)
    ns = lambda x: newton_schulz5(x, eps=0.0, compute_dtype=None)  # noqa: E731
    base = ns(G)
    torch.testing.assert_close(ns(G.T), base.T, atol=1e-10, rtol=0)
    torch.testing.assert_close(ns(c * G), base, atol=1e-10, rtol=0)
    torch.testing.assert_close(ns(-G), -base, atol=1e-10, rtol=0)
    r, s = _orth(m, m, g), _orth(n, n, g)
    torch.testing.assert_close(ns(r @ G @ s), r @ base @ s, atol=1e-9, rtol=0)


def test_ns_zero_input_is_zero() -> None:
    out = newton_schulz5(torch.zeros(5, 3))
    assert torch.equal(out, torch.zeros(5, 3))


@given(m=dims, n=dims, seed=seeds, nesterov=st.booleans())
@settings(max_examples=30)
def test_momentum_conventions_agree(m: int, n: int, seed: int, nesterov: bool) -> None:
    """EMA momentum (ours) and SGD momentum (B = mu B + G, U = G + mu B) give the same orthogonalised step."""
    g = torch.Generator().manual_seed(seed)
    mu = 0.95
    w = torch.randn(m, n, generator=g, dtype=torch.float64)
    state = muon_init([w])
    sgd_buf = torch.zeros_like(w)
    for _ in range(4):
        grad = torch.randn(m, n, generator=g, dtype=torch.float64)
        (up,), state = muon_update(
            [grad], state, [w], lr=1.0, weight_decay=0.0, nesterov=nesterov, eps=0.0, compute_dtype=None
        )
        sgd_buf = mu * sgd_buf + grad
        u = grad + mu * sgd_buf if nesterov else sgd_buf
        expected = -muon_scale(m, n) * newton_schulz5(u, eps=0.0, compute_dtype=None)
        torch.testing.assert_close(up, expected, atol=1e-9, rtol=0)


@given(m=dims, n=dims, seed=seeds)
def test_fan_in_rms_with_exact_polar_factor(m: int, n: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    u, _, vh = torch.linalg.svd(torch.randn(m, n, generator=g, dtype=torch.float64), full_matrices=False)
    polar = u @ vh
    assert float(update_rms(muon_scale(m, n) * polar)) == pytest.approx(1 / math.sqrt(n), rel=1e-12)
    assert float(update_rms(muon_scale(m, n, "match_rms_adamw") * polar)) == pytest.approx(0.2, rel=1e-12)


@given(m=dims, n=dims, seed=seeds, lr=st.floats(1e-4, 1.0), wd=st.floats(0.0, 0.5))
def test_zero_gradient_is_pure_weight_decay(m: int, n: int, seed: int, lr: float, wd: float) -> None:
    w = torch.randn(m, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    (up,), _ = muon_update([torch.zeros_like(w)], muon_init([w]), [w], lr=lr, weight_decay=wd)
    torch.testing.assert_close(w + up, (1 - lr * wd) * w, atol=1e-15, rtol=1e-15)


def test_routing_partitions_and_keeps_vectors_off_muon() -> None:
    named = [
        ("model.embed_tokens.weight", torch.zeros(10, 4)),
        ("model.layers.0.self_attn.q_proj.weight", torch.zeros(4, 4)),
        ("model.layers.0.self_attn.q_proj.bias", torch.zeros(4)),
        ("model.layers.0.mlp.down_proj.weight", torch.zeros(4, 8)),
        ("model.layers.0.input_layernorm.weight", torch.zeros(4)),
        ("lm_head.weight", torch.zeros(10, 4)),
    ]
    for _, p in named:
        p.requires_grad_(True)
    muon, adamw = route_muon_parameters(named)
    assert set(muon) | set(adamw) == {n for n, _ in named} and not set(muon) & set(adamw)
    assert muon == ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"]


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust", [None, "match_rms_adamw"])
def test_agrees_with_torch_muon(nesterov: bool, adjust: str | None) -> None:
    if not hasattr(torch.optim, "Muon"):
        pytest.skip("torch.optim.Muon is not in this torch version")
    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 12, generator=g)
    p = torch.nn.Parameter(w.clone())
    opt = torch.optim.Muon([p], lr=0.02, weight_decay=0.01, nesterov=nesterov, adjust_lr_fn=adjust)
    state, cur = muon_init([w]), w.clone()
    for _ in range(3):
        grad = torch.randn(24, 12, generator=g)
        p.grad = grad.clone()
        opt.step()
        (up,), state = muon_update(
            [grad], state, [cur], lr=0.02, weight_decay=0.01, nesterov=nesterov, scale=adjust or "original"
        )
        cur = cur + up
    # Both run Newton-Schulz in bf16 with fused multiply-adds: tolerance = one bf16 ulp (2^-8) of the step size.
    step = 0.02 * muon_scale(24, 12, adjust or "original")
    torch.testing.assert_close(cur, p.detach(), atol=step * 2**-8, rtol=0)


def test_adamw_matches_torch_and_steady_state_rms() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 8, generator=g, dtype=torch.float64)
    p = torch.nn.Parameter(w.clone())
    opt = torch.optim.AdamW([p], lr=0.01, weight_decay=0.01)
    state, cur = adamw_init([w]), w.clone()
    for _ in range(5):
        grad = torch.randn(8, 8, generator=g, dtype=torch.float64)
        p.grad = grad.clone()
        opt.step()
        (up,), state = adamw_update([grad], state, [cur], lr=0.01, weight_decay=0.01)
        cur = cur + up
    torch.testing.assert_close(cur, p.detach(), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("beta1", [0.8, 0.9, 0.95])
def test_adamw_low_snr_rms(beta1: float) -> None:
    """Steady state RMS of m_hat / sqrt(v_hat) for iid N(0,1) gradients after 3000 steps (spec: within 0.02)."""
    g = torch.Generator().manual_seed(1)
    w = torch.zeros(64, 64, dtype=torch.float64)
    state = adamw_init([w])
    for _ in range(3000):
        (up,), state = adamw_update(
            [torch.randn(64, 64, generator=g, dtype=torch.float64)],
            state,
            [w],
            lr=1.0,
            betas=(beta1, 0.999),
            weight_decay=0.0,
            eps=1e-12,
        )
    assert abs(float(update_rms(up)) - adamw_steady_state_rms(beta1)) < 0.02


@given(seed=seeds, c=st.floats(-5, 5).filter(lambda c: c == 0 or abs(c) > 1e-100))  # Frobenius norm underflows below
def test_update_rms_homogeneous(seed: int, c: float) -> None:
    d = torch.randn(5, 7, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    assert float(update_rms(c * d)) == pytest.approx(abs(c) * float(update_rms(d)), rel=1e-12, abs=1e-300)
    assert float(update_rms(torch.full((3, 4), c, dtype=torch.float64))) == pytest.approx(abs(c), rel=1e-12)


def test_rms_matched_rescaling_is_exact() -> None:
    g = torch.Generator().manual_seed(3)
    w = torch.randn(16, 8, generator=g, dtype=torch.float64)
    grad = torch.randn(16, 8, generator=g, dtype=torch.float64)
    rho = 7.3
    (hi,), _ = muon_update([grad], muon_init([w]), [w], lr=0.03, weight_decay=0.0, compute_dtype=None)
    (lo,), _ = muon_update([grad], muon_init([w]), [w], lr=0.03 / rho, weight_decay=0.0, compute_dtype=None)
    assert float(group_update_rms([hi]) / group_update_rms([lo])) == pytest.approx(rho, rel=1e-6)


def test_batched_rates_match_individual_runs() -> None:
    g = torch.Generator().manual_seed(4)
    w = torch.randn(3, 6, 4, generator=g, dtype=torch.float64)
    grad = torch.randn(3, 6, 4, generator=g, dtype=torch.float64)
    lrs = torch.tensor([0.1, 0.01, 0.001], dtype=torch.float64)
    (batched,), _ = muon_update([grad], muon_init([w]), [w], lr=lrs, compute_dtype=None)
    for i in range(3):
        (one,), _ = muon_update([grad[i]], muon_init([w[i]]), [w[i]], lr=float(lrs[i]), compute_dtype=None)
        torch.testing.assert_close(batched[i], one, atol=1e-14, rtol=0)


def test_bad_inputs_name_the_argument() -> None:
    w = torch.zeros(3, 3)
    with pytest.raises(ShapeError, match="params"):
        muon_init([torch.zeros(3)])
    with pytest.raises(DomainError, match="momentum"):
        muon_update([w], muon_init([w]), [w], lr=0.1, momentum=1.0)
    with pytest.raises(ShapeError, match="grads"):
        muon_update([torch.zeros(2, 3)], muon_init([w]), [w], lr=0.1)
    with pytest.raises(DomainError, match="scale"):
        muon_scale(3, 3, "bogus")
    with pytest.raises(ShapeError, match="g"):
        newton_schulz5(torch.zeros(3))
