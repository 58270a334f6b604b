"""The exact gradients of `posttrain.simulators.sde_exact` against Monte Carlo and against each other."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators import deterministic_value_gradient, value_gradient_policy_gradient
from posttrain.simulators.sde import EtaSchedule, GaussianMixture, forward_noise, simulate_flow_sde
from posttrain.simulators.sde_exact import chain_policy_gradient, value_gradient_integral

GM = GaussianMixture.bimodal_1d()
WINDOW = (0.2, 0.8)
Z = 4.0


def reward(x: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(3.0 * x)


def test_the_grid_has_converged() -> None:
    """601 and 1,201 grid points agree to 1e-5 (relative) on a 20-step chain (2e-6 measured; the check's tolerance is 2.5%)."""
    kw = {"window": WINDOW, "t_start": 0.98, "steps": 20}
    coarse = chain_policy_gradient(GM, reward, grid_points=601, **kw)
    fine = chain_policy_gradient(GM, reward, grid_points=1201, **kw)
    assert abs(coarse / fine - 1.0) < 1e-5


def test_chain_gradient_matches_a_common_random_number_difference() -> None:
    """Monte Carlo central difference (theta = +-0.05, the same noise) of the simulated chain, within 4 SE."""
    steps, n, delta = 20, 40_000, 0.05
    gen = torch.Generator().manual_seed(0)
    x_init = GM.sample_t(n, 0.98, generator=gen)
    noise = torch.randn(n, steps, 1, generator=gen, dtype=torch.float64)

    def ends(theta: float) -> torch.Tensor:
        def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            on = ((t > WINDOW[0]) & (t <= WINDOW[1])).to(x.dtype)
            return GM.velocity(x, t) + theta * on

        return simulate_flow_sde(velocity, x_init, t_start=0.98, steps=steps, noise=noise).states[:, -1, 0]

    d = (reward(ends(delta)) - reward(ends(-delta))) / (2 * delta)
    exact = chain_policy_gradient(GM, reward, window=WINDOW, t_start=0.98, steps=steps)
    assert abs(float(d.mean()) - exact) < Z * float(d.std()) / math.sqrt(n) + 1e-3 * abs(exact)  # + O(delta^2)


def test_value_gradient_integral_is_the_det_estimator_mean_on_exact_draws() -> None:
    """Det(K_t) on exact draws of p_0 (stratified times, fresh noise) is unbiased for the integral: within 4 SE."""
    n, kt = 200_000, 10
    gen = torch.Generator().manual_seed(1)
    x0 = GM.sample(n, generator=gen)
    width = (WINDOW[1] - WINDOW[0]) / kt
    t = (
        WINDOW[0]
        + (torch.arange(kt, dtype=torch.float64) + 1.0 - torch.rand(n, kt, generator=gen, dtype=torch.float64)) * width
    )
    x_t, v = forward_noise(x0, t, torch.randn(n, kt, 1, generator=gen, dtype=torch.float64))
    grad = deterministic_value_gradient(reward(x0[:, 0]) - 0.5, v, GM.velocity(x_t, t), t)
    est = value_gradient_policy_gradient(torch.full((n, kt, 1), -2.0, dtype=torch.float64), grad,
                                         torch.full((kt,), width, dtype=torch.float64))  # fmt: skip
    exact = value_gradient_integral(GM, reward, window=WINDOW)
    assert abs(float(est.mean()) - exact) < Z * float(est.std()) / math.sqrt(n)


@pytest.mark.slow
def test_the_chain_gradient_tends_to_the_continuous_one() -> None:
    """The discretisation gap shrinks with the step count (N = 50, 100, 200) and is < 0.5% at N = 200."""
    cont = value_gradient_integral(GM, reward, window=WINDOW)
    gaps = [
        abs(chain_policy_gradient(GM, reward, window=WINDOW, t_start=0.98, steps=s) / cont - 1.0)
        for s in (50, 100, 200)
    ]
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 5e-3


def test_bad_input_names_the_argument() -> None:
    with pytest.raises(DomainError, match="window"):
        chain_policy_gradient(GM, reward, window=(0.8, 0.2), t_start=0.98, steps=5)
    with pytest.raises(ShapeError, match="gm"):
        value_gradient_integral(GaussianMixture.ring_2d(), reward, window=WINDOW)
    with pytest.raises(DomainError, match="eta"):
        chain_policy_gradient(GM, reward, window=WINDOW, t_start=0.98, steps=5, eta=EtaSchedule(0.0))
