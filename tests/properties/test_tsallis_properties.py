"""Properties of the Tsallis loss continuum (spec 20 §8): q-logarithm, gradient identity, GARL/PAFT
limits, zero weights, scaling, bias, consistency, escape times, escort minimiser, symbolic twins."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.estimators import garl_loss, garl_weights, paft_loss, rloo_advantages
from posttrain.simulators.bandits import reward_gradient, sample_arms, success_prob
from posttrain.theory import tsallis as th

qs = st.floats(0.0, 1.0)
us = st.floats(1e-3, 1.0)


# ---------------------------------------------------------------- ln_q


@given(q=qs, u=us)
def test_ln_q_basic_facts(q: float, u: float) -> None:
    assert th.ln_q(1.0, q) == 0.0
    h = 1e-6 * u
    fd = (th.ln_q(u + h, q) - th.ln_q(u - h, q)) / (2 * h)
    assert math.isclose(fd, u ** (-q), rel_tol=1e-5)
    assert math.isclose(th.ln_q(u, 0.0), u - 1.0, rel_tol=1e-12, abs_tol=1e-15)


@given(u=us, q1=qs, q2=qs)
def test_ln_q_non_increasing_in_q_and_log_limit(u: float, q1: float, q2: float) -> None:
    lo, hi = sorted((q1, q2))
    assert th.ln_q(u, hi) <= th.ln_q(u, lo) + 1e-15
    assert abs(th.ln_q(u, 1.0 - 1e-6) - math.log(u)) <= 1e-4


def test_ln_q_matches_its_symbolic_twin() -> None:
    u, q, expr = th.symbolic_ln_q()
    f = sp.lambdify((u, q), expr)
    for uu in (1e-3, 0.2, 0.9):
        for qq in (0.0, 0.3, 0.9):
            assert math.isclose(f(uu, qq), th.ln_q(uu, qq), rel_tol=1e-12)


# ---------------------------------------------------------------- gradient identity and J_Q poles


@st.composite
def bandits(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    a = draw(st.integers(2, 6))
    logits = torch.tensor(draw(st.lists(st.floats(-3, 3), min_size=a, max_size=a)), dtype=torch.float64)
    correct = torch.tensor(draw(st.lists(st.booleans(), min_size=a, max_size=a)))
    correct[draw(st.integers(0, a - 1))] = True
    if bool(correct.all()):
        correct[0] = False
    return logits.unsqueeze(0), correct.unsqueeze(0)


def _grad(fn: Callable[[torch.Tensor], torch.Tensor], logits: torch.Tensor) -> torch.Tensor:
    theta = logits.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(fn(theta).sum(), theta)
    return g


@settings(max_examples=40)
@given(b=bandits(), q=qs)
def test_gradient_identity(b: tuple[torch.Tensor, torch.Tensor], q: float) -> None:
    logits, correct = b
    p = success_prob(logits, correct)
    g_q = _grad(lambda t: th.ell_q(success_prob(t, correct), q), logits)
    g_0 = _grad(lambda t: 1.0 - success_prob(t, correct), logits)
    g_1 = _grad(lambda t: -torch.log(success_prob(t, correct)), logits)
    torch.testing.assert_close(g_q, p.unsqueeze(-1) ** (-q) * g_0, rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(g_q, p.unsqueeze(-1) ** (1 - q) * g_1, rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(g_0, -reward_gradient(logits, correct.to(torch.float64)), rtol=1e-10, atol=1e-14)
    grad_p = _grad(lambda t: success_prob(t, correct), logits)
    torch.testing.assert_close(g_q, th.ell_q_gradient(p.unsqueeze(-1), grad_p, q), rtol=1e-6, atol=1e-12)


def test_gradient_identity_factor_is_symbolically_minus_p_to_the_minus_q() -> None:
    p, q, deriv = th.symbolic_ell_q_derivative()
    assert sp.simplify(deriv + p ** (-q)) == 0


@given(b=bandits())
def test_j_q_poles(b: tuple[torch.Tensor, torch.Tensor]) -> None:
    logits, correct = b
    p = success_prob(logits, correct)
    torch.testing.assert_close(th.ell_q(p, 0.0), 1.0 - p, rtol=0, atol=1e-15)
    torch.testing.assert_close(th.ell_q(p, 1.0), -torch.log(p), rtol=0, atol=1e-15)


# ---------------------------------------------------------------- GARL / PAFT limits


@st.composite
def weight_batches(draw: st.DrawFn) -> torch.Tensor:
    g, m = draw(st.integers(1, 3)), draw(st.integers(2, 6))
    vals = draw(st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1.0)), min_size=g * m, max_size=g * m))
    w = torch.tensor(vals, dtype=torch.float64).reshape(g, m)
    w[:, 0] = w[:, 0].clamp(min=1e-3)  # at least one positive weight per prompt
    return torch.log(w)


def _surrogate_grad(loss_fn: Callable[..., tuple[torch.Tensor, object]], logp: torch.Tensor, **kw: Any) -> torch.Tensor:
    x = logp.clone().requires_grad_(True)
    loss, _ = loss_fn(x, **kw)
    (g,) = torch.autograd.grad(loss.sum() / x.shape[0], x)
    return g


def _logp_and_masks(b: int, t: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logp = -torch.rand(b, t, generator=torch.Generator().manual_seed(b), dtype=torch.float64) - 0.1
    mask = torch.zeros(b, t, dtype=torch.bool)
    mask[:, :2] = True
    return logp, mask, ~mask


@given(log_w=weight_batches())
def test_garl_q0_is_rloo_and_q1_b0_is_self_normalised(log_w: torch.Tensor) -> None:
    w = log_w.exp()
    torch.testing.assert_close(garl_weights(log_w, q=0.0).trace, rloo_advantages(w), rtol=1e-10, atol=1e-12)
    snis = (
        w / w.sum(-1, keepdim=True) * w.shape[-1]
    )  # M * w_m / sum_j w_j: with the 1/(G M) reduction, sum_m (w_m / sum w)
    out = garl_weights(log_w, q=1.0, baseline="none")
    torch.testing.assert_close(out.trace, snis, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out.answer, snis, rtol=1e-10, atol=1e-12)


@given(log_w=weight_batches(), q=qs)
def test_paft_expectation_over_resampling_equals_garl_b0(log_w: torch.Tensor, q: float) -> None:
    g, m = log_w.shape
    logp, mask, ans = _logp_and_masks(g * m)
    rho = torch.softmax(log_w, -1)  # resampling probabilities w_m / sum w
    cdf = rho.cumsum(-1)
    lower = torch.cat([torch.zeros(g, 1, dtype=torch.float64), cdf[:, :-1]], -1)
    expected = torch.zeros_like(logp)
    for j in range(m):  # enumerate the outcome m* = j for every prompt at once (u inside its CDF interval)
        u = ((lower[:, j] + cdf[:, j]) / 2).unsqueeze(-1)
        grad_j = _surrogate_grad(paft_loss, logp, mask=mask, log_w=log_w, uniforms=u, q=q, answer_mask=ans)
        expected += grad_j * rho[:, j].repeat_interleave(m).unsqueeze(-1)
    garl = _surrogate_grad(garl_loss, logp, mask=mask, log_w=log_w, q=q, answer_mask=ans, baseline="none")
    torch.testing.assert_close(expected, garl, rtol=1e-10, atol=1e-12)


@given(q=qs, g=st.integers(1, 3), m=st.integers(1, 5))
def test_all_zero_weights_give_exactly_zero_loss_and_gradient(q: float, g: int, m: int) -> None:
    log_w = torch.full((g, m), -math.inf, dtype=torch.float64)
    logp, mask, ans = _logp_and_masks(g * m)
    cases: list[tuple[Callable[..., Any], dict[str, Any]]] = [
        (garl_loss, {}),
        (paft_loss, {"uniforms": torch.full((g, 2), 0.5, dtype=torch.float64)}),
    ]
    for fn, kw in cases:
        x = logp.clone().requires_grad_(True)
        loss, diag = fn(x, mask, log_w, q=q, answer_mask=ans, **kw)
        loss.sum().backward()
        assert x.grad is not None
        assert bool((loss == 0).all()) and bool((x.grad == 0).all())
        assert bool(torch.isfinite(diag.amplification).all())


@given(log_w=weight_batches(), q=qs, c=st.floats(1e-3, 1e3))
def test_scaling_all_weights_scales_garl_by_c_to_the_one_minus_q(log_w: torch.Tensor, q: float, c: float) -> None:
    for baseline in ("rloo", "none"):
        base = garl_weights(log_w, q=q, baseline=baseline)
        scaled = garl_weights(log_w + math.log(c), q=q, baseline=baseline)
        torch.testing.assert_close(scaled.trace, c ** (1 - q) * base.trace, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(scaled.answer, c ** (1 - q) * base.answer, rtol=1e-9, atol=1e-12)


def test_garl_is_consistent_for_large_m() -> None:
    """GARL's bandit gradient (1/M) sum_m A_m (e_a - pi) -> P^{-q} grad P as M grows (M = 1e5, rtol 2 %)."""
    logits = torch.tensor([[0.5, -0.2, 0.1, -1.0]], dtype=torch.float64)
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    m = 100_000
    arms = sample_arms(logits, m, torch.Generator().manual_seed(0))  # [1, M]
    r = rewards.gather(-1, arms)
    score = torch.nn.functional.one_hot(arms, 4).to(torch.float64) - torch.softmax(logits, -1).unsqueeze(-2)
    p = success_prob(logits, rewards > 0)
    for q in (0.0, 0.5, 1.0):
        est = (garl_weights(torch.log(r), q=q).trace.unsqueeze(-1) * score).mean(-2)
        exact = p.unsqueeze(-1) ** (-q) * reward_gradient(logits, rewards)
        assert float((est - exact).norm()) <= 0.02 * float(exact.norm())


# ---------------------------------------------------------------- bias of the amplification


@settings(max_examples=20)
@given(p=st.floats(0.05, 0.5), q=st.floats(0.05, 0.95))
def test_bias_jensen_and_limit(p: float, q: float) -> None:
    for m in (8, 32, 256):
        assert th.gradient_scale_deficit(p, q, m) >= -1e-12  # E[w^(1-q)] <= P^(1-q)
    exact, limit = th.gradient_scale_deficit(p, q, 2048), th.gradient_scale_deficit_limit(p, q)
    assert abs(exact - limit) <= 0.10 * limit


def test_bias_limits_match_their_symbolic_delta_method() -> None:
    for q in (0.25, 0.75):
        p_, m_, amp = th.symbolic_delta_method_bias(-q)
        _, _, scale = th.symbolic_delta_method_bias(1 - q)
        for p in (0.05, 0.3):
            assert math.isclose(float(amp.subs({p_: p, m_: 64})), th.amplification_bias_limit(p, q, 64), rel_tol=1e-12)
            assert math.isclose(
                -64 * float(scale.subs({p_: p, m_: 64})), th.gradient_scale_deficit_limit(p, q), rel_tol=1e-12
            )
    # the exact amplification bias approaches its limit when M P >> 1
    assert math.isclose(
        th.amplification_bias(0.3, 0.5, 4096), th.amplification_bias_limit(0.3, 0.5, 4096), rel_tol=0.05
    )


# ---------------------------------------------------------------- escape times


@settings(max_examples=30)
@given(p0=st.floats(1e-5, 0.2), q1=qs, q2=qs, shrink=st.floats(0.1, 0.9))
def test_escape_time_monotone_in_q_and_p0(p0: float, q1: float, q2: float, shrink: float) -> None:
    lo, hi = sorted((q1, q2))
    if hi - lo > 1e-6:
        assert th.escape_time(p0, hi) < th.escape_time(p0, lo)
    assert th.escape_time(p0 * shrink, lo) > th.escape_time(p0, lo)


def test_symbolic_escape_times_match_closed_forms_and_derivative() -> None:
    for q in (0, 1):
        p0, pe, expr = th.symbolic_escape_time(q)
        f = sp.lambdify((p0, pe), expr)
        for x in (1e-4, 0.01, 0.2):
            assert math.isclose(f(x, 0.5), th.escape_time_closed_form(x, float(q)), rel_tol=1e-10)
    p0, pe, t0 = th.symbolic_escape_time(0)
    # dT_0/dp0 = -1 / Pdot(p0) with Pdot = P^2 (1 - P)^2
    assert sp.simplify(sp.diff(t0, p0) + 1 / (p0**2 * (1 - p0) ** 2)) == 0


# ---------------------------------------------------------------- escort minimiser


@settings(max_examples=25)
@given(raw=st.lists(st.floats(0.02, 1.0), min_size=2, max_size=5), q=st.floats(0.2, 1.0))
def test_escort_minimiser_is_the_numerical_minimiser(raw: list[float], q: float) -> None:
    alpha = np.asarray(raw) / np.sum(raw)
    if alpha.min() < 0.02:
        alpha = (alpha + 0.02) / (1 + 0.02 * alpha.size)
    fit = th.fit_noisy_label_policy(alpha, q)
    assert 0.5 * np.abs(fit - th.escort_minimiser(alpha, q)).sum() <= 1e-3
