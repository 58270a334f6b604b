r"""SDE simulators with exact answers: Gaussian-mixture flows and an Ornstein-Uhlenbeck process.

Conventions (paper 09, Xu et al. 2026, arXiv:2608.14430):

- forward noising $x_t = (1-t)x_0 + t\epsilon$, $t=0$ data, $t=1$ noise, target
  velocity $v = \epsilon - x_0$;
- sampling runs in $r = 1 - t$ (noise to data) with the family

  $$
  dy_r = -\Big[(1+\eta_t)v(y_r,t) + \frac{\eta_t}{1-t}y_r\Big]dr + g_r\,dW_r,\qquad g_r^2 = \frac{2\eta_t t}{1-t};
  $$

  every $\eta$ keeps the marginals $q_t$ when $v$ is the exact base velocity;
- Euler-Maruyama on an explicit grid, vectorised over paths ``[N]`` (time steps are sequential);
  paths keep the noise they used, so path-space estimators can be evaluated on them afterwards.

A `GaussianMixture` with isotropic components (any ``D``; 1-D and 2-D constructors) knows its
exact posterior mean, base velocity $E[v\mid x_t]$ and score at every ``t``. An
`OrnsteinUhlenbeck` process knows its exact and Euler-discretised moments and the closed-form
path-space KL between two OU processes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.validate import check_float, check_in_range, check_positive

__all__ = [
    "EtaSchedule",
    "GaussianMixture",
    "OrnsteinUhlenbeck",
    "Paths",
    "euler_maruyama",
    "forward_noise",
    "sampling_diffusion",
    "sampling_drift",
    "simulate_flow_sde",
    "time_grid",
]


@dataclass(frozen=True)
class EtaSchedule:
    r"""Stochasticity schedule $\eta_t = a_0 + a_1(1-t) \ge 0$.

    ``EtaSchedule(0, 0)`` is the probability-flow ODE, ``EtaSchedule(1, 0)`` the exact time reversal
    of the linear noising, Flow-GRPO's $\sigma_t = a\sqrt{t/(1-t)}$ is ``EtaSchedule(a**2/2)``.

    Examples:
        >>> EtaSchedule(0.0, 0.7)(torch.tensor([0.0, 1.0], dtype=torch.float64)).tolist()
        [0.7, 0.0]
    """

    constant: float = 1.0
    slope: float = 0.0

    def __post_init__(self) -> None:
        if self.constant < 0 or self.constant + self.slope < 0 or not math.isfinite(self.constant + self.slope):
            raise DomainError(f"EtaSchedule: expected eta_t >= 0 on [0, 1], got a0={self.constant}, a1={self.slope}")

    def __call__(self, t: Tensor) -> Tensor:
        return self.constant + self.slope * (1.0 - t)


class Paths(NamedTuple):
    """Euler-Maruyama paths: ``grid [S+1]`` (increasing integration time), ``states [N, S+1, D]``,
    the standard-normal ``noise [N, S, D]`` used at each step, the ``drift [N, S, D]`` evaluated at
    each step's left end and the ``diffusion [S]`` there."""

    grid: Tensor
    states: Tensor
    noise: Tensor
    drift: Tensor
    diffusion: Tensor

    @property
    def dr(self) -> Tensor:
        """Step sizes ``[S]``."""
        return self.grid[1:] - self.grid[:-1]


def _check_grid(grid: Tensor) -> Tensor:
    check_float("grid", grid, ndim=1)
    if grid.shape[0] < 2 or not bool((grid[1:] > grid[:-1]).all()):
        raise DomainError(f"grid: expected a strictly increasing grid of >= 2 points, got {grid.tolist()[:6]}")
    return grid


def euler_maruyama(
    x_init: Float[Tensor, "N D"],
    drift: Callable[[Tensor, Tensor, int], Tensor],
    diffusion: Callable[[Tensor], Tensor],
    grid: Float[Tensor, " S1"],
    *,
    noise: Float[Tensor, "N S D"] | None = None,
    generator: torch.Generator | None = None,
) -> Paths:
    r"""Simulate $dy = \mu(y, r)dr + g(r)dW$ by Euler-Maruyama, vectorised over the N paths.

    $$
    y_{k+1} = y_k + \mu(y_k, r_k)\Delta r_k + g(r_k)\sqrt{\Delta r_k}\epsilon_k,\ \epsilon_k\sim\mathcal N(0, I).
    $$

    Args:
        x_init: ``[N, D]`` start states.
        drift: ``drift(y [N, D], r (0-d tensor), k) -> [N, D]`` (``k`` the step index).
        diffusion: ``diffusion(r) -> 0-d tensor`` (scalar noise scale, the same for every path).
        grid: ``[S+1]`` strictly increasing times.
        noise: optional pre-drawn ``[N, S, D]`` standard normals (common random numbers).
        generator: source of the noise when ``noise`` is not given.

    Returns:
        `Paths`.

    Raises:
        ShapeError: wrong ranks or a ``noise`` of the wrong shape.
        DomainError: a non-increasing grid.

    Examples:
        >>> p = euler_maruyama(torch.zeros(3, 1), lambda y, r, k: torch.ones_like(y),
        ...                    lambda r: torch.zeros(()), torch.linspace(0, 1, 5))
        >>> p.states[:, -1, 0].tolist()
        [1.0, 1.0, 1.0]
    """
    check_float("x_init", x_init, ndim=2)
    _check_grid(grid)
    n, d = x_init.shape
    steps = grid.shape[0] - 1
    if noise is None:
        noise = torch.randn(n, steps, d, generator=generator, dtype=x_init.dtype, device=x_init.device)
    check_float("noise", noise, ndim=3)
    if tuple(noise.shape) != (n, steps, d):
        raise ShapeError(f"noise: expected shape [{n}, {steps}, {d}], got {list(noise.shape)}")
    dr = grid[1:] - grid[:-1]
    states = [x_init]
    drifts = []
    gs = []
    y = x_init
    for k in range(steps):
        mu = drift(y, grid[k], k)
        g = diffusion(grid[k])
        y = y + mu * dr[k] + g * dr[k].sqrt() * noise[:, k]
        states.append(y)
        drifts.append(mu)
        gs.append(g)
    return Paths(grid, torch.stack(states, 1), noise, torch.stack(drifts, 1), torch.stack(gs))


def time_grid(t_start: float, steps: int, *, dtype: torch.dtype = torch.float64) -> Float[Tensor, " S1"]:
    """The uniform sampling grid in ``r = 1 - t`` from ``t = t_start`` down to ``t = 0`` (``[S+1]``).

    Examples:
        >>> (1 - time_grid(0.8, 4)).tolist()  # the t values
        [0.8, 0.6000000000000001, 0.4, 0.19999999999999996, 0.0]
    """
    check_in_range("t_start", t_start, 0.0, 1.0, closed=False)
    if int(steps) < 1:
        raise DomainError(f"steps: expected >= 1, got {steps}")
    return torch.linspace(1.0 - t_start, 1.0, int(steps) + 1, dtype=dtype)


def sampling_drift(y: Tensor, t: Tensor, velocity: Tensor, eta: Tensor) -> Tensor:
    r"""Drift $\mu = -[(1+\eta_t)v + \eta_t y/(1-t)]$ of the sampling SDE in ``r = 1 - t``."""
    return -((1.0 + eta) * velocity + eta / (1.0 - t) * y)


def sampling_diffusion(t: Tensor, eta: Tensor) -> Tensor:
    r"""Noise scale $g = \sqrt{2\eta_t t/(1-t)}$ of the sampling SDE."""
    return (2.0 * eta * t / (1.0 - t)).clamp_min(0.0).sqrt()


def simulate_flow_sde(
    velocity: Callable[[Tensor, Tensor], Tensor],
    x_init: Float[Tensor, "N D"],
    *,
    t_start: float,
    steps: int,
    eta: EtaSchedule = EtaSchedule(),
    noise: Float[Tensor, "N S D"] | None = None,
    generator: torch.Generator | None = None,
) -> Paths:
    r"""Sample a flow model with the $\eta$-SDE from ``t_start`` to ``t = 0`` (Euler-Maruyama).

    Args:
        velocity: ``velocity(x [N, D], t (0-d)) -> [N, D]``, e.g. `GaussianMixture.velocity`
            or a perturbed version of it.
        x_init: ``[N, D]`` states at ``t_start`` (e.g. exact draws from $q_{t_{start}}$).
        t_start: start time in (0, 1); ``t = 1`` is excluded because $\mu$ is singular there.
        steps: number S of Euler steps.
        eta: the stochasticity schedule.
        noise: optional ``[N, S, D]`` noise (common random numbers across perturbed models).
        generator: noise source.

    Returns:
        `Paths` with ``grid`` in ``r``; ``t = 1 - grid``; ``states[:, -1]`` are the samples.

    Examples:
        >>> gm = GaussianMixture.bimodal_1d()
        >>> p = simulate_flow_sde(gm.velocity, torch.zeros(2, 1, dtype=torch.float64), t_start=0.5, steps=3,
        ...                       eta=EtaSchedule(0.0))  # the ODE
        >>> tuple(p.states.shape), bool(p.diffusion.eq(0).all())
        ((2, 4, 1), True)
    """
    grid = time_grid(t_start, steps, dtype=x_init.dtype).to(x_init.device)

    def drift(y: Tensor, r: Tensor, k: int) -> Tensor:
        t = 1.0 - r
        return sampling_drift(y, t, velocity(y, t), eta(t))

    return euler_maruyama(
        x_init, drift, lambda r: sampling_diffusion(1.0 - r, eta(1.0 - r)), grid, noise=noise, generator=generator
    )


def forward_noise(
    x0: Float[Tensor, "N D"], t: Float[Tensor, "N M"], eps: Float[Tensor, "N M D"]
) -> tuple[Float[Tensor, "N M D"], Float[Tensor, "N M D"]]:
    r"""Re-noise data with the forward kernel: $x_t = (1-t)x_0 + t\epsilon$, $v = \epsilon - x_0$.

    ``M`` time points per sample. Returns ``(x_t, v)``.

    Examples:
        >>> xt, v = forward_noise(torch.ones(1, 1), torch.tensor([[0.25]]), torch.zeros(1, 1, 1))
        >>> xt.tolist(), v.tolist()
        ([[[0.75]]], [[[-1.0]]])
    """
    check_float("x0", x0, ndim=2)
    check_float("t", t, ndim=2)
    check_float("eps", eps, ndim=3)
    if t.shape[0] != x0.shape[0] or tuple(eps.shape) != (*t.shape, x0.shape[1]):
        raise ShapeError(
            f"t, eps: expected [N, M] and [N, M, D] with N, D of x0 {list(x0.shape)}, got "
            f"{list(t.shape)} and {list(eps.shape)}"
        )
    x0e = x0.unsqueeze(1)
    return (1.0 - t).unsqueeze(-1) * x0e + t.unsqueeze(-1) * eps, eps - x0e


@dataclass(frozen=True)
class GaussianMixture:
    r"""Data law $p_0 = \sum_c w_c\,\mathcal N(m_c, s_c^2 I_D)$ with exact flow quantities.

    Under $x_t = (1-t)x_0 + t\epsilon$ component ``c`` has marginal
    $\mathcal N((1-t)m_c, \sigma_c^2 I)$, $\sigma_c^2(t) = (1-t)^2s_c^2 + t^2$, and
    $E[\epsilon - x_0\mid x, c] = \big(t(x-(1-t)m_c) - (1-t)s_c^2(x-(1-t)m_c)\big)/\sigma_c^2 - m_c$;
    responsibilities weight the components.

    Examples:
        >>> gm = GaussianMixture.bimodal_1d()
        >>> gm.velocity(torch.tensor([[0.0]], dtype=torch.float64), torch.tensor(0.5)).tolist()  # symmetry
        [[0.0]]
    """

    weights: tuple[float, ...]
    means: tuple[tuple[float, ...], ...]
    stds: tuple[float, ...]

    def __post_init__(self) -> None:
        c = len(self.weights)
        if c == 0 or len(self.means) != c or len(self.stds) != c:
            raise ShapeError(
                f"GaussianMixture: weights, means, stds need equal non-zero length, got "
                f"{c}, {len(self.means)}, {len(self.stds)}"
            )
        if len({len(m) for m in self.means}) != 1 or len(self.means[0]) == 0:
            raise ShapeError("GaussianMixture: every mean needs the same non-zero dimension D")
        if any(w <= 0 for w in self.weights) or abs(sum(self.weights) - 1.0) > 1e-9:
            raise DomainError(f"GaussianMixture: weights must be positive and sum to 1, got {self.weights}")
        for s in self.stds:
            check_positive("stds", s)

    @classmethod
    def bimodal_1d(cls, *, separation: float = 2.0, std: float = 0.5) -> GaussianMixture:
        r"""The 1-D toy of paper 09: $\tfrac12\mathcal N(-2, 0.5^2) + \tfrac12\mathcal N(2, 0.5^2)$."""
        return cls((0.5, 0.5), ((-separation,), (separation,)), (std, std))

    @classmethod
    def ring_2d(cls, *, components: int = 4, radius: float = 2.0, std: float = 0.5) -> GaussianMixture:
        """Equal-weight components on a circle of ``radius`` in 2-D."""
        angles = [2 * math.pi * i / components for i in range(components)]
        means = tuple((radius * math.cos(a), radius * math.sin(a)) for a in angles)
        return cls(tuple(1.0 / components for _ in angles), means, tuple(std for _ in angles))

    @property
    def dim(self) -> int:
        return len(self.means[0])

    def _params(self, like: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        dt, dev = like.dtype, like.device
        return (
            torch.tensor(self.weights, dtype=dt, device=dev),
            torch.tensor(self.means, dtype=dt, device=dev),
            torch.tensor(self.stds, dtype=dt, device=dev),
        )

    def sample(self, n: int, *, generator: torch.Generator, dtype: torch.dtype = torch.float64) -> Tensor:
        """``[N, D]`` exact draws from $p_0$."""
        w, m, s = self._params(torch.empty((), dtype=dtype))
        comp = torch.multinomial(w, int(n), replacement=True, generator=generator)
        return m[comp] + s[comp, None] * torch.randn(int(n), self.dim, generator=generator, dtype=dtype)

    def sample_t(self, n: int, t: float, *, generator: torch.Generator, dtype: torch.dtype = torch.float64) -> Tensor:
        """``[N, D]`` exact draws from the marginal $q_t$."""
        x0 = self.sample(n, generator=generator, dtype=dtype)
        return (1.0 - t) * x0 + t * torch.randn(x0.shape, generator=generator, dtype=dtype)

    def _components(self, x: Tensor, t: Tensor | float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Component-first pieces: log-joint ``[C, ...]``, residuals ``x - (1-t)m_c`` ``[C, ..., D]``,
        ``sigma_c^2(t)`` ``[C, ...]``, ``s_c^2`` and ``m_c`` (both broadcastable to ``[C, ..., D]``).

        The component axis leads because a softmax over a short trailing axis is slow on CPU."""
        check_float("x", x)
        if x.shape[-1] != self.dim:
            raise ShapeError(f"x: expected last dimension {self.dim}, got shape {list(x.shape)}")
        w, m, s = self._params(x)
        c, lead = w.shape[0], x.dim() - 1
        tt = torch.as_tensor(t, dtype=x.dtype, device=x.device)
        s2 = (s**2).view(c, *([1] * lead))
        var = (1.0 - tt) ** 2 * s2 + tt**2  # [C, ...]
        m_b = m.view(c, *([1] * lead), self.dim)
        resid = x - (1.0 - tt).unsqueeze(-1) * m_b  # [C, ..., D]
        sq = resid.square().sum(-1) if self.dim > 1 else resid.square().squeeze(-1)
        log_joint = w.log().view(c, *([1] * lead)) - 0.5 * sq / var - 0.5 * self.dim * (2 * math.pi * var).log()
        return log_joint, resid, var, s2.unsqueeze(-1), m_b

    def log_prob_t(self, x: Float[Tensor, "... D"], t: Tensor | float) -> Float[Tensor, ...]:
        r"""Exact $\log q_t(x)$."""
        return torch.logsumexp(self._components(x, t)[0], 0)

    def velocity(self, x: Float[Tensor, "... D"], t: Tensor | float) -> Float[Tensor, "... D"]:
        r"""Exact base velocity $v(x,t) = E[\epsilon - x_0\mid x_t = x]$ (finite at ``t = 0``)."""
        log_joint, resid, var, s2, m = self._components(x, t)
        tt = torch.as_tensor(t, dtype=x.dtype, device=x.device).unsqueeze(-1)
        per_comp = (tt - (1.0 - tt) * s2) / var.unsqueeze(-1) * resid - m  # [C, ..., D]
        return (torch.softmax(log_joint, 0).unsqueeze(-1) * per_comp).sum(0)

    def posterior_mean(self, x: Float[Tensor, "... D"], t: Tensor | float) -> Float[Tensor, "... D"]:
        r"""$E[x_0\mid x_t = x]$."""
        log_joint, resid, var, s2, m = self._components(x, t)
        tt = torch.as_tensor(t, dtype=x.dtype, device=x.device).unsqueeze(-1)
        per_comp = m + (1.0 - tt) * s2 / var.unsqueeze(-1) * resid
        return (torch.softmax(log_joint, 0).unsqueeze(-1) * per_comp).sum(0)

    def score(self, x: Float[Tensor, "... D"], t: Tensor | float) -> Float[Tensor, "... D"]:
        r"""Exact $\nabla_x\log q_t(x) = -\sum_c r_c (x-(1-t)m_c)/\sigma_c^2$."""
        log_joint, resid, var, _, _ = self._components(x, t)
        return -(torch.softmax(log_joint, 0).unsqueeze(-1) * resid / var.unsqueeze(-1)).sum(0)

    def moments(self, *, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
        r"""Mean ``[D]`` and per-coordinate second moment ``[D]`` of $p_0$."""
        w, m, s = self._params(torch.empty((), dtype=dtype))
        mean = (w[:, None] * m).sum(0)
        second = (w[:, None] * (m**2 + s[:, None] ** 2)).sum(0)
        return mean, second


@dataclass(frozen=True)
class OrnsteinUhlenbeck:
    r"""The OU process $dX = -\lambda X\,ds + \sigma\,dW$ with closed-form moments.

    $$
    E[X_s] = x_0e^{-\lambda s},\qquad \mathrm{Var}[X_s] = \frac{\sigma^2}{2\lambda}(1 - e^{-2\lambda s}).
    $$

    Examples:
        >>> ou = OrnsteinUhlenbeck(rate=1.0, sigma=math.sqrt(2.0))
        >>> round(float(ou.variance(torch.tensor(50.0))), 6)  # stationary variance sigma^2 / (2 rate)
        1.0
    """

    rate: float
    sigma: float

    def __post_init__(self) -> None:
        check_positive("rate", self.rate)
        check_positive("sigma", self.sigma)

    def drift(self, y: Tensor, s: Tensor, k: int = 0) -> Tensor:
        return -self.rate * y

    def diffusion(self, s: Tensor) -> Tensor:
        return torch.as_tensor(self.sigma, dtype=s.dtype, device=s.device)

    def mean(self, x0: Tensor, s: Tensor) -> Tensor:
        return x0 * torch.exp(-self.rate * s)

    def variance(self, s: Tensor) -> Tensor:
        return self.sigma**2 / (2 * self.rate) * -torch.expm1(-2 * self.rate * s)

    def simulate(self, x0: Tensor, grid: Tensor, *, generator: torch.Generator, noise: Tensor | None = None) -> Paths:
        """Euler-Maruyama paths from ``x0 [N, D]`` on ``grid [S+1]``."""
        return euler_maruyama(x0, self.drift, self.diffusion, grid, noise=noise, generator=generator)

    def em_moments(self, x0: Float[Tensor, " D"], grid: Float[Tensor, " S1"]) -> tuple[Tensor, Tensor]:
        r"""Exact mean ``[S+1, D]`` and variance ``[S+1]`` of the Euler-Maruyama chain.

        $m_{k+1} = (1-\lambda\Delta_k)m_k$, $v_{k+1} = (1-\lambda\Delta_k)^2v_k + \sigma^2\Delta_k$.
        """
        _check_grid(grid)
        a = 1.0 - self.rate * (grid[1:] - grid[:-1])
        decay = torch.cat([torch.ones(1, dtype=grid.dtype), torch.cumprod(a, 0)])
        var = [torch.zeros((), dtype=grid.dtype)]
        for k in range(a.shape[0]):  # a short scalar recursion, S steps
            var.append(a[k] ** 2 * var[-1] + self.sigma**2 * (grid[k + 1] - grid[k]))
        return decay[:, None] * x0, torch.stack(var)

    def path_kl(self, other: OrnsteinUhlenbeck, x0: Float[Tensor, " D"], horizon: float) -> Tensor:
        r"""Closed-form $\mathrm{KL}(P_{self}\|P_{other})$ of the two path laws on ``[0, horizon]``.

        Both start at ``x0`` and need the same $\sigma$. By Girsanov
        $\mathrm{KL} = \frac{(\lambda_1-\lambda_2)^2}{2\sigma^2}\int_0^T E_{P}\|X_s\|^2 ds$ with
        $\int_0^T E\|X_s\|^2 = \|x_0\|^2 F + D\frac{\sigma^2}{2\lambda}(T - F)$,
        $F = (1-e^{-2\lambda T})/(2\lambda)$.
        """
        if other.sigma != self.sigma:
            raise DomainError(f"other: expected the same sigma {self.sigma}, got {other.sigma} (singular path laws)")
        lam, t_h = self.rate, check_positive("horizon", horizon)
        frac = -math.expm1(-2 * lam * t_h) / (2 * lam)
        second = (x0**2).sum() * frac + x0.shape[0] * self.sigma**2 / (2 * lam) * (t_h - frac)
        return (self.rate - other.rate) ** 2 / (2 * self.sigma**2) * second
