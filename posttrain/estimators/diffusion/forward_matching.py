r"""Forward-matching losses of diffusion / flow policies and their time weights.

The template loss $w_2\langle\nabla V, \Delta v\rangle + w_1\|\Delta v\|^2$ and its instances
(Girsanov weights, AWM, DiffusionNFT, the scale-bounded family), with the ELBO weight and its
bounded version (*reconstructed*). Velocities are ``[..., D]``, per-sample weights ``[...]``.

References: Xu et al. 2026 (arXiv:2608.14430); AWM (Xue et al. 2025, arXiv:2509.25050);
DiffusionNFT (Zheng et al. 2025, arXiv:2509.16117).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import Enum

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators.diffusion.girsanov import _dot
from posttrain.estimators.diffusion.value_gradients import _check_times
from posttrain.shapes import Float
from posttrain.validate import (
    check_choice,
    check_finite,
    check_float,
    check_positive,
    check_same_shape,
    value_checks_enabled,
)

__all__ = [
    "Curvature",
    "awm_loss",
    "bounded_weight",
    "elbo_weight",
    "girsanov_template_weights",
    "is_scale_bounded",
    "nft_loss",
    "scale_bounded_loss",
    "template_loss",
]


def _check_velocities(v_theta: Tensor, **others: Tensor) -> None:
    """``v_theta [..., D]`` and same-shape velocities; per-sample tensors of shape ``[...]``."""
    check_float("v_theta", v_theta)
    if v_theta.ndim < 1:
        raise ShapeError("v_theta: expected shape [..., D], got a 0-d tensor")
    for name, x in others.items():
        check_float(name, x)
        want = v_theta.shape if name.startswith("v_") else v_theta.shape[:-1]
        if x.shape != want:
            raise ShapeError(
                f"{name}: expected shape {list(want)} (from v_theta {list(v_theta.shape)}), got {list(x.shape)}"
            )


def _check_broadcast(name: str, x: Tensor, shape: torch.Size) -> Tensor:
    """A float tensor that broadcasts to ``shape`` (per-sample weights); ShapeError naming it otherwise."""
    check_float(name, x)
    try:
        ok = torch.broadcast_shapes(x.shape, shape) == shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ShapeError(f"{name}: expected a shape that broadcasts to {list(shape)}, got {list(x.shape)}")
    return x


def template_loss(
    delta_v: Float[Tensor, "... D"],
    value_grad: Float[Tensor, "... D"],
    w1: Float[Tensor, ...],
    w2: Float[Tensor, ...],
) -> Float[Tensor, ...]:
    r"""Unified forward-matching loss per sample (the paper's template).

    $$
    \ell = \hat w_2\,\widehat{\nabla V}^{\!\top}\Delta v + \hat w_1\|\Delta v\|^2
    $$

    $\Delta v = v_\theta - v_{old}$; the linear term is the first-order (on-policy) content of
    the Girsanov ratio, the quadratic one its off-policy cost (local approximation
    $e^{M_1}\approx 1 + M_1$, the paper's Proposition 1). To be minimised.

    Args:
        delta_v: ``[..., D]``; value_grad: ``[..., D]``; w1, w2: ``[...]`` (broadcastable) weights.

    Returns:
        ``[...]`` per-sample losses.

    Examples:
        >>> template_loss(torch.tensor([[1.0]]), torch.tensor([[2.0]]), torch.tensor([3.0]),
        ...               torch.tensor([0.5])).tolist()
        [4.0]
    """
    check_float("delta_v", delta_v)
    check_float("value_grad", value_grad)
    check_same_shape("delta_v", delta_v, value_grad=value_grad)
    if delta_v.ndim < 1:
        raise ShapeError("delta_v: expected shape [..., D], got a 0-d tensor")
    _check_broadcast("w1", w1, delta_v.shape[:-1])
    _check_broadcast("w2", w2, delta_v.shape[:-1])
    return w2 * _dot(value_grad, delta_v) + w1 * _dot(delta_v, delta_v)


def girsanov_template_weights(
    advantages: Float[Tensor, ...], t: Float[Tensor, ...], eta: Float[Tensor, ...]
) -> tuple[Tensor, Tensor]:
    r"""Weights of the Girsanov instance of `template_loss`.

    $$
    \hat w_2 = 1 + \eta_t,\qquad \hat w_1 = A\,\tilde w_t = A\,\frac{(1+\eta_t)^2(1-t)}{4t\eta_t}.
    $$

    Returns ``(w1, w2)``; needs $\eta_t > 0$ and ``t`` in (0, 1).

    Examples:
        >>> [x.tolist() for x in girsanov_template_weights(torch.tensor(1.0), torch.tensor(0.5), torch.tensor(1.0))]
        [1.0, 2.0]
    """
    check_float("advantages", advantages)
    _check_broadcast("t", t, advantages.shape)
    _check_broadcast("eta", eta, advantages.shape)
    _check_times(t)
    if value_checks_enabled() and not bool((eta > 0).all()):
        raise DomainError("eta: expected eta_t > 0 (the quadratic weight is infinite for the ODE sampler)")
    w2 = 1.0 + eta
    return advantages * w2**2 * (1.0 - t) / (4.0 * t * eta), w2


def elbo_weight(t: Tensor) -> Tensor:
    r"""The ELBO weight $s(t) = (1-t)/t$ (unbounded as $t\to0$)."""
    check_float("t", t)
    return (1.0 - t) / t


def bounded_weight(t: Tensor, *, kappa: float = 0.5, gamma: float = 5.0) -> Tensor:
    r"""Scale-bounded weight $w_{\kappa,\gamma}(t) = \mathrm{clip}(s(t)^\kappa, 1/\gamma, \gamma)$, reconstructed.

    ``kappa = 0`` is AWM's ``w = 1``; ``kappa = 1, gamma = inf`` the excluded ELBO weight.

    Examples:
        >>> bounded_weight(torch.tensor([0.01, 0.5, 0.99], dtype=torch.float64)).tolist()
        [5.0, 1.0, 0.2]
    """
    if not 0.0 <= kappa <= 1.0:
        raise DomainError(f"kappa: expected a value in [0, 1], got {kappa!r}")
    if not gamma >= 1.0:
        raise DomainError(f"gamma: expected gamma >= 1, got {gamma!r}")
    return elbo_weight(t).pow(kappa).clamp(1.0 / gamma, gamma)


class Curvature(str, Enum):
    """Curvature mode $a_q(A)$ of `scale_bounded_loss`: ``A`` (AWM-like), ``|A|``, or 1 (NFT-like)."""

    SIGNED = "signed"
    ABS = "abs"
    ONE = "one"


def scale_bounded_loss(
    v_theta: Float[Tensor, "... D"],
    v_old: Float[Tensor, "... D"],
    v_target: Float[Tensor, "... D"],
    advantages: Float[Tensor, ...],
    t: Float[Tensor, ...],
    *,
    kappa: float = 0.5,
    gamma: float = 5.0,
    curvature: Curvature = Curvature.ONE,
) -> Float[Tensor, ...]:
    r"""Forward-matching loss with a scale-bounded weight family (*reconstructed*).

    $$
    \mathcal L = w_{\kappa,\gamma}(t)\big(a_q(A)\|\Delta v\|^2 - 2A\,d^\top\Delta v\big),\qquad
                  \Delta v = v_\theta - v_{old},\ d = v - v_{old}.
    $$

    Its gradient in $\Delta v$ at $\Delta v = 0$ is $-2wA\,d$, the deterministic
    value-gradient direction with linear scale $\lambda_{lin} = 2w$ bounded on any window.
    ``kappa = 0, curvature = SIGNED`` reproduces AWM with ``w = 1`` (up to a $\Delta v$-free term).

    Args:
        v_theta: ``[..., D]`` current velocity; v_old: ``[..., D]`` proposal velocity (no gradient);
        v_target: ``[..., D]`` target $v = \epsilon - x_0$; advantages, t: ``[...]``.
        kappa, gamma: the weight family (defaults 0.5 and 5, our choice).
        curvature: `Curvature` mode.

    Returns:
        ``[...]`` per-sample losses.

    Examples:
        >>> scale_bounded_loss(torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.tensor([[1.0]]),
        ...                    torch.tensor([1.0]), torch.tensor([0.5])).tolist()
        [-1.0]
    """
    _check_velocities(v_theta, v_old=v_old, v_target=v_target, advantages=advantages, t=t)
    _check_times(t)
    mode = check_choice("curvature", curvature, Curvature)
    a_q = {Curvature.SIGNED: advantages, Curvature.ABS: advantages.abs(), Curvature.ONE: torch.ones_like(advantages)}
    delta_v = v_theta - v_old
    d = v_target - v_old
    w = bounded_weight(t, kappa=kappa, gamma=gamma)
    return w * (a_q[mode] * _dot(delta_v, delta_v) - 2.0 * advantages * _dot(d, delta_v))


def awm_loss(
    v_theta: Float[Tensor, "... D"],
    v_target: Float[Tensor, "... D"],
    advantages: Float[Tensor, ...],
    weight: Float[Tensor, ...],
) -> Float[Tensor, ...]:
    r"""Advantage Weighted Matching: $A\,w(t)\|v_\theta - v\|^2$ per sample (Xue et al. 2025, arXiv:2509.25050).

    Examples:
        >>> awm_loss(torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.tensor([2.0]), torch.tensor([1.0])).tolist()
        [2.0]
    """
    _check_velocities(v_theta, v_target=v_target, advantages=advantages, weight=weight)
    diff = v_theta - v_target
    return advantages * weight * _dot(diff, diff)


def nft_loss(
    v_theta: Float[Tensor, "... D"],
    v_old: Float[Tensor, "... D"],
    v_target: Float[Tensor, "... D"],
    rho: Float[Tensor, ...],
    *,
    beta: float = 1.0,
) -> Float[Tensor, ...]:
    r"""DiffusionNFT loss $\rho\|v^+ - v\|^2 + (1-\rho)\|v^- - v\|^2$ per sample.

    $v^\pm = v_{old} \pm \beta(v_\theta - v_{old})$.

    ``rho`` in [0, 1] is the normalised reward (Zheng et al. 2025, arXiv:2509.16117).

    Examples:
        >>> nft_loss(torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.tensor([[1.0]]), torch.tensor([1.0])).tolist()
        [0.0]
    """
    _check_velocities(v_theta, v_old=v_old, v_target=v_target, rho=rho)
    beta = check_positive("beta", beta)
    check_finite("rho", rho)
    if value_checks_enabled() and not bool(((rho >= 0) & (rho <= 1)).all()):
        raise DomainError("rho: expected normalised rewards in [0, 1]")
    delta = beta * (v_theta - v_old)
    pos, neg = v_old + delta - v_target, v_old - delta - v_target
    return rho * _dot(pos, pos) + (1.0 - rho) * _dot(neg, neg)


def is_scale_bounded(weight: Callable[[Tensor], Tensor], t_min: float, t_max: float, *, max_ratio: float = 1e4) -> bool:
    r"""Whether a time weight is scale-bounded on the window ``(t_min, t_max]`` (*reconstructed* definition).

    Scale-bounded means $0 < c \le w(t) \le C < \infty$ on the window (then
    $\lambda_{lin} = 2w$ and the curvature $w\,a_q(A)$ are bounded as the paper requires).
    Checked numerically: ``w`` is evaluated (float64) on a grid that approaches both ends to within
    $10^{-12}$ of the window width; bounded iff every value is finite and positive and
    $\max w/\min w \le$ ``max_ratio``. A weight whose range is wider than ``max_ratio`` inside the
    window is reported unbounded.

    Examples:
        >>> is_scale_bounded(elbo_weight, 0.0, 0.5), is_scale_bounded(lambda t: torch.ones_like(t), 0.0, 0.5)
        (False, True)
    """
    if not 0.0 <= t_min < t_max <= 1.0:
        raise DomainError(f"t_min, t_max: expected 0 <= t_min < t_max <= 1, got {t_min!r}, {t_max!r}")
    width = t_max - t_min
    gaps = torch.logspace(-12, 0, 121, dtype=torch.float64)
    t = torch.cat([t_min + width * gaps, t_max - width * gaps]).clamp(t_min + width * 1e-12, t_max)
    w = weight(t).to(torch.float64)
    if not bool(torch.isfinite(w).all()) or not bool((w > 0).all()):
        return False
    return bool(w.max() / w.min() <= max_ratio) and math.isfinite(float(w.max()))
