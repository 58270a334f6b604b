r"""Path-space policy-gradient estimators for diffusion / flow models (paper 09).

Sampling SDE in ``r = 1 - t`` with drift $\mu_\theta$ and noise scale $g$ (see
`posttrain.simulators.sde`). Paths carry the standard-normal noise $\epsilon_{n,k}$ of each
Euler step, so every estimator here is a batched function of ``[N, S, D]`` tensors (N paths, S
steps, D state dimension) with no loop over paths or steps.

Two families of the same gradient $\nabla_\theta E_{P_\theta}[A(x_0)]$:

- reverse-trajectory (Flow-GRPO): the Girsanov / Itô-integral score of the path;
- forward-matching (AWM, DiffusionNFT): the value-gradient form with $\nabla V$ estimated from
  the forward-noising posterior (one sample, or a kernel estimate over the rollout group).

References:
    Xu, Zhang, Luo, Wang, He 2026, "Designing Reinforcement Learning for Diffusion Models: A Unified
    Path-Space View", arXiv:2608.14430. Flow-GRPO (Liu et al. 2025, arXiv:2505.05470); AWM (Xue et
    al. 2025, arXiv:2509.25050); DiffusionNFT (Zheng et al. 2025, arXiv:2509.16117).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import Enum
from typing import Any, NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.registry import Registry, registry
from posttrain.validate import (
    check_choice,
    check_finite,
    check_float,
    check_positive,
    check_same_shape,
    value_checks_enabled,
)

__all__ = [
    "VALUE_GRADIENTS",
    "Curvature",
    "KDEValueGradient",
    "awm_loss",
    "bounded_weight",
    "deterministic_value_gradient",
    "elbo_weight",
    "girsanov_log_weights",
    "girsanov_template_weights",
    "is_scale_bounded",
    "ito_policy_gradient",
    "kde_value_gradient",
    "nft_loss",
    "path_score",
    "scale_bounded_loss",
    "stochastic_value_gradient",
    "template_loss",
    "value_gradient_policy_gradient",
]

VALUE_GRADIENTS: Registry[Any] = registry("value_gradient")
_PAPER = "Xu et al. 2026, Unified Path-Space View, arXiv:2608.14430"


def _dot(a: Tensor, b: Tensor) -> Tensor:
    """``sum(a * b, -1)`` as a matrix-vector product (on CPU a reduction over a short last axis is slow)."""
    prod = a * b
    return prod[..., 0] if a.shape[-1] == 1 else prod @ torch.ones(a.shape[-1], dtype=a.dtype, device=a.device)


def _check_steps(noise: Tensor, diffusion: Tensor, dr: Tensor) -> None:
    check_float("noise", noise, ndim=3)
    check_float("diffusion", diffusion, ndim=1)
    check_float("dr", dr, ndim=1)
    s = noise.shape[1]
    for name, x in (("diffusion", diffusion), ("dr", dr)):
        if x.shape[0] != s:
            raise ShapeError(f"{name}: expected shape [{s}] (the steps of noise), got {list(x.shape)}")
    if value_checks_enabled():
        if not bool((diffusion > 0).all()):
            raise DomainError("diffusion: expected g > 0 at every step (the path law of an ODE has no density)")
        if not bool((dr > 0).all()):
            raise DomainError("dr: expected positive step sizes")


def _weighted_step_sum(per_step: Tensor, step_weights: Tensor | None, dr: Tensor | None = None) -> Tensor:
    """``sum_k w_k [dr_k] per_step[:, k]`` over the steps of ``per_step [N, S]`` (``w = 1`` when None)."""
    n, s = per_step.shape
    if step_weights is None:
        return per_step.sum(-1) if dr is None else per_step @ dr
    check_float("step_weights", step_weights, ndim=(1, 2))
    if tuple(step_weights.shape) not in ((s,), (n, s)):
        raise ShapeError(f"step_weights: expected shape [{s}] or [{n}, {s}], got {list(step_weights.shape)}")
    return (step_weights * per_step).sum(-1) if dr is None else (step_weights * per_step) @ dr


def girsanov_log_weights(
    delta_drift: Float[Tensor, "N S D"],
    diffusion: Float[Tensor, " S"],
    noise: Float[Tensor, "N S D"],
    dr: Float[Tensor, " S"],
) -> Float[Tensor, "N S"]:
    r"""Per-step Girsanov log-weights $\log dP_\theta/dQ$ of Euler-Maruyama paths drawn under Q.

    $$
    \ell_{n,k} = \Big(\frac{\Delta\mu_{n,k}}{g_k}\Big)^{\!\top}\sqrt{\Delta r_k}\,\epsilon_{n,k}
                  - \frac12\Big\|\frac{\Delta\mu_{n,k}}{g_k}\Big\|^2\Delta r_k,
    $$

    with $\Delta\mu = \mu_\theta - \mu_q$ at the step's left end and $\epsilon$ the noise the
    proposal Q used. This is exactly the log ratio of the two Gaussian Euler transitions (a
    discretisation of $\int(\Delta\mu/g)^\top dW - \frac12\int\|\Delta\mu/g\|^2dr$); sum over
    ``S`` for the path weight, whose Q-expectation after ``exp`` is 1.

    Args:
        delta_drift: ``[N, S, D]`` drift difference $\mu_\theta - \mu_q$.
        diffusion: ``[S]`` noise scales $g_k > 0$ (shared by both SDEs).
        noise: ``[N, S, D]`` standard normals drawn by Q.
        dr: ``[S]`` positive step sizes.

    Returns:
        ``[N, S]`` per-step log-weights.

    Raises:
        ShapeError: shapes disagree.
        DomainError: ``g <= 0`` or ``dr <= 0``.

    References:
        Xu et al. 2026, arXiv:2608.14430, Sec. 3 (Girsanov between sampling SDEs).

    Examples:
        >>> girsanov_log_weights(torch.ones(1, 1, 1), torch.ones(1), torch.zeros(1, 1, 1), torch.ones(1)).tolist()
        [[-0.5]]
    """
    check_float("delta_drift", delta_drift, ndim=3)
    _check_steps(noise, diffusion, dr)
    check_same_shape("noise", noise, delta_drift=delta_drift)
    return _dot(delta_drift, noise) * (dr.sqrt() / diffusion) - 0.5 * _dot(delta_drift, delta_drift) * (
        dr / diffusion**2
    )


def path_score(
    drift_grad: Float[Tensor, "N S D"],
    diffusion: Float[Tensor, " S"],
    noise: Float[Tensor, "N S D"],
    dr: Float[Tensor, " S"],
) -> Float[Tensor, "N S"]:
    r"""Per-step path score $(\partial_\theta\mu)^\top\sqrt{\Delta r}\,\epsilon/g$ at $\theta=\theta_q$.

    The $\theta$-derivative of `girsanov_log_weights` at $\Delta\mu = 0$, i.e.
    $\partial_\theta\log p_\theta(y_{k+1}\mid y_k)$ of the Euler transition (zero mean under Q).

    Args:
        drift_grad: ``[N, S, D]`` $\partial\mu_\theta/\partial\theta$ along one parameter direction.
        diffusion: ``[S]``; noise: ``[N, S, D]``; dr: ``[S]`` as in `girsanov_log_weights`.

    Returns:
        ``[N, S]``.

    Examples:
        >>> path_score(torch.ones(1, 1, 1), torch.tensor([2.0]), torch.ones(1, 1, 1), torch.tensor([4.0])).tolist()
        [[1.0]]
    """
    check_float("drift_grad", drift_grad, ndim=3)
    _check_steps(noise, diffusion, dr)
    check_same_shape("noise", noise, drift_grad=drift_grad)
    return _dot(drift_grad, noise) * (dr.sqrt() / diffusion)


def ito_policy_gradient(
    advantages: Float[Tensor, " N"],
    drift_grad: Float[Tensor, "N S D"],
    diffusion: Float[Tensor, " S"],
    noise: Float[Tensor, "N S D"],
    dr: Float[Tensor, " S"],
    *,
    step_weights: Float[Tensor, "N S"] | None = None,
) -> Float[Tensor, " N"]:
    r"""Itô-integral (REINFORCE / Flow-GRPO) policy gradient of each path.

    $$
    \hat g_n = A_n\sum_k w_{n,k}\,(\partial_\theta\mu_{n,k})^{\!\top}\frac{\sqrt{\Delta r_k}\,\epsilon_{n,k}}{g_k}
    $$

    Unbiased for $\partial_\theta E[A]$ of the discretised chain when $w \equiv 1$;
    ``step_weights`` selects a subset of steps (e.g. ``N_window / K_t`` on ``K_t`` sampled steps, 0
    elsewhere, which stays unbiased when steps are drawn uniformly).

    Args:
        advantages: ``[N]`` terminal advantages (a constant baseline keeps it unbiased).
        drift_grad, diffusion, noise, dr: as in `path_score`.
        step_weights: optional ``[S]`` or ``[N, S]`` per-step weights.

    Returns:
        ``[N]`` per-path gradient estimates (average over N for the estimate).

    References:
        Xu et al. 2026, arXiv:2608.14430, Sec. 3.4; Flow-GRPO, arXiv:2505.05470.

    Examples:
        >>> ito_policy_gradient(torch.tensor([2.0]), torch.ones(1, 2, 1), torch.ones(2), torch.ones(1, 2, 1),
        ...                     torch.ones(2)).tolist()
        [4.0]
    """
    check_float("advantages", advantages, ndim=1)
    score = path_score(drift_grad, diffusion, noise, dr)
    if advantages.shape[0] != score.shape[0]:
        raise ShapeError(
            f"advantages: expected shape [{score.shape[0]}] (the paths of noise), got {list(advantages.shape)}"
        )
    return advantages * _weighted_step_sum(score, step_weights)


@VALUE_GRADIENTS.register("stochastic", paper=_PAPER)
def stochastic_value_gradient(
    advantages: Float[Tensor, " N"],
    diffusion: Float[Tensor, " S"],
    noise: Float[Tensor, "N S D"],
    dr: Float[Tensor, " S"],
) -> Float[Tensor, "N S D"]:
    r"""Single-path stochastic value gradient $\widehat{\nabla V}_k = A\epsilon_k/(g_k\sqrt{\Delta r_k})$.

    Variance $O(1/\Delta r)$ per step; plugged into `value_gradient_policy_gradient` it
    reproduces `ito_policy_gradient` exactly.

    Examples:
        >>> stochastic_value_gradient(torch.tensor([1.0]), torch.tensor([2.0]), torch.ones(1, 1, 1),
        ...                           torch.tensor([0.25])).tolist()
        [[[1.0]]]
    """
    check_float("advantages", advantages, ndim=1)
    _check_steps(noise, diffusion, dr)
    if advantages.shape[0] != noise.shape[0]:
        raise ShapeError(
            f"advantages: expected shape [{noise.shape[0]}] (the paths of noise), got {list(advantages.shape)}"
        )
    return noise * (advantages[:, None, None] / (diffusion * dr.sqrt())[:, None])


def value_gradient_policy_gradient(
    drift_grad: Float[Tensor, "N S D"],
    value_grad: Float[Tensor, "N S D"],
    dr: Float[Tensor, " S"],
    *,
    step_weights: Float[Tensor, "N S"] | None = None,
) -> Float[Tensor, " N"]:
    r"""Value-gradient form of the policy gradient of each path.

    $$
    \hat g_n = \sum_k w_{n,k}(\partial_\theta\mu_{n,k})^{\!\top}\widehat{\nabla V}_{n,k}\Delta r_k
    $$

    Discretises $E_Q\int(\nabla_\theta\mu)^\top\nabla_y V_r\,dr$, which follows from the
    martingale representation $A = V_0 + \int g\nabla V^\top dW$ and Itô's isometry.

    Args:
        drift_grad: ``[N, S, D]`` $\partial\mu/\partial\theta$.
        value_grad: ``[N, S, D]`` value-gradient estimates at the same points.
        dr: ``[S]`` step sizes (time-integration weights).
        step_weights: optional ``[S]`` or ``[N, S]``.

    Returns:
        ``[N]``.

    Examples:
        >>> value_gradient_policy_gradient(torch.ones(1, 2, 1), torch.ones(1, 2, 1), torch.tensor([0.5, 0.5])).tolist()
        [1.0]
    """
    check_float("drift_grad", drift_grad, ndim=3)
    check_float("value_grad", value_grad, ndim=3)
    check_float("dr", dr, ndim=1)
    check_same_shape("drift_grad", drift_grad, value_grad=value_grad)
    if dr.shape[0] != drift_grad.shape[1]:
        raise ShapeError(f"dr: expected shape [{drift_grad.shape[1]}], got {list(dr.shape)}")
    return _weighted_step_sum(_dot(drift_grad, value_grad), step_weights, dr)


def _check_times(t: Tensor) -> Tensor:
    if value_checks_enabled() and not bool(((t > 0) & (t < 1)).all()):
        raise DomainError("t: expected times in (0, 1) (the weights (1-t)/t are singular at the ends)")
    return t


@VALUE_GRADIENTS.register("deterministic", paper=_PAPER)
def deterministic_value_gradient(
    advantages: Float[Tensor, " N"],
    v_target: Float[Tensor, "N M D"],
    v_old: Float[Tensor, "N M D"],
    t: Float[Tensor, "N M"],
) -> Float[Tensor, "N M D"]:
    r"""One-sample forward-posterior value gradient $\widehat{\nabla V} = -\frac{1-t}{t}A\,(v - v_{old}(x_t, t))$.

    With $x_t = (1-t)x_0 + t\epsilon$ built from a rollout's $x_0$ and fresh noise,
    $v = \epsilon - x_0$. Its conditional mean is $\nabla_x V_t$ of the forward posterior,
    which is the sampler's value gradient only for the $\eta \equiv 1$ sampler with an exact
    $v_{old}$ (a different quantity otherwise).

    Args:
        advantages: ``[N]`` rollout advantages.
        v_target: ``[N, M, D]`` regression targets $v = \epsilon - x_0$ at M times per rollout.
        v_old: ``[N, M, D]`` proposal velocity $v_{old}(x_t, t)$ (no gradient).
        t: ``[N, M]`` times in (0, 1).

    Returns:
        ``[N, M, D]``.

    References:
        Xu et al. 2026, arXiv:2608.14430, Sec. 3.5 (recovers AWM / DiffusionNFT at first order).

    Examples:
        >>> deterministic_value_gradient(torch.tensor([1.0]), torch.ones(1, 1, 1), torch.zeros(1, 1, 1),
        ...                              torch.tensor([[0.5]])).tolist()
        [[[-1.0]]]
    """
    check_float("advantages", advantages, ndim=1)
    check_float("v_target", v_target, ndim=3)
    check_float("v_old", v_old, ndim=3)
    check_float("t", t, ndim=2)
    check_same_shape("v_target", v_target, v_old=v_old)
    if tuple(t.shape) != tuple(v_target.shape[:2]) or advantages.shape[0] != t.shape[0]:
        raise ShapeError(
            f"t, advantages: expected [N, M] = {list(v_target.shape[:2])} and [N], got "
            f"{list(t.shape)} and {list(advantages.shape)}"
        )
    _check_times(t)
    return (-(1.0 - t) / t * advantages[:, None]).unsqueeze(-1) * (v_target - v_old)


class KDEValueGradient(NamedTuple):
    """Output of `kde_value_gradient`: ``grad [G, N, D]``, the kernel value estimate
    ``value [G, N]`` and the effective group size ``1 / sum_j w_j^2`` ``[G, N]``."""

    grad: Tensor
    value: Tensor
    effective_size: Tensor


@VALUE_GRADIENTS.register("kde", paper=_PAPER)
def kde_value_gradient(
    x_t: Float[Tensor, "G N D"],
    t: Float[Tensor, "G N"],
    x0: Float[Tensor, "G K D"],
    advantages: Float[Tensor, "G K"],
) -> KDEValueGradient:
    r"""Multi-sample kernel value gradient over the rollout group (*reconstructed*).

    The group's K endpoints define the Gaussian-KDE marginal
    $\hat q_t = \frac1K\sum_j\mathcal N((1-t)x_0^{(j)}, t^2I)$; for each query $(x_t, t)$

    $$
    w_j \propto \exp\Big(-\frac{\|x_t-(1-t)x_0^{(j)}\|^2}{2t^2}\Big),\quad \hat V = \sum_j w_jA_j,\quad
                  \widehat{\nabla V} = \sum_j w_j(A_j - \hat V)\Big(-\frac{x_t-(1-t)x_0^{(j)}}{t^2}\Big).
    $$

    Weights are computed with a log-softmax (stable for any D). The own sample is included and the
    bandwidth is the exact forward kernel's ``t`` (our recommendation: the paper only names
    this estimator, so the exact form is reconstructed). A constant shift of the advantages
    cancels; ``K = 1`` or a constant-reward group gives 0.

    Args:
        x_t: ``[G, N, D]`` N query points per group (typically re-noised members of the group).
        t: ``[G, N]`` their times in (0, 1).
        x0: ``[G, K, D]`` the group's rollout endpoints.
        advantages: ``[G, K]`` their advantages.

    Returns:
        `KDEValueGradient`.

    Raises:
        ShapeError: shapes disagree.
        DomainError: a time outside (0, 1).

    References:
        Xu et al. 2026, arXiv:2608.14430 (multi-sample KDE estimator; named in the abstract).

    Examples:
        >>> out = kde_value_gradient(torch.zeros(1, 1, 1), torch.tensor([[0.5]]),
        ...                          torch.tensor([[[1.0], [-1.0]]]), torch.tensor([[1.0, 0.0]]))
        >>> out.grad.tolist(), out.value.tolist(), out.effective_size.tolist()  # symmetric: w = (1/2, 1/2)
        ([[[1.0]]], [[0.5]], [[2.0]])
    """
    check_float("x_t", x_t, ndim=3)
    check_float("t", t, ndim=2)
    check_float("x0", x0, ndim=3)
    check_float("advantages", advantages, ndim=2)
    g, n, d = x_t.shape
    if tuple(t.shape) != (g, n) or x0.shape[0] != g or x0.shape[2] != d or tuple(advantages.shape) != x0.shape[:2]:
        raise ShapeError(
            f"t, x0, advantages: expected [G, N] = [{g}, {n}], [G, K, D] with D = {d} and [G, K], "
            f"got {list(t.shape)}, {list(x0.shape)}, {list(advantages.shape)}"
        )
    _check_times(t)
    # Centre the group: with z_j = x0_j - mean_j x0 and y = x_t - (1-t) mean_j x0,
    # -||x_t - (1-t)x0_j||^2 / (2t^2) = s (y.z_j - (1-t)/2 ||z_j||^2) + (a term free of j), s = (1-t)/t^2,
    # and sum_j w_j (A_j - V) = 0 turns the gradient into s sum_j w_j (A_j - V) z_j (advantages centred too,
    # the estimator is shift invariant). Two batched products with augmented inner dimensions: no
    # [G, N, K, D] tensor, and no cancellation against ||x_t||^2 in high dimension.
    tt = t.unsqueeze(-1)  # [G, N, 1]
    mean = x0.mean(1, keepdim=True)  # [G, 1, D]
    z = x0 - mean  # [G, K, D]
    a_mean = advantages.mean(-1, keepdim=True)  # [G, 1]
    a = (advantages - a_mean).unsqueeze(-1)  # [G, K, 1]
    s = (1.0 - tt) / tt**2  # [G, N, 1]
    query = torch.cat([s * (x_t - (1.0 - tt) * mean), -0.5 * (1.0 - tt) * s], -1)  # [G, N, D+1]
    keys = torch.cat([z, _dot(z, z).unsqueeze(-1)], -1)  # [G, K, D+1]
    # weights as [G, K, N]: the softmax then reduces over a leading axis, much faster on CPU than over a short last one
    w = torch.softmax(torch.bmm(keys, query.transpose(1, 2)), dim=1)  # [G, K, N]
    d = z.shape[-1]
    moments = torch.bmm(w.transpose(1, 2), torch.cat([a * z, z, a], -1))  # sum_j w_j (a_j z_j, z_j, a_j)
    value_c = moments[..., 2 * d]  # [G, N]
    grad = s * (moments[..., :d] - value_c.unsqueeze(-1) * moments[..., d : 2 * d])
    return KDEValueGradient(grad, value_c + a_mean, 1.0 / (w * w).sum(1))


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
    check_float("w1", w1)
    check_float("w2", w2)
    check_same_shape("delta_v", delta_v, value_grad=value_grad)
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
    _check_times(t)
    if value_checks_enabled() and not bool((eta > 0).all()):
        raise DomainError("eta: expected eta_t > 0 (the quadratic weight is infinite for the ODE sampler)")
    w2 = 1.0 + eta
    return advantages * w2**2 * (1.0 - t) / (4.0 * t * eta), w2


def elbo_weight(t: Tensor) -> Tensor:
    r"""The ELBO weight $s(t) = (1-t)/t$ (unbounded as $t\to0$)."""
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
