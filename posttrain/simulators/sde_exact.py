r"""Exact policy gradients of a 1-D Gaussian-mixture flow under a velocity perturbation (no Monte Carlo).

The model of `posttrain.simulators.sde`: data law $p_0$ a 1-D `GaussianMixture`, forward noising
$x_t = (1-t)x_0 + t\epsilon$, sampler the $\eta$-SDE in $r = 1 - t$ with the base velocity perturbed
on a time window, $v_\theta(x, t) = v(x, t) + \theta\,h(t)$, $h = 1\{t_{lo} < t \le t_{hi}\}$. The
objective is $J(\theta) = E[R(x_0)]$ for a reward $R$. Two exact values of $g = dJ/d\theta|_{\theta=0}$:

- `chain_policy_gradient`: the gradient of the **discretised** chain that a sampler actually runs
  (``steps`` Euler-Maruyama steps from the exact marginal $q_{t_{start}}$). Each Euler-Maruyama step
  is a Gaussian kernel $N(y;\,x + \mu(x)\Delta r,\ g^2\Delta r)$, so the law of the state is
  propagated exactly on a fine grid (each kernel column renormalised, so mass is conserved), for
  $\theta = \pm\delta$ side by side; $g$ is their central difference. This computation is
  deterministic: its error is the grid's (relative ~1e-7 at the default 601 points on the paper-09
  toy, checked against 2,001) plus $O(\delta^2)$, not a Monte Carlo error.
- `value_gradient_integral`: the **continuous-time** gradient of the value-gradient (forward-
  matching) view, $g = \int_{t_{lo}}^{t_{hi}} E_{x\sim q_t}\big[-(1+\eta_t)\,\partial_x V_t(x)\big]\,dt$
  with the forward-posterior value $V_t(x) = E[R(x_0)\mid x_t = x]$ (a Gaussian mixture posterior),
  by Gauss-Legendre (time) and Gauss-Hermite (state, posterior) quadrature; $\partial_x V$ by
  autograd. For the $\eta \equiv 1$ sampler it is the $N \to \infty$ limit of the chain's gradient.

Float64 torch throughout; 1-D mixtures only.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.simulators.sde import EtaSchedule, GaussianMixture, sampling_diffusion, sampling_drift, time_grid
from posttrain.validate import check_in_range, check_positive

__all__ = ["chain_policy_gradient", "value_gradient_integral"]

Reward = Callable[[Tensor], Tensor]
"""``R(x0 [...]) -> [...]``, elementwise on 1-D states."""


def _check_1d(gm: GaussianMixture, window: tuple[float, float]) -> None:
    if gm.dim != 1:
        raise ShapeError(f"gm: expected a 1-D mixture, got dimension {gm.dim}")
    lo, hi = window
    if not 0.0 < lo < hi < 1.0:
        raise DomainError(f"window: expected 0 < lo < hi < 1, got {window!r}")


def chain_policy_gradient(
    gm: GaussianMixture,
    reward: Reward,
    *,
    window: tuple[float, float],
    t_start: float,
    steps: int,
    eta: EtaSchedule = EtaSchedule(),
    grid_points: int = 601,
    half_width: float = 6.5,
    delta: float = 1e-4,
) -> float:
    r"""$dE[R(x_0)]/d\theta$ at 0 of the Euler-Maruyama chain with $v_\theta = v + \theta\,1\{t_{lo} < t \le t_{hi}\}$.

    The chain is `posttrain.simulators.sde.simulate_flow_sde`'s: ``steps`` steps on
    ``time_grid(t_start, steps)``, started from the exact marginal $q_{t_{start}}$, perturbation
    active where the step's left end $t$ lies in the window. The state's law is carried on
    ``grid_points`` equally spaced points of $[-w, w]$ (``w = half_width``) by the exact Gaussian
    transition of each step; $g = (J(\delta) - J(-\delta)) / 2\delta$ on that deterministic recursion.

    Args:
        gm: a 1-D `GaussianMixture` (the base velocity is its exact one).
        reward: $R$, elementwise.
        window: $(t_{lo}, t_{hi})$ of the perturbation.
        t_start: the sampler's start time in (0, 1).
        steps: Euler-Maruyama steps.
        eta: the sampler's stochasticity schedule (its diffusion must be positive on every step
            but the last, as for every $\eta$ with $\eta_t > 0$ for $t > 0$).
        grid_points, half_width: the state grid (cost ``steps * grid_points^2``).
        delta: half-width of the central difference.

    Returns:
        $g$ as a float.

    Raises:
        DomainError: a step with zero diffusion before the last one, or an invalid argument.

    Examples:
        >>> gm = GaussianMixture.bimodal_1d()
        >>> g = chain_policy_gradient(gm, lambda x: torch.sigmoid(3 * x), window=(0.2, 0.8), t_start=0.98,
        ...                           steps=20, grid_points=301)
        >>> round(g, 3)
        -0.203
    """
    _check_1d(gm, window)
    check_in_range("t_start", t_start, 0.0, 1.0, closed=False)
    check_positive("delta", delta)
    check_positive("half_width", half_width)
    if int(grid_points) < 3:
        raise DomainError(f"grid_points: expected >= 3, got {grid_points}")
    dt = torch.float64
    x = torch.linspace(-half_width, half_width, int(grid_points), dtype=dt)  # [X]
    dx = x[1] - x[0]
    p = (gm.log_prob_t(x[:, None], t_start).exp() * dx)[:, None].repeat(1, 2)  # [X, 2]: theta = +delta, -delta
    theta = torch.tensor([delta, -delta], dtype=dt)
    grid = time_grid(t_start, steps, dtype=dt)
    lo, hi = window
    for k in range(int(steps)):
        dr, t = grid[k + 1] - grid[k], 1.0 - grid[k]
        on = float(lo < float(t) <= hi)
        vel = gm.velocity(x[:, None], t) + theta * on  # [X, 2]
        mean = x[:, None] + sampling_drift(x[:, None], t, vel, eta(t)) * dr  # [X, 2]
        sd = sampling_diffusion(t, eta(t)) * dr.sqrt()
        if not float(sd) > 0.0:
            raise DomainError(f"eta: zero diffusion at step {k} (t = {float(t):.4g}); the grid needs a noisy step")
        kernel = torch.exp(-0.5 * ((x[:, None, None] - mean[None]) / sd) ** 2)  # [Y, X, 2]
        kernel = kernel / kernel.sum(0, keepdim=True)  # each column a probability vector on the grid
        p = torch.einsum("yxj,xj->yj", kernel, p)
    value = (p * reward(x)[:, None]).sum(0)  # [2]
    return float((value[0] - value[1]) / (2.0 * delta))


def value_gradient_integral(
    gm: GaussianMixture,
    reward: Reward,
    *,
    window: tuple[float, float],
    eta: EtaSchedule = EtaSchedule(),
    time_nodes: int = 40,
    state_nodes: int = 60,
) -> float:
    r"""$\int_{t_{lo}}^{t_{hi}} E_{x\sim q_t}[-(1+\eta_t)\,\partial_x V_t(x)]\,dt$, $V_t(x) = E[R(x_0)\mid x_t = x]$, by quadrature.

    $V_t$ averages $R$ over the exact forward posterior (component ``c`` given $x$: a Gaussian with
    mean $m_c + (1-t)s_c^2(x-(1-t)m_c)/\sigma_c^2$ and variance $s_c^2t^2/\sigma_c^2$, weighted by the
    responsibilities); the outer expectation over $q_t$ uses the same nodes per component. With
    $\eta \equiv 1$ this is the continuous-time policy gradient of the perturbation (the $N\to\infty$
    limit of `chain_policy_gradient`); for other $\eta$ it is what the sampler-agnostic plug-in
    $-(1+\eta_t)$ with the forward-posterior value gradient estimates (not the sampler's gradient).

    Args:
        gm: a 1-D `GaussianMixture`. reward: $R$, elementwise.
        window: $(t_{lo}, t_{hi})$. eta: the drift sensitivity's $\eta_t$.
        time_nodes: Gauss-Legendre nodes on the window. state_nodes: Gauss-Hermite nodes per Gaussian.

    Returns:
        The integral as a float.

    Examples:
        >>> gm = GaussianMixture.bimodal_1d()
        >>> round(value_gradient_integral(gm, lambda x: torch.sigmoid(3 * x), window=(0.2, 0.8)), 4)
        -0.2068
    """
    _check_1d(gm, window)
    dt = torch.float64
    zn, zw = np.polynomial.hermite_e.hermegauss(int(state_nodes))  # weight exp(-z^2 / 2)
    z, zw_t = torch.tensor(zn, dtype=dt), torch.tensor(zw / math.sqrt(2.0 * math.pi), dtype=dt)
    tn, tw = np.polynomial.legendre.leggauss(int(time_nodes))
    lo, hi = window
    t = torch.tensor(0.5 * (lo + hi) + 0.5 * (hi - lo) * tn, dtype=dt)[:, None, None]  # [T, 1, 1]
    w, m, s = (torch.tensor(v, dtype=dt) for v in (gm.weights, [mm[0] for mm in gm.means], gm.stds))
    sd_t = ((1.0 - t) ** 2 * s**2 + t**2).sqrt()  # [T, 1, C]
    x = ((1.0 - t) * m + sd_t * z[None, :, None]).reshape(t.shape[0], -1, 1).requires_grad_(True)  # [T, Z*C, 1]
    tt = t.reshape(-1, 1, 1).expand(-1, x.shape[1], 1)
    log_joint, resid, var, s2, mc = gm._components(x, tt[..., 0])  # component axis first
    post_mean = mc + (1.0 - tt) * s2 / var.unsqueeze(-1) * resid  # [C, T, Z*C, 1]
    post_sd = (s2 * tt**2 / var.unsqueeze(-1)).sqrt()
    values = (reward(post_mean + post_sd * z) * zw_t).sum(-1)  # [C, T, Z*C]
    v = (torch.softmax(log_joint, 0) * values).sum(0)  # [T, Z*C]: V_t at the nodes
    (dv,) = torch.autograd.grad(v.sum(), x)  # each node's V depends on its own x only
    outer = (zw_t[:, None] * w).reshape(-1)  # [Z*C]: node weights of x ~ q_t (component-major per z)
    inner = (dv[..., 0] * outer).sum(-1)  # [T]: E_{q_t}[d_x V_t]
    weight = -(1.0 + eta(t.reshape(-1)))
    return float((0.5 * (hi - lo) * torch.tensor(tw, dtype=dt) * weight * inner).sum())
