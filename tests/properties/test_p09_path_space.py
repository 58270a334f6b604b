"""Spec 09 section 8: the mathematics of the path-space estimators (hypothesis, float64).

Exact identities are tested to 1e-10; Monte Carlo statements within Z standard errors of the
quantity tested (Z = 4, a two-sided false-alarm rate ~6e-5 per assertion).
"""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.estimators import (
    Curvature,
    awm_loss,
    bounded_weight,
    deterministic_value_gradient,
    elbo_weight,
    girsanov_log_weights,
    girsanov_template_weights,
    is_scale_bounded,
    ito_policy_gradient,
    kde_value_gradient,
    nft_loss,
    path_score,
    scale_bounded_loss,
    stochastic_value_gradient,
    template_loss,
    value_gradient_policy_gradient,
)
from posttrain.simulators.sde import GaussianMixture, forward_noise, simulate_flow_sde

F64 = torch.float64
Z = 4.0
seeds = st.integers(0, 2**31 - 1)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _within(samples: torch.Tensor, target: float | torch.Tensor) -> bool:
    se = samples.std(0) / math.sqrt(samples.shape[0])
    return bool(((samples.mean(0) - target).abs() <= Z * se + 1e-12).all())


@given(seed=seeds, d=st.integers(1, 4), s=st.integers(1, 5))
def test_girsanov_step_equals_the_gaussian_transition_log_ratio(seed: int, d: int, s: int) -> None:
    g = _gen(seed)
    mu_p, mu_q, y = (torch.randn(3, s, d, generator=g, dtype=F64) for _ in range(3))
    diff = torch.rand(s, generator=g, dtype=F64) + 0.2
    dr = torch.rand(s, generator=g, dtype=F64) * 0.5 + 0.01
    eps = torch.randn(3, s, d, generator=g, dtype=F64)
    y_next = y + mu_q * dr[:, None] + diff[:, None] * dr.sqrt()[:, None] * eps
    scale = (diff * dr.sqrt())[:, None]

    def logpdf(mu: torch.Tensor) -> torch.Tensor:
        return torch.distributions.Normal(y + mu * dr[:, None], scale).log_prob(y_next).sum(-1)

    torch.testing.assert_close(
        girsanov_log_weights(mu_p - mu_q, diff, eps, dr), logpdf(mu_p) - logpdf(mu_q), rtol=1e-10, atol=1e-10
    )
    # identical drifts: weight 1; the score is the theta-derivative of the log-weight at zero
    assert bool((girsanov_log_weights(torch.zeros_like(mu_p), diff, eps, dr) == 0).all())
    h = 1e-6
    fd = (girsanov_log_weights(h * mu_p, diff, eps, dr) - girsanov_log_weights(-h * mu_p, diff, eps, dr)) / (2 * h)
    torch.testing.assert_close(path_score(mu_p, diff, eps, dr), fd, rtol=1e-6, atol=1e-6)


def _toy_paths(seed: int, n: int, steps: int = 40):
    gm = GaussianMixture.bimodal_1d()
    g = _gen(seed)
    paths = simulate_flow_sde(gm.velocity, gm.sample_t(n, 0.95, generator=g), t_start=0.95, steps=steps, generator=g)
    t = 1.0 - paths.grid[:-1]
    window = ((t > 0.2) & (t <= 0.8)).to(F64)
    drift_grad = (-2.0 * window).expand(n, steps)[..., None]  # eta = 1: d mu / d theta = -(1 + eta) h(t)
    return gm, g, paths, drift_grad


@settings(max_examples=4)
@given(seed=seeds, theta=st.floats(-0.5, 0.5))
def test_girsanov_weights_have_mean_one_and_scores_mean_zero(seed: int, theta: float) -> None:
    _, _, paths, drift_grad = _toy_paths(seed, 20_000)
    logw = girsanov_log_weights(theta * drift_grad, paths.diffusion, paths.noise, paths.dr).sum(-1)
    assert _within(logw.exp(), 1.0)
    assert _within(path_score(drift_grad, paths.diffusion, paths.noise, paths.dr).sum(-1), 0.0)


@given(seed=seeds, t=st.floats(0.02, 0.98), d=st.integers(1, 3))
def test_conditional_score_identities(seed: int, t: float, d: int) -> None:
    g = _gen(seed)
    x0 = torch.randn(5, d, generator=g, dtype=F64) * 2
    x_t, v = forward_noise(x0, torch.full((5, 1), t, dtype=F64), torch.randn(5, 1, d, generator=g, dtype=F64))
    x_t = x_t[:, 0].requires_grad_(True)
    logq = torch.distributions.Normal((1 - t) * x0, t).log_prob(x_t).sum()
    (grad,) = torch.autograd.grad(logq, x_t)
    torch.testing.assert_close(grad, -(x_t.detach() + (1 - t) * v[:, 0]) / t, rtol=1e-10, atol=1e-10)


def test_target_velocity_has_mean_minus_x0() -> None:
    g = _gen(3)
    x0 = torch.tensor([[1.5, -0.5]], dtype=F64).expand(50_000, 2)
    _, v = forward_noise(x0, torch.full((50_000, 1), 0.4, dtype=F64), torch.randn(50_000, 1, 2, generator=g, dtype=F64))
    assert _within(v[:, 0], -x0[0])


@settings(max_examples=20)
@given(
    x=st.floats(-5, 5),
    t=st.floats(0.01, 0.99),
    w=st.floats(0.1, 0.9),
    m=st.floats(-3, 3),
    s1=st.floats(0.1, 2),
    s2=st.floats(0.1, 2),
)
def test_mixture_score_identity_against_autograd(x: float, t: float, w: float, m: float, s1: float, s2: float) -> None:
    gm = GaussianMixture((w, 1 - w), ((m,), (-1.0,)), (s1, s2))
    xx = torch.tensor([[x]], dtype=F64, requires_grad=True)
    (grad,) = torch.autograd.grad(gm.log_prob_t(xx, t).sum(), xx)
    torch.testing.assert_close(-(xx.detach() + (1 - t) * gm.velocity(xx.detach(), t)) / t, grad, rtol=1e-8, atol=1e-8)


@given(seed=seeds, d=st.integers(1, 3))
def test_stochastic_value_gradient_reproduces_ito_exactly(seed: int, d: int) -> None:
    g = _gen(seed)
    n, s = 6, 5
    adv = torch.randn(n, generator=g, dtype=F64)
    drift_grad, noise = torch.randn(2, n, s, d, generator=g, dtype=F64)
    diff, dr = torch.rand(2, s, generator=g, dtype=F64) + 0.1
    vg = stochastic_value_gradient(adv, diff, noise, dr)
    torch.testing.assert_close(
        value_gradient_policy_gradient(drift_grad, vg, dr),
        ito_policy_gradient(adv, drift_grad, diff, noise, dr),
        rtol=1e-10,
        atol=1e-10,
    )


def _det_estimates(gm: GaussianMixture, g: torch.Generator, x0: torch.Tensor, adv: torch.Tensor, kt: int = 6):
    n = x0.shape[0]
    t = 0.2 + 0.6 * torch.rand(n, kt, generator=g, dtype=F64)
    x_t, v = forward_noise(x0, t, torch.randn(n, kt, 1, generator=g, dtype=F64))
    vg = deterministic_value_gradient(adv, v, gm.velocity(x_t, t), t)
    return value_gradient_policy_gradient(torch.full_like(vg, -2.0), vg, torch.full((kt,), 0.6 / kt, dtype=F64)), t, vg


@settings(max_examples=3)
@given(seed=seeds, shift=st.floats(-2, 2).filter(lambda c: abs(c) > 0.1))
def test_baseline_shift_changes_variance_not_expectation(seed: int, shift: float) -> None:
    gm, g, paths, drift_grad = _toy_paths(seed, 20_000)
    x0 = paths.states[:, -1]
    adv = torch.sigmoid(3 * x0[:, 0]) - 0.5
    ones = torch.ones_like(adv)
    # the estimators are linear in A: the change from A -> A + c is c x (estimator with A = 1), mean zero
    assert _within(ito_policy_gradient(shift * ones, drift_grad, paths.diffusion, paths.noise, paths.dr), 0.0)
    assert _within(_det_estimates(gm, g, x0, shift * ones)[0], 0.0)


@given(seed=seeds, d=st.integers(1, 4), beta=st.floats(0.1, 3.0), t=st.floats(0.05, 0.95))
def test_awm_nft_template_algebra(seed: int, d: int, beta: float, t: float) -> None:
    g = _gen(seed)
    v_theta, v_old, v = torch.randn(3, 4, d, generator=g, dtype=F64)
    rho = torch.rand(4, generator=g, dtype=F64)
    adv = torch.randn(4, generator=g, dtype=F64)
    tt = torch.full((4,), t, dtype=F64)
    dv, dd = v_theta - v_old, v - v_old
    sq = lambda a: (a**2).sum(-1)  # noqa: E731
    dot = (dd * dv).sum(-1)
    a_nft = 2 * rho - 1
    torch.testing.assert_close(
        nft_loss(v_theta, v_old, v, rho, beta=beta),
        beta**2 * sq(dv) - 2 * beta * a_nft * dot + sq(dd),
        rtol=1e-10,
        atol=1e-10,
    )
    w = elbo_weight(tt)
    torch.testing.assert_close(
        awm_loss(v_theta, v, adv, w), adv * w * sq(dv) - 2 * adv * w * dot + adv * w * sq(dd), rtol=1e-10, atol=1e-10
    )
    # Girsanov instance at eta = 1 with the deterministic value gradient = AWM with the ELBO weight (+ const)
    w1, w2 = girsanov_template_weights(adv, tt, torch.ones_like(tt))
    vg = -elbo_weight(tt)[:, None] * adv[:, None] * dd
    torch.testing.assert_close(
        template_loss(dv, vg, w1, w2), awm_loss(v_theta, v, adv, w) - adv * w * sq(dd), rtol=1e-9, atol=1e-9
    )
    # kappa = 0 (w = 1): signed curvature is AWM(w = 1), curvature one is NFT(beta = 1) with A = 2 rho - 1
    ones = torch.ones_like(tt)
    torch.testing.assert_close(
        scale_bounded_loss(v_theta, v_old, v, adv, tt, kappa=0.0, curvature=Curvature.SIGNED),
        awm_loss(v_theta, v, adv, ones) - adv * sq(dd),
        rtol=1e-10,
        atol=1e-10,
    )
    torch.testing.assert_close(
        scale_bounded_loss(v_theta, v_old, v, a_nft, tt, kappa=0.0, curvature=Curvature.ONE),
        nft_loss(v_theta, v_old, v, rho, beta=1.0) - sq(dd),
        rtol=1e-10,
        atol=1e-10,
    )
    # gradients in v_theta at v_theta = v_old are proportional to A d
    at = v_old.clone().requires_grad_(True)
    (g_awm,) = torch.autograd.grad(awm_loss(at, v, adv, w).sum(), at)
    (g_nft,) = torch.autograd.grad(nft_loss(at, v_old, v, rho, beta=beta).sum(), at)
    torch.testing.assert_close(g_awm, -2 * (adv * w)[:, None] * dd, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(g_nft, -2 * beta * a_nft[:, None] * dd, rtol=1e-10, atol=1e-10)


@settings(max_examples=2)
@given(seed=seeds)
def test_first_order_equivalence_of_template_and_ito(seed: int) -> None:
    """d/dtheta of the Girsanov-instance template loss at theta_old = -grad J (Itô), in expectation."""
    gm, g, paths, drift_grad = _toy_paths(seed, 20_000)
    x0 = paths.states[:, -1]
    adv = torch.sigmoid(3 * x0[:, 0]) - 0.5
    ito = ito_policy_gradient(adv, drift_grad, paths.diffusion, paths.noise, paths.dr)
    _, t, vg = _det_estimates(gm, g, x0, adv)
    theta = torch.zeros(x0.shape[0], dtype=F64, requires_grad=True)  # one copy per rollout: per-rollout gradients
    delta_v = theta[:, None, None] * torch.ones_like(vg)  # v_theta = v_old + theta h(t), h = 1 on the window
    w1, w2 = girsanov_template_weights(adv[:, None].expand_as(t), t, torch.ones_like(t))
    per_rollout = template_loss(delta_v, vg, w1, w2).mean(-1) * 0.6  # integral over the window (0.2, 0.8]
    (loss_grad,) = torch.autograd.grad(per_rollout.sum(), theta)
    diff_mean = float(loss_grad.mean() + ito.mean())
    se = math.hypot(float(loss_grad.std()), float(ito.std())) / math.sqrt(x0.shape[0])
    assert abs(diff_mean) <= Z * se + 0.04 * abs(float(ito.mean()))  # 4%: Euler discretisation (spec 09 s7)


@given(seed=seeds, k=st.integers(2, 8), d=st.integers(1, 3))
def test_kde_limits(seed: int, k: int, d: int) -> None:
    g = _gen(seed)
    x0 = torch.randn(2, k, d, generator=g, dtype=F64) * 2
    adv = torch.randn(2, k, generator=g, dtype=F64)
    t = torch.rand(2, 3, generator=g, dtype=F64) * 0.9 + 0.05
    x_t = torch.randn(2, 3, d, generator=g, dtype=F64)
    out = kde_value_gradient(x_t, t, x0, adv)
    # K = 1 and constant rewards give zero
    assert bool((kde_value_gradient(x_t, t, x0[:, :1], adv[:, :1]).grad == 0).all())
    torch.testing.assert_close(
        kde_value_gradient(x_t, t, x0, torch.full_like(adv, 0.7)).grad, torch.zeros_like(out.grad), rtol=0, atol=1e-12
    )
    # permutation equivariance over members and invariance to a constant advantage shift
    perm = torch.randperm(k, generator=g)
    torch.testing.assert_close(
        kde_value_gradient(x_t, t, x0[:, perm], adv[:, perm]).grad, out.grad, rtol=1e-10, atol=1e-10
    )
    torch.testing.assert_close(kde_value_gradient(x_t, t, x0, adv + 3.0).grad, out.grad, rtol=1e-9, atol=1e-9)
    # t -> 1: uniform weights; t -> 0: the member that generated x_t takes all the weight
    near_one = kde_value_gradient(x_t, torch.full_like(t, 1 - 1e-9), x0, adv)
    torch.testing.assert_close(near_one.effective_size, torch.full_like(t, float(k)), rtol=1e-6, atol=1e-6)
    own = x0[:, :1].expand(2, 3, d) * (1 - 1e-3) + 1e-3 * torch.randn(2, 3, d, generator=g, dtype=F64)
    near_zero = kde_value_gradient(own, torch.full_like(t, 1e-3), x0, adv)
    if float(torch.cdist(x0, x0).add(torch.eye(k, dtype=F64) * 1e9).min()) > 0.2:  # members well separated
        torch.testing.assert_close(near_zero.effective_size, torch.ones_like(t), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(near_zero.value, adv[:, :1].expand(2, 3), rtol=1e-6, atol=1e-6)


@given(kappa=st.floats(0.0, 1.0), gamma=st.floats(1.0, 50.0), t_max=st.floats(0.1, 1.0))
def test_scale_bounded_families(kappa: float, gamma: float, t_max: float) -> None:
    assert not is_scale_bounded(elbo_weight, 0.0, min(t_max, 0.5))
    assert is_scale_bounded(torch.ones_like, 0.0, t_max)
    assert is_scale_bounded(lambda t: bounded_weight(t, kappa=kappa, gamma=gamma), 0.0, t_max)
    w = bounded_weight(torch.linspace(1e-6, 1 - 1e-6, 101, dtype=F64), kappa=kappa, gamma=gamma)
    assert bool((w >= 1 / gamma - 1e-12).all()) and bool((w <= gamma + 1e-12).all())
