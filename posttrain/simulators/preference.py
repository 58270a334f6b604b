r"""Pairwise preference labels from a log-linear Bradley-Terry model, and the DPO fit on them, batched.

The toy of `posttrain.theory.dpo_design`: a log-linear policy $\pi_\theta\propto\pi_0e^{\theta^\top\phi}$
whose DPO logit on an edge $e$ is $u_e = g_e^\top\theta$ ($g_e = \beta(\phi_a-\phi_b)$). Labels: ``n``
edges drawn i.i.d. from a design ``q``, each won by its first completion with probability
$\sigma(g_e^\top\theta^\star)$ (`sample_labels`, aggregated as per-edge counts and wins). The DPO
estimator on such labels is the ridge-regularised logistic MLE of $\theta$ (`fit_loglinear_dpo`,
Newton's method, batched over any leading axes). The exact RLHF gap of a fit is
`posttrain.theory.dpo_design.rlhf_gap`.

Arrays are float64 numpy; dimensions: ``E`` candidate edges, ``D`` features, leading axes free.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy import sparse
from scipy.special import expit

from posttrain.errors import ConvergenceError, DomainError, ShapeError
from posttrain.theory.dpo_design import as_array, check_simplex

__all__ = ["fit_loglinear_dpo", "sample_labels"]

Array = NDArray[np.float64]


def sample_labels(
    q: Array, n: int, p_win: Array, rng: np.random.Generator, *, size: tuple[int, ...] = ()
) -> tuple[Array, Array]:
    r"""Draw ``n`` labelled edges from the design ``q``: per-edge counts $c_e\sim\mathrm{Mult}(n, q)$ and wins $\mathrm{Bin}(c_e, p_e)$.

    Args:
        q: ``[E]`` design on the simplex.
        n: labels per replicate, >= 1.
        p_win: ``[..., E]`` probability that the edge's first completion wins, broadcast against ``size + [E]``.
        rng: numpy generator.
        size: leading replicate shape.

    Returns:
        ``(counts, wins)``, both ``[*size, E]`` float64.

    Examples:
        >>> c, w = sample_labels(np.array([1.0, 0.0]), 5, np.array([1.0, 0.5]), np.random.default_rng(0))
        >>> c.tolist(), w.tolist()
        ([5.0, 0.0], [5.0, 0.0])
    """
    qq = check_simplex("q", q, int(np.size(q)))
    if int(n) < 1:
        raise DomainError(f"n: expected a label count >= 1, got {n}")
    p = np.asarray(p_win, dtype=np.float64)
    if p.shape[-1:] != qq.shape or np.any((p < 0) | (p > 1)):
        raise ShapeError(f"p_win: expected probabilities of shape [..., {qq.size}], got {list(p.shape)}")
    counts = rng.multinomial(int(n), qq, size=size).astype(np.int64)
    wins = rng.binomial(counts, np.broadcast_to(p, counts.shape))
    return counts.astype(np.float64), wins.astype(np.float64)


def fit_loglinear_dpo(
    counts: Array, wins: Array, g: Array, *, ridge: float, iters: int = 100, tol: float = 1e-10
) -> Array:
    r"""Ridge logistic MLE $\arg\min_\theta \sum_e[c_e\log(1+e^{u_e}) - w_eu_e] + \tfrac\lambda2\|\theta\|^2$, $u=g\theta$.

    The DPO loss on aggregated labels of a log-linear policy (its minimiser is DPO's fit). Newton's
    method from 0, batched over the leading axes of ``counts``.

    Args:
        counts, wins: ``[..., E]`` labels per edge and first-completion wins.
        g: ``[E, D]`` edge vectors.
        ridge: $\lambda > 0$ (makes the problem strictly convex when the design misses directions).
        iters: Newton iterations at most; tol: stop when every step's largest entry is below it.

    Returns:
        ``[..., D]``.

    Raises:
        ConvergenceError: not converged after ``iters`` steps.

    Examples:
        >>> theta = fit_loglinear_dpo(np.array([4.0]), np.array([2.0]), np.array([[1.0, -1.0]]), ridge=1.0)
        >>> theta.round(6).tolist()  # a tie: no preference
        [0.0, 0.0]
    """
    gg = as_array("g", g, 2)
    c, w = np.asarray(counts, dtype=np.float64), np.asarray(wins, dtype=np.float64)
    if c.shape != w.shape or c.shape[-1:] != gg.shape[:1]:
        raise ShapeError(f"counts, wins: expected equal shapes [..., {gg.shape[0]}], got {c.shape}, {w.shape}")
    if not ridge > 0:
        raise DomainError(f"ridge: expected > 0, got {ridge}")
    d = gg.shape[1]
    theta = np.zeros((*c.shape[:-1], d))
    eye = ridge * np.eye(d)
    # [D*D, E] sparse when g is (tabular edges: 4 entries of D*D): the Hessians of a batch in one product
    outer_t = sparse.csr_matrix(np.einsum("ed,ef->dfe", gg, gg).reshape(d * d, gg.shape[0]))
    lead = c.shape[:-1]
    for _ in range(int(iters)):
        p = expit(theta @ gg.T)
        grad = (c * p - w) @ gg + ridge * theta
        curv = (c * p * (1.0 - p)).reshape(-1, gg.shape[0])
        hess = np.asarray(outer_t @ curv.T).T.reshape(*lead, d, d) + eye
        step = np.linalg.solve(hess, grad[..., None])[..., 0]
        theta = theta - step
        if np.max(np.abs(step), initial=0.0) < tol:
            return theta
    raise ConvergenceError(f"fit_loglinear_dpo: Newton did not converge in {iters} iterations")
