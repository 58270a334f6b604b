r"""Schulman's per-token KL estimators and a straight-through combinator.

With $d = \ell - \ell_{ref}$ on tokens sampled from the current policy $\pi$:

- k1 $= d$ (unbiased for $\mathrm{KL}(\pi\|\pi_{ref})$, high variance, can be negative),
- k2 $= d^2/2$ (biased, low variance, $\ge 0$),
- k3 $= e^{-d} + d - 1$ (unbiased, $\ge 0$; verl ``low_var_kl``).

Reference: J. Schulman, "Approximating KL divergence", 2020 (joschu.net/blog/kl-approx.html).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posttrain.estimators._numerics import computes_in_float32
from posttrain.estimators._registry import register_kl
from posttrain.estimators.importance.ratios import LOG_RATIO_CLAMP
from posttrain.shapes import Float
from posttrain.validate import check_finite, check_float, check_positive, check_same_shape

__all__ = ["k1_kl", "k2_kl", "k3_kl", "straight_through"]

_SCHULMAN = "Schulman 2020, Approximating KL divergence"


def _log_diff(logp: Tensor, logp_ref: Tensor) -> Tensor:
    check_float("logp", logp, ndim=(1, 2, 3))
    check_float("logp_ref", logp_ref)
    check_same_shape("logp", logp, logp_ref=logp_ref)
    check_finite("logp", logp)
    check_finite("logp_ref", logp_ref)
    return logp - logp_ref


def _k3_lower_gap(max_value: float) -> float:
    r"""The $d < 0$ where $e^{-d} + d - 1 = m$ (``max_value``): below it k3 exceeds the cap.

    Newton's method on $f(u) = e^u - u - 1 - m$ for $u = -d > 0$ (convex and increasing
    there), started to the right of the root so the iterates decrease monotonically onto it.
    """
    u = max(math.log1p(max_value) + 1.0, 1.0)
    for _ in range(100):
        step = (math.expm1(u) - u - max_value) / math.expm1(u)
        u -= step
        if abs(step) <= 1e-15 * u:
            break
    return -u


@register_kl("k1", paper=_SCHULMAN)
@computes_in_float32
def k1_kl(logp: Float[Tensor, "B T"], logp_ref: Float[Tensor, "B T"]) -> Float[Tensor, "B T"]:
    r"""k1 estimator $\ell - \ell_{ref}$ of $\mathrm{KL}(\pi\|\pi_{ref})$ per token.

    Examples:
        >>> float(k1_kl(torch.tensor([[-1.0]]), torch.tensor([[-1.5]])))
        0.5
    """
    return _log_diff(logp, logp_ref)


@register_kl("k2", paper=_SCHULMAN)
@computes_in_float32
def k2_kl(logp: Float[Tensor, "B T"], logp_ref: Float[Tensor, "B T"]) -> Float[Tensor, "B T"]:
    r"""k2 estimator $\tfrac12(\ell - \ell_{ref})^2$ per token (non-negative, biased).

    Examples:
        >>> float(k2_kl(torch.tensor([[-1.0]]), torch.tensor([[-1.5]])))
        0.125
    """
    return 0.5 * _log_diff(logp, logp_ref) ** 2


@register_kl("k3", paper=_SCHULMAN)
@computes_in_float32
def k3_kl(
    logp: Float[Tensor, "B T"],
    logp_ref: Float[Tensor, "B T"],
    *,
    log_ratio_clamp: float | None = LOG_RATIO_CLAMP,
    max_value: float | None = None,
) -> Float[Tensor, "B T"]:
    r"""k3 estimator $e^{\ell_{ref}-\ell} - (\ell_{ref} - \ell) - 1$ per token (non-negative, unbiased).

    Computed as ``expm1(-d) + d`` with $d = \ell - \ell_{ref}$ for accuracy near 0. By default
    $d$ is clamped to ``[-20, 20]`` (verl's and OpenRLHF's log-ratio clamp), so the value is
    finite (at most $e^{20} + 19$) whatever the gap; TRL leaves it unclamped
    (``log_ratio_clamp=None``, which overflows to inf for gaps beyond ~88 in float32). verl's
    ``low_var_kl`` is ``log_ratio_clamp=20, max_value=10``; OpenRLHF's is ``max_value=10``. A clamp
    makes the estimator biased and zeroes its gradient where it is active. The cap
    ``max_value = m`` is applied to $d$ (at the gap $d_m < 0$ with k3 $= m$, and
    to the value for $d > 0$), so $e^{-d}$ never overflows where the cap binds and the
    gradient there is exactly 0, not NaN.

    Args:
        logp, logp_ref: same-shape float log-probs (``[B, T]``) of the sampled tokens, finite.
        log_ratio_clamp: if set (positive), clamp $d$ to ``[-c, c]`` first; None: unclamped.
        max_value: if set (positive), clamp the value to at most this.

    Raises:
        ShapeError: non-float or mismatched inputs.
        DomainError: non-finite log-probs, a
            non-positive clamp or cap.

    Examples:
        >>> round(float(k3_kl(torch.tensor([[-1.0]]), torch.tensor([[-1.5]]))), 7)
        0.1065307
    """
    d = _log_diff(logp, logp_ref)
    if log_ratio_clamp is not None:
        c = check_positive("log_ratio_clamp", log_ratio_clamp)
        d = d.clamp(-c, c)
    if max_value is None:
        return torch.expm1(-d) + d
    m = check_positive("max_value", max_value)
    d = d.clamp(min=_k3_lower_gap(m) * (1.0 + 1e-6))  # just past the root: the value cap below is exact
    return (torch.expm1(-d) + d).clamp(max=m)


def straight_through(value: Tensor, gradient: Tensor) -> Tensor:
    r"""A tensor whose value is ``value`` and whose gradient is that of ``gradient``.

    $$
    \mathrm{out} = \mathrm{sg}(v - g) + g
    $$

    e.g. verl's ``k3+``: ``straight_through(k3_kl(lp, ref), k2_kl(lp, ref))`` has k3's value and
    k2's (unbiased-gradient) gradient.

    Args:
        value, gradient: same-shape float tensors.

    Examples:
        >>> lp = torch.tensor([-1.0], requires_grad=True); ref = torch.tensor([-1.5])
        >>> out = straight_through(k3_kl(lp, ref), k2_kl(lp, ref))
        >>> out.backward(); round(float(out.detach()), 7), float(lp.grad)  # k3's value, k2's gradient d = 0.5
        (0.1065307, 0.5)
    """
    check_float("value", value)
    check_float("gradient", gradient)
    check_same_shape("value", value, gradient=gradient)
    return (value - gradient).detach() + gradient
