r"""Path-space policy gradients of diffusion / flow models: Girsanov path weights, the path score, Ito.

Sampling SDE in ``r = 1 - t`` with drift $\mu_\theta$ and noise scale $g$ (see
`posttrain.simulators.sde`). Paths carry the standard-normal noise $\epsilon_{n,k}$ of each
Euler step, so every estimator here is a batched function of ``[N, S, D]`` tensors (N paths, S
steps, D state dimension) with no loop over paths or steps.

Two families of the same gradient $\nabla_\theta E_{P_\theta}[A(x_0)]$:

- reverse-trajectory (Flow-GRPO): the Girsanov / Itô-integral score of the path;
- forward-matching (AWM, DiffusionNFT): the value-gradient form with $\nabla V$ estimated from
  the forward-noising posterior (one sample, or a kernel estimate over the rollout group), in
  `posttrain.estimators.diffusion.value_gradients` and `posttrain.estimators.diffusion.forward_matching`.

References:
    Xu, Zhang, Luo, Wang, He 2026, "Designing Reinforcement Learning for Diffusion Models: A Unified
    Path-Space View", arXiv:2608.14430. Flow-GRPO (Liu et al. 2025, arXiv:2505.05470); AWM (Xue et
    al. 2025, arXiv:2509.25050); DiffusionNFT (Zheng et al. 2025, arXiv:2509.16117).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.shapes import Float
from posttrain.validate import (
    check_float,
    check_same_shape,
    value_checks_enabled,
)

__all__ = ["girsanov_log_weights", "ito_policy_gradient", "path_score"]


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
