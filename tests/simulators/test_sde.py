"""SDE simulators against their closed forms (exact algebra at 1e-10, Monte Carlo within z standard errors)."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators import girsanov_log_weights
from posttrain.simulators.sde import (
    EtaSchedule,
    GaussianMixture,
    OrnsteinUhlenbeck,
    euler_maruyama,
    forward_noise,
    simulate_flow_sde,
    time_grid,
)

Z = 4.0  # statistical tests: |MC - exact| <= Z * SE
F64 = torch.float64
ASYM_2D = GaussianMixture((0.3, 0.7), ((-2.0, 1.0), (2.0, 0.5)), (0.5, 0.8))


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("gm", [GaussianMixture.bimodal_1d(), GaussianMixture.ring_2d(), ASYM_2D])
@pytest.mark.parametrize("t", [0.05, 0.4, 0.93])
def test_score_is_gradient_of_log_marginal_and_mixture_identity(gm: GaussianMixture, t: float) -> None:
    x = torch.randn(7, gm.dim, generator=_gen(1), dtype=F64).mul(2.5).requires_grad_(True)
    (grad,) = torch.autograd.grad(gm.log_prob_t(x, t).sum(), x)
    x = x.detach()
    torch.testing.assert_close(gm.score(x, t), grad, rtol=1e-10, atol=1e-10)
    # mixture-score identity: grad log q_t = -(x + (1-t) v_base)/t, and v_base = (x - E[x0|x])/t
    torch.testing.assert_close(-(x + (1 - t) * gm.velocity(x, t)) / t, grad, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(gm.velocity(x, t), (x - gm.posterior_mean(x, t)) / t, rtol=1e-9, atol=1e-9)


def test_log_prob_at_t0_is_the_data_density() -> None:
    gm = GaussianMixture.bimodal_1d()
    x = torch.tensor([[-2.0], [0.3]], dtype=F64)
    for i in range(2):
        dens = sum(0.5 * math.exp(-((float(x[i, 0]) - m) ** 2) / 0.5) / math.sqrt(0.5 * math.pi) for m in (-2, 2))
        assert math.isclose(float(gm.log_prob_t(x, 0.0)[i]), math.log(dens), rel_tol=1e-12)
    # at t = 0 the base velocity is E[eps - x0 | x0 = x] = -x
    torch.testing.assert_close(gm.velocity(x, 0.0), -x)


@pytest.mark.parametrize("gm", [GaussianMixture.bimodal_1d(), ASYM_2D])
def test_velocity_is_the_conditional_mean_of_the_target(gm: GaussianMixture) -> None:
    """E[(v - v_base(x_t)) f(x_t)] = 0 for test functions f (orthogonality of the conditional mean)."""
    n, t = 200_000, 0.35
    g = _gen(2)
    x0 = gm.sample(n, generator=g)
    eps = torch.randn(x0.shape, generator=g, dtype=F64)
    xt = (1 - t) * x0 + t * eps
    r = (eps - x0) - gm.velocity(xt, t)
    for f in (torch.ones_like(xt), xt, torch.sin(xt)):
        prod = r * f
        assert bool((prod.mean(0).abs() <= Z * prod.std(0) / math.sqrt(n)).all())


def test_sample_moments_match_the_mixture() -> None:
    n = 100_000
    x = ASYM_2D.sample(n, generator=_gen(3))
    mean, second = ASYM_2D.moments()
    assert bool(((x.mean(0) - mean).abs() <= Z * x.std(0) / math.sqrt(n)).all())
    sq = x**2
    assert bool(((sq.mean(0) - second).abs() <= Z * sq.std(0) / math.sqrt(n)).all())


@pytest.mark.slow
@pytest.mark.parametrize("eta", [EtaSchedule(0.0), EtaSchedule(0.5), EtaSchedule(1.0)])
def test_every_eta_preserves_the_marginals(eta: EtaSchedule) -> None:
    """Spec 09 section 8: from q_0.98, N = 200 steps, the end law's first two moments match p_0 within 2%."""
    n = 40_000
    g = _gen(4)
    paths = simulate_flow_sde(
        ASYM_2D.velocity, ASYM_2D.sample_t(n, 0.98, generator=g), t_start=0.98, steps=200, eta=eta, generator=g
    )
    x = paths.states[:, -1]
    mean, second = ASYM_2D.moments()
    scale = second.sqrt()
    assert bool(((x.mean(0) - mean).abs() <= 0.02 * scale + Z * x.std(0) / math.sqrt(n)).all())
    sq = x**2
    assert bool(((sq.mean(0) - second).abs() <= 0.02 * second + Z * sq.std(0) / math.sqrt(n)).all())


def test_ode_sampler_has_no_noise_and_is_deterministic() -> None:
    gm = GaussianMixture.bimodal_1d()
    x = gm.sample_t(16, 0.9, generator=_gen(5))
    a = simulate_flow_sde(gm.velocity, x, t_start=0.9, steps=20, eta=EtaSchedule(0.0), generator=_gen(6))
    b = simulate_flow_sde(gm.velocity, x, t_start=0.9, steps=20, eta=EtaSchedule(0.0), generator=_gen(7))
    assert bool((a.diffusion == 0).all())
    torch.testing.assert_close(a.states, b.states, rtol=0, atol=0)


def test_same_seed_same_paths_and_common_random_numbers() -> None:
    gm = GaussianMixture.bimodal_1d()
    x = gm.sample_t(32, 0.9, generator=_gen(8))
    a = simulate_flow_sde(gm.velocity, x, t_start=0.9, steps=10, generator=_gen(9))
    b = simulate_flow_sde(gm.velocity, x, t_start=0.9, steps=10, generator=_gen(9))
    c = simulate_flow_sde(gm.velocity, x, t_start=0.9, steps=10, noise=a.noise)
    torch.testing.assert_close(a.states, b.states, rtol=0, atol=0)
    torch.testing.assert_close(a.states, c.states, rtol=0, atol=0)


def test_ou_euler_moments_are_exact_and_converge_to_the_closed_form() -> None:
    ou = OrnsteinUhlenbeck(rate=1.5, sigma=0.8)
    x0 = torch.tensor([1.0, -0.5], dtype=F64)
    grid = torch.linspace(0, 1.0, 41, dtype=F64)
    n = 100_000
    paths = ou.simulate(x0.expand(n, 2), grid, generator=_gen(10))
    m_em, v_em = ou.em_moments(x0, grid)
    x = paths.states[:, -1]
    assert bool(((x.mean(0) - m_em[-1]).abs() <= Z * x.std(0) / math.sqrt(n)).all())
    # variance of the sample variance of a Gaussian: 2 v^2 / (n - 1)
    assert bool(((x.var(0) - v_em[-1]).abs() <= Z * math.sqrt(2 / (n - 1)) * v_em[-1]).all())
    # Euler's moments converge to the closed form at rate O(dt)
    end = torch.tensor(1.0, dtype=F64)
    errors = []
    for steps in (40, 400):
        m, v = ou.em_moments(x0, torch.linspace(0, 1.0, steps + 1, dtype=F64))
        errors.append(float((m[-1] - ou.mean(x0, end)).abs().max() + (v[-1] - ou.variance(end)).abs()))
    assert errors[1] < errors[0] / 5


def test_ou_path_kl_matches_girsanov_monte_carlo() -> None:
    """E_P[log dP/dQ] of the Euler chain (Girsanov log-weights on P's noise) vs its exact value, and the
    Euler chain's KL vs the continuous closed form."""
    p, q = OrnsteinUhlenbeck(rate=1.0, sigma=0.7), OrnsteinUhlenbeck(rate=2.0, sigma=0.7)
    x0 = torch.tensor([0.8], dtype=F64)
    grid = torch.linspace(0, 2.0, 201, dtype=F64)
    n = 20_000
    paths = p.simulate(x0.expand(n, 1), grid, generator=_gen(11))
    y = paths.states[:, :-1]
    delta = p.drift(y, grid[0]) - q.drift(y, grid[0])  # mu_P - mu_Q at each step's left end
    # under P, log dP/dQ = -(log-weight of Q against P) with P's own noise
    logw = -girsanov_log_weights(-delta, paths.diffusion, paths.noise, paths.dr).sum(-1)
    m, v = p.em_moments(x0, grid)
    exact_discrete = 0.5 * (p.rate - q.rate) ** 2 / p.sigma**2 * (((m[:-1] ** 2).sum(-1) + v[:-1]) * paths.dr).sum()
    assert abs(float(logw.mean() - exact_discrete)) <= Z * float(logw.std()) / math.sqrt(n)
    closed = p.path_kl(q, x0, 2.0)
    assert abs(float(exact_discrete - closed)) <= 0.02 * float(closed)  # O(dt) with dt = 0.01


def test_forward_noise_definition() -> None:
    x0 = torch.randn(3, 2, generator=_gen(12), dtype=F64)
    t = torch.rand(3, 4, generator=_gen(13), dtype=F64)
    eps = torch.randn(3, 4, 2, generator=_gen(14), dtype=F64)
    xt, v = forward_noise(x0, t, eps)
    torch.testing.assert_close(v, (xt - x0[:, None]) / t[..., None])
    with pytest.raises(ShapeError, match="eps"):
        forward_noise(x0, t, eps[:, :3])


def test_bad_inputs_raise_named_errors() -> None:
    with pytest.raises(DomainError, match="grid"):
        euler_maruyama(torch.zeros(2, 1), lambda y, r, k: y, lambda r: r, torch.tensor([0.0, 0.0]))
    with pytest.raises(ShapeError, match="noise"):
        euler_maruyama(
            torch.zeros(2, 1), lambda y, r, k: y, lambda r: r, torch.linspace(0, 1, 3), noise=torch.zeros(2, 3, 1)
        )
    with pytest.raises(ShapeError, match="x_init"):
        euler_maruyama(torch.zeros(2), lambda y, r, k: y, lambda r: r, torch.linspace(0, 1, 3))
    with pytest.raises(DomainError, match="t_start"):
        time_grid(1.0, 10)
    with pytest.raises(DomainError, match="steps"):
        time_grid(0.5, 0)
    with pytest.raises(DomainError, match="EtaSchedule"):
        EtaSchedule(0.2, -0.5)
    with pytest.raises(DomainError, match="weights"):
        GaussianMixture((0.5, 0.6), ((0.0,), (1.0,)), (1.0, 1.0))
    with pytest.raises(ShapeError, match="x"):
        GaussianMixture.ring_2d().velocity(torch.zeros(3, 1), 0.5)
    with pytest.raises(DomainError, match="sigma"):
        OrnsteinUhlenbeck(1.0, 1.0).path_kl(OrnsteinUhlenbeck(1.0, 2.0), torch.zeros(1), 1.0)
