r"""The Tsallis loss continuum $J_Q$: q-logarithm, gradient identity, escort minimiser,
cold-start escape times, and the bias of the Monte-Carlo amplification factor.

$$
\ln_q(u) = \frac{u^{1-q}-1}{1-q},\qquad \ell_q(P) = -\ln_q P,\qquad
          \nabla_\theta \ell_q = P^{-q}\,\nabla_\theta(1-P) = P^{1-q}\,\nabla_\theta(-\log P)
$$

($q=0$: RLVR, $\ell_0 = 1-P$; $q=1$: marginal NLL, $\ell_1 = -\log P$).

Escape times (*reconstructed* gradient-flow model of the paper, §3.4): gradient flow on
$\ell_q$ gives $\dot P = P^{2-q} s(\theta)$ with $s = \|\nabla\log P\|^2$;
$T_q(p_0)$ is the time to reach $P = p_{esc}$. Model ``"sigmoid"`` (M1, one logit,
$s=(1-P)^2$) has closed forms at $q\in\{0,1\}$ and quadrature otherwise; model
``"softmax"`` (M2, K arms, one rewarded, symmetric wrong arms) is integrated as an ODE in the
logit gap and equals $\frac{K-1}{K}T^{M1}_q$ (a test checks this).

Bias (binary rewards, $k\sim\mathrm{Bin}(M,P)$, $\bar w=k/M$; exact binomial sums
next to their delta-method limits): the amplification factor
$E[\bar w^{-q}\mid k>0]-P^{-q}\approx\frac{q(q+1)(1-P)}{2MP^{q+1}}$ and the gradient scale
$M(P^{1-q}-E[\bar w^{1-q}])\to\frac{q(1-q)(1-P)}{2P^q}$, with variance
$M\,\mathrm{Var}[\bar w^{1-q}]\to(1-q)^2P^{1-2q}(1-P)$. Tests compare each exact sum with Monte-Carlo
draws of `posttrain.estimators.garl_weights` / `paft_weights` on a bandit.

Symbolic twins (sympy) of the closed forms live beside the numeric functions; tests check they agree.

References:
    Lin & Ie 2026, "How Fast Should a Model Commit to Supervision? Training Reasoning Models on
    the Tsallis Loss Continuum", arXiv:2604.25907.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import sympy as sp
import torch
from scipy import integrate, optimize, stats
from torch import Tensor

from posttrain.errors import ConvergenceError, DomainError

__all__ = [
    "EscapeFit",
    "amplification_bias",
    "amplification_bias_limit",
    "discrete_escape_steps",
    "ell_q",
    "ell_q_gradient",
    "escape_integral",
    "escape_time",
    "escape_time_bracket",
    "escape_time_closed_form",
    "escort_minimiser",
    "fit_escape_slope",
    "fit_noisy_label_policy",
    "gradient_scale_deficit",
    "gradient_scale_deficit_limit",
    "gradient_scale_variance",
    "gradient_scale_variance_limit",
    "ln_q",
    "symbolic_delta_method_bias",
    "symbolic_ell_q_derivative",
    "symbolic_escape_time",
    "symbolic_ln_q",
]

ArrayOrTensor = Any  # float, numpy array or torch tensor


def _check_q(q: float) -> float:
    q = float(q)
    if not 0.0 <= q <= 1.0:
        raise DomainError(f"q: expected a value in [0, 1], got {q!r}")
    return q


def ln_q(u: ArrayOrTensor, q: float) -> ArrayOrTensor:
    r"""Tsallis q-logarithm $\ln_q(u) = \mathrm{expm1}((1-q)\log u)/(1-q)$, $\ln_1 = \log$.

    Works on floats, numpy arrays and torch tensors (differentiable); stable as $q \to 1$.

    Examples:
        >>> ln_q(1.0, 0.3), round(float(ln_q(0.25, 0.0)), 6), round(float(ln_q(0.25, 1.0)), 6)
        (0.0, -0.75, -1.386294)
    """
    q = _check_q(q)
    if isinstance(u, Tensor):
        log_t = torch.log(u)
        return log_t if q == 1.0 else torch.expm1((1.0 - q) * log_t) / (1.0 - q)
    log_u = np.log(np.asarray(u, dtype=np.float64))
    out = log_u if q == 1.0 else np.expm1((1.0 - q) * log_u) / (1.0 - q)
    return float(out) if np.ndim(out) == 0 else out


def ell_q(p: ArrayOrTensor, q: float) -> ArrayOrTensor:
    r"""The loss $\ell_q(P) = -\ln_q(P) = (1 - P^{1-q})/(1-q)$; $\ell_0 = 1-P$, $\ell_1 = -\log P$."""
    return -ln_q(p, q)


def ell_q_gradient(p: ArrayOrTensor, grad_p: ArrayOrTensor, q: float) -> ArrayOrTensor:
    r"""The gradient identity (Prop. 4.1): $\nabla\ell_q = -P^{-q}\nabla P = P^{-q}\nabla\ell_0 = P^{1-q}\nabla\ell_1$.

    Args:
        p: success probability $P$ (broadcast against ``grad_p``'s leading axes).
        grad_p: $\nabla_\theta P$, parameters in the last axis.
        q: loss parameter in [0, 1].

    Examples:
        >>> float(ell_q_gradient(0.25, 1.0, 1.0))  # d(-log P)/dP at P = 1/4
        -4.0
    """
    q = _check_q(q)
    if isinstance(grad_p, Tensor):
        return -(torch.as_tensor(p, dtype=grad_p.dtype) ** (-q)) * grad_p
    return -(np.asarray(p, dtype=np.float64) ** (-q)) * np.asarray(grad_p, dtype=np.float64)


def escort_minimiser(alpha: np.ndarray, q: float) -> np.ndarray:
    r"""Minimiser of $\sum_y \alpha_y \ell_q(\pi_y)$ over the simplex: $\pi^*\propto\alpha^{1/q}$.

    Computed in log space; ``q = 0`` returns the limit (uniform over the argmax set of ``alpha``).

    Examples:
        >>> [round(float(x), 4) for x in escort_minimiser(np.array([0.6, 0.3, 0.1]), 0.5)]
        [0.7826, 0.1957, 0.0217]
    """
    q = _check_q(q)
    a = np.asarray(alpha, dtype=np.float64)
    if a.ndim != 1 or np.any(a < 0) or not math.isclose(a.sum(), 1.0, rel_tol=1e-9):
        raise DomainError("alpha: expected a probability vector")
    if q == 0.0:
        top = a == a.max()
        return top / top.sum()
    with np.errstate(divide="ignore"):
        logits = np.log(a) / q
    logits -= logits.max()
    w = np.exp(logits)
    return w / w.sum()


def fit_noisy_label_policy(alpha: np.ndarray, q: float, *, gtol: float = 1e-12) -> np.ndarray:
    r"""Numerical minimiser (BFGS on softmax logits) of $E_{y\sim\alpha}[\ell_q(\mathrm{softmax}(\theta)_y)]$.

    Gradient: $\nabla_\theta = -\sum_y \alpha_y \pi_y^{1-q}(e_y - \pi)$. Starts at uniform logits.

    Raises:
        ConvergenceError: BFGS failed for a reason other than precision loss at the optimum.
    """
    q = _check_q(q)
    a = np.asarray(alpha, dtype=np.float64)

    def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
        z = theta - theta.max()
        pi = np.exp(z) / np.exp(z).sum()
        loss = float(np.dot(a, ell_q(pi, q)))
        c = a * pi ** (1.0 - q)
        return loss, -(c - c.sum() * pi)

    res = optimize.minimize(fun, np.zeros_like(a), jac=True, method="BFGS", options={"gtol": gtol, "maxiter": 10_000})
    if not res.success and "precision" not in str(res.message):
        raise ConvergenceError(f"BFGS did not converge: {res.message}")
    z = res.x - res.x.max()
    return np.asarray(np.exp(z) / np.exp(z).sum())


# ---------------------------------------------------------------- escape times


def escape_integral(p0: float, q: float, *, p_esc: float = 0.5) -> float:
    r"""$I_q(p_0)=\int_{p_0}^{p_{esc}} P^{q-2}\,dP$, the escape time up to the score-norm bounds.

    With $c\le s(\theta)\le C$ while $P\le p_{esc}$, $I_q/C\le T_q\le I_q/c$ (`escape_time_bracket`);
    $T_q/I_q\to1$ as $p_0\to0$ in M1 for q < 1.

    Examples:
        >>> escape_integral(0.25, 0.0)  # 1/p0 - 1/p_esc
        2.0
    """
    q = _check_q(q)
    if q == 1.0:
        return math.log(p_esc / p0)
    return (p0 ** (q - 1.0) - p_esc ** (q - 1.0)) / (1.0 - q)


def escape_time_bracket(
    p0: float, q: float, *, model: Literal["sigmoid", "softmax"] = "sigmoid", K: int | None = None, p_esc: float = 0.5
) -> tuple[float, float]:
    r"""$(I_q/C,\ I_q/c)$: bounds on `escape_time` from the score norm $s\in[c, C]$ on $[p_0, p_{esc}]$.

    M1: $s=(1-P)^2$; M2 (K arms): $s=\frac{K}{K-1}(1-P)^2$; so $C=\kappa(1-p_0)^2$, $c=\kappa(1-p_{esc})^2$.

    Examples:
        >>> lo, hi = escape_time_bracket(0.25, 0.0)
        >>> round(lo, 4), hi, round(escape_time(0.25, 0.0), 4)
        (3.5556, 8.0, 4.8639)
    """
    kappa = 1.0
    if model == "softmax":
        if K is None or int(K) < 2:
            raise DomainError(f"K: the softmax model needs K >= 2 arms, got {K!r}")
        kappa = int(K) / (int(K) - 1.0)
    elif model != "sigmoid":
        raise DomainError(f"model: expected 'sigmoid' or 'softmax', got {model!r}")
    i = escape_integral(p0, q, p_esc=p_esc)
    return i / (kappa * (1.0 - p0) ** 2), i / (kappa * (1.0 - p_esc) ** 2)


def escape_time_closed_form(p0: float, q: float, *, p_esc: float = 0.5) -> float:
    r"""Closed-form M1 escape time for ``q`` in {0, 1} (partial fractions of $P^{q-2}(1-P)^{-2}$).

    $$
    T_0 = \Big[-\tfrac1P + 2\log\tfrac{P}{1-P} + \tfrac1{1-P}\Big]_{p_0}^{p_{esc}},\qquad
                  T_1 = \Big[\log\tfrac{P}{1-P} + \tfrac1{1-P}\Big]_{p_0}^{p_{esc}}
    $$

    Examples:
        >>> round(escape_time_closed_form(0.01, 0.0), 6)  # 1/p0 - 1/(1-p0) + 2 log((1-p0)/p0)
        108.180139
    """
    q = _check_q(q)
    if q == 0.0:

        def f(p: float) -> float:
            return -1.0 / p + 2.0 * math.log(p / (1.0 - p)) + 1.0 / (1.0 - p)

    elif q == 1.0:

        def f(p: float) -> float:
            return math.log(p / (1.0 - p)) + 1.0 / (1.0 - p)

    else:
        raise DomainError(f"q: closed forms exist for q in {{0, 1}}, got {q!r}")
    return f(p_esc) - f(p0)


def _m1_quadrature(p0: float, q: float, p_esc: float) -> float:
    # substitute x = log P: dT = P^{q-1} (1-P)^{-2} dx, smooth on [log p0, log p_esc]
    def integrand(x: float) -> float:
        p = math.exp(x)
        return p ** (q - 1.0) / (1.0 - p) ** 2

    val, _ = integrate.quad(integrand, math.log(p0), math.log(p_esc), epsabs=0.0, epsrel=1e-12, limit=200)
    return float(val)


def _m2_ode(p0: float, q: float, k: int, p_esc: float) -> float:
    # Flow on the logit gap d = theta_c - theta_w: d' = P^{1-q} (1-P) K/(K-1), P = sigmoid(d - log(K-1)).
    shift = math.log(k - 1)

    def prob(d: float) -> float:
        return 1.0 / (1.0 + math.exp(-(d - shift)))

    def rhs(t: float, y: np.ndarray) -> list[float]:
        p = prob(float(y[0]))
        return [p ** (1.0 - q) * (1.0 - p) * k / (k - 1)]

    def hit(t: float, y: np.ndarray) -> float:
        return prob(float(y[0])) - p_esc

    hit.terminal = True  # type: ignore[attr-defined]
    hit.direction = 1  # type: ignore[attr-defined]
    d0 = math.log(p0 / (1.0 - p0)) + shift
    t_max = 2.0 * escape_integral(p0, q, p_esc=p_esc) / (1.0 - p_esc) ** 2 + 1.0  # bound from s >= (1-p_esc)^2
    sol = integrate.solve_ivp(rhs, (0.0, t_max), [d0], method="DOP853", events=hit, rtol=1e-11, atol=1e-12)
    if sol.status != 1 or not len(sol.t_events[0]):
        raise ConvergenceError(f"M2 flow did not reach p_esc={p_esc} by t={t_max} (status {sol.status})")
    return float(sol.t_events[0][0])


def escape_time(
    p0: float,
    q: float,
    *,
    model: Literal["sigmoid", "softmax"] = "sigmoid",
    K: int | None = None,
    p_esc: float = 0.5,
) -> float:
    r"""Gradient-flow escape time $T_q(p_0)=\inf\{t: P(t)\ge p_{esc}\}$ in model M1 or M2.

    Args:
        p0: initial success probability in ``(0, p_esc)``.
        q: the loss parameter in ``[0, 1]``.
        model: ``"sigmoid"`` (M1: $\dot P = P^{2-q}(1-P)^2$, closed form at q in {0, 1},
            quadrature otherwise) or ``"softmax"`` (M2: K arms, one rewarded; ODE with a terminal event).
        K: number of arms (``"softmax"`` only, ``K >= 2``).
        p_esc: escape threshold in ``(p0, 1)``.

    Returns:
        The escape time (gradient-flow time units).

    Examples:
        >>> round(escape_time(0.01, 1.0), 6) == round(escape_time_closed_form(0.01, 1.0), 6)
        True
    """
    q = _check_q(q)
    if not 0.0 < p0 < p_esc < 1.0:
        raise DomainError(f"p0, p_esc: expected 0 < p0 < p_esc < 1, got p0={p0!r}, p_esc={p_esc!r}")
    if model == "sigmoid":
        if q in (0.0, 1.0):
            return escape_time_closed_form(p0, q, p_esc=p_esc)
        return _m1_quadrature(p0, q, p_esc)
    if model == "softmax":
        if K is None or int(K) < 2:
            raise DomainError(f"K: the softmax model needs K >= 2 arms, got {K!r}")
        return _m2_ode(p0, q, int(K), p_esc)
    raise DomainError(f"model: expected 'sigmoid' or 'softmax', got {model!r}")


def discrete_escape_steps(p0: float, q: float, *, eta: float, p_esc: float = 0.5, max_steps: int = 10_000_000) -> int:
    r"""Steps of gradient descent $\theta \leftarrow \theta + \eta P^{-q}P(1-P)$ on M1 until $P\ge p_{esc}$."""
    q = _check_q(q)
    theta = math.log(p0 / (1.0 - p0))
    p = p0
    for n in range(1, max_steps + 1):
        theta += eta * p ** (1.0 - q) * (1.0 - p)
        p = 1.0 / (1.0 + math.exp(-theta))
        if p >= p_esc:
            return n
    raise ConvergenceError(f"no escape within {max_steps} steps")


@dataclass(frozen=True)
class EscapeFit:
    """Least-squares slopes of escape time on a p0 grid: ``loglog`` (log T vs log 1/p0), ``semilog`` (T vs log 1/p0)."""

    loglog: float
    semilog: float


def fit_escape_slope(p0s: np.ndarray, times: np.ndarray) -> EscapeFit:
    """Fit both slopes of ``times`` against ``1/p0s``."""
    x = np.log(1.0 / np.asarray(p0s, dtype=np.float64))
    t = np.asarray(times, dtype=np.float64)
    return EscapeFit(float(np.polyfit(x, np.log(t), 1)[0]), float(np.polyfit(x, t, 1)[0]))


# ---------------------------------------------------------------- bias of the MC amplification


def _binomial(p: float, m: int) -> tuple[np.ndarray, np.ndarray]:
    k = np.arange(m + 1)
    return k / m, stats.binom.pmf(k, m, p)


def amplification_bias(p: float, q: float, m: int) -> float:
    r"""Exact $E[\bar w^{-q}\mid k>0] - P^{-q}$ for $k\sim\mathrm{Bin}(M,P)$, $\bar w = k/M$."""
    q = _check_q(q)
    w, pmf = _binomial(p, m)
    pos = w > 0
    cond = float(np.sum(pmf[pos] * w[pos] ** (-q)) / -math.expm1(m * math.log1p(-p)))
    return cond - p ** (-q)


def amplification_bias_limit(p: float, q: float, m: int) -> float:
    r"""Delta-method limit $q(q+1)(1-P)/(2MP^{q+1})$ of `amplification_bias` (valid for $MP\gg1$)."""
    return q * (q + 1.0) * (1.0 - p) / (2.0 * m * p ** (q + 1.0))


def _scale_draws(p: float, q: float, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Values of the estimator's gradient scale $\bar w^{1-q}$ on each ``k`` (0 where ``k = 0``, q = 1 included) and their pmf."""
    w, pmf = _binomial(p, m)
    return np.where(w > 0, w ** (1.0 - q), 0.0), pmf


def gradient_scale_deficit(p: float, q: float, m: int) -> float:
    r"""Exact $M(P^{1-q} - E[\bar w^{1-q}])$: the bias of the b=0 bandit gradient $\bar w^{1-q}(e_c-\pi)$, times M.

    The estimators give a prompt with $k=0$ weight exactly 0, so the event $k=0$ contributes 0 for
    every q in [0, 1] (at q = 1 the deficit is $M(1-P)^M$, not 0). Non-negative by Jensen. With
    several rewarded arms, $E[\hat g] = E[\bar w^{1-q}]\,\nabla P/P$: the same scale.

    Examples:
        >>> round(gradient_scale_deficit(0.5, 1.0, 2), 6)  # M (1 - P)^M
        0.5
    """
    q = _check_q(q)
    x, pmf = _scale_draws(p, q, m)
    return float(m * (p ** (1.0 - q) - np.sum(pmf * x)))


def gradient_scale_deficit_limit(p: float, q: float) -> float:
    r"""Limit $q(1-q)(1-P)/(2P^q)$ of `gradient_scale_deficit` as $M\to\infty$."""
    return q * (1.0 - q) * (1.0 - p) / (2.0 * p**q)


def gradient_scale_variance(p: float, q: float, m: int) -> float:
    r"""Exact $M\,\mathrm{Var}[\bar w^{1-q}]$: the variance, times M, of the b=0 gradient's scale.

    With one rewarded arm c, GARL (b = 0) and PAFT both give $\hat g = \bar w^{1-q}(e_c-\pi)$ (PAFT
    resamples only rewarded traces), so this is their variance along $e_c-\pi$ over $|e_c-\pi|^2$.

    Examples:
        >>> round(gradient_scale_variance(0.5, 0.0, 4), 6)  # M Var[k/M] = P (1 - P)
        0.25
    """
    q = _check_q(q)
    x, pmf = _scale_draws(p, q, m)
    mean = float(np.sum(pmf * x))
    return float(m * np.sum(pmf * (x - mean) ** 2))


def gradient_scale_variance_limit(p: float, q: float) -> float:
    r"""Delta-method limit $(1-q)^2P^{1-2q}(1-P)$ of `gradient_scale_variance` ($MP\gg1$): it grows as $P\to0$ for $q>1/2$."""
    return (1.0 - q) ** 2 * p ** (1.0 - 2.0 * q) * (1.0 - p)


# ---------------------------------------------------------------- symbolic twins


def symbolic_ell_q_derivative() -> tuple[sp.Symbol, sp.Symbol, sp.Expr]:
    """``(P, q, d ell_q / dP)`` simplified by sympy; equals ``-P**(-q)`` (the gradient identity's scalar factor)."""
    p, q = sp.symbols("P q", positive=True)
    return p, q, sp.simplify(sp.diff(-(p ** (1 - q) - 1) / (1 - q), p))


def symbolic_ln_q() -> tuple[sp.Symbol, sp.Symbol, sp.Expr]:
    """``(u, q, ln_q(u))`` as a sympy expression (``q != 1``)."""
    u, q = sp.symbols("u q", positive=True)
    return u, q, (u ** (1 - q) - 1) / (1 - q)


def symbolic_escape_time(q: int) -> tuple[sp.Symbol, sp.Symbol, sp.Expr]:
    r"""``(p0, p_esc, T_q)``: the M1 escape time $\int_{p_0}^{p_{esc}} P^{q-2}(1-P)^{-2}dP$ by sympy (q in {0, 1})."""
    if q not in (0, 1):
        raise DomainError(f"q: symbolic escape time for q in {{0, 1}}, got {q!r}")
    p, p0, pe = sp.symbols("P p0 p_esc", positive=True)
    integrand = sp.apart(p ** (q - 2) / (1 - p) ** 2, p)
    antider = sp.integrate(integrand, p)
    # sympy writes log(P - 1) for the 1/(1-P) terms; take the real branch log(1 - P) (0 < P < 1)
    antider = antider.subs(sp.log(p - 1), sp.log(1 - p))
    return p0, pe, sp.simplify(antider.subs(p, pe) - antider.subs(p, p0))


def symbolic_delta_method_bias(exponent: sp.Expr | float) -> tuple[sp.Symbol, sp.Symbol, sp.Expr]:
    r"""``(P, M, b)`` with $b = \frac12 f''(P)\,\frac{P(1-P)}{M}$ for $f(w) = w^{e}$: the delta-method bias of $E[f(\bar w)]$.

    ``exponent = -q`` gives the amplification bias, ``1 - q`` minus the gradient-scale deficit / M.
    """
    p, m, w = sp.symbols("P M w", positive=True)
    f = w ** sp.sympify(exponent)
    return p, m, sp.simplify(sp.diff(f, w, 2).subs(w, p) * p * (1 - p) / (2 * m))
