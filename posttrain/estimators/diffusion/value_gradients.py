r"""Value-gradient estimators of the path-space policy gradient, and the gradient from them.

$\nabla V$ at noised states, estimated stochastically from the forward-noising posterior (one
sample), deterministically, or with a kernel over the rollout group (*reconstructed*); the policy
gradient then pairs it with the velocity. Shapes as in `posttrain.estimators.diffusion.girsanov`.

Reference: Xu et al. 2026, "Designing Reinforcement Learning for Diffusion Models: A Unified
Path-Space View", arXiv:2608.14430.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators.diffusion.girsanov import _check_steps, _dot, _weighted_step_sum
from posttrain.registry import Registry, registry
from posttrain.shapes import Float
from posttrain.validate import (
    check_float,
    check_same_shape,
    value_checks_enabled,
)

__all__ = [
    "VALUE_GRADIENTS",
    "KDEValueGradient",
    "deterministic_value_gradient",
    "kde_value_gradient",
    "stochastic_value_gradient",
    "value_gradient_policy_gradient",
]


_PAPER = "Xu et al. 2026, Unified Path-Space View, arXiv:2608.14430"

VALUE_GRADIENTS: Registry[Any] = registry("value_gradient")


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
