r"""The DPO design bounds: the upper bound on DPO's RLHF gap and Van Trees lower bounds for any estimator.

For ``n`` labels from a design ``q`` (Han, Goyal, Ma 2026, notation of `posttrain.theory.dpo_design`):
the DPO gap is at most $\tfrac{C_{ub}}n\mathrm{tr}(I\Sigma_q^\dagger)$ at $\theta^\star$ (`gap_upper_bound`), and no
estimator's Bayes risk is below $\tfrac{C_{lb}}n E[\mathrm{tr}(I\Sigma_q^\dagger)]$ asymptotically
(`van_trees_lower_bound`). With both constants 1 these are the asymptotic mean gap of the MLE under this
package's normalisation of ``I``; `van_trees_bayes_bound` is the finite-sample Van Trees inequality
(the prior's information included), valid at every ``n``. Tests compare all three with simulated DPO
fits (`posttrain.simulators.preference`) on check 18's toy.

Reference: Han, Goyal, Ma (2026), "Which Pairs to Compare for LLM Post-Training?", arXiv:2606.19607.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from posttrain.errors import DomainError, ShapeError
from posttrain.theory.dpo_design import Array, as_array
from posttrain.validate import check_positive

__all__ = ["gap_upper_bound", "van_trees_bayes_bound", "van_trees_lower_bound"]


def gap_upper_bound(trace: float, n: int, *, c_ub: float = 1.0) -> float:
    r"""DPO upper bound $J(\pi^*)-J(\hat\pi_n)\le \tfrac{C_{ub}}{n}\mathrm{tr}(I(\theta^*)\Sigma(\theta^*)^\dagger)$.

    ``c_ub`` is not available from the paper (it depends on the confidence level and regularity
    constants); ``c_ub = 1`` gives the asymptotic mean gap under this package's normalisation of ``I``.

    Examples:
        >>> gap_upper_bound(6.0, 2000)
        0.003
    """
    if int(n) < 1:
        raise DomainError(f"n: expected a label count >= 1, got {n}")
    return float(check_positive("c_ub", c_ub) * float(trace) / int(n))


def van_trees_lower_bound(traces: ArrayLike, n: int, *, c_lb: float = 1.0) -> float:
    r"""Van Trees lower bound $\tfrac{C_{lb}}{n}\mathbb E_{\theta^*}[\mathrm{tr}(I(\theta^*)\Sigma(\theta^*)^\dagger)]$.

    Args:
        traces: ``[N]`` criterion values at ``N`` draws of $\theta^*$ from the prior.
        n: label budget; c_lb: the (unavailable) constant, default 1.

    Examples:
        >>> van_trees_lower_bound([4.0, 8.0], 100)
        0.06
    """
    t = np.asarray(traces, dtype=np.float64).reshape(-1)
    if t.size == 0 or np.any(np.isnan(t)):
        raise DomainError("traces: expected a non-empty array without NaN")
    if int(n) < 1:
        raise DomainError(f"n: expected a label count >= 1, got {n}")
    return float(check_positive("c_lb", c_lb) * t.mean() / int(n))


def van_trees_bayes_bound(
    curvatures: ArrayLike,
    informations: ArrayLike,
    prior_scores: ArrayLike,
    n: int | ArrayLike,
    *,
    prior_information: ArrayLike | None = None,
) -> float | Array:
    r"""Finite-sample Van Trees bound on the Bayes risk $E[(\hat\theta-\theta)^\top I(\theta)(\hat\theta-\theta)]$ of any estimator.

    For every estimator from ``n`` labels and every constant matrix ``C``, integration by parts gives
    $E[\delta^\top C S]=\mathrm{tr}\,C$ ($\delta=\hat\theta-\theta$, $S$ the joint score of labels and
    prior), and Cauchy-Schwarz with the weight $I(\theta)$ gives
    $\mathrm{risk}\ge(\mathrm{tr}\,C)^2/\mathrm{vec}(C)^\top Q\,\mathrm{vec}(C)$; the best ``C`` yields

    $$
    \mathrm{risk}\ \ge\ a^\top Q^{-1}a,\qquad Q=E_\theta\big[(n\Sigma(\theta)+\psi\psi^\top)\otimes I(\theta)^{-1}\big],
    \qquad a=\mathrm{vec}(\mathrm{Id}),
    $$

    with $\psi=\nabla\log p_{prior}(\theta)$ (Gaussian prior: $-\theta/\sigma^2$). It needs a prior density that
    vanishes at infinity and a PD weight on the identifiable subspace: pass every matrix in an
    identifiable basis ``U`` (``U.T @ M @ U``). As ``n`` grows, ``n`` times it tends to a value at most
    $E[\mathrm{tr}(I\Sigma^{-1})]$ (`van_trees_lower_bound` with ``c_lb = 1``, the asymptotic risk
    of the MLE; the constant ``C`` leaves a Jensen gap over the prior); at small ``n`` the prior's
    information makes it smaller. The gap $\beta\mathrm{KL}$ equals this quadratic risk to second
    order in $\delta$. The prior expectation is a mean over the ``N`` draws given; with
    ``prior_information`` $J=E[\psi\psi^\top]$ known (Gaussian: $\mathrm{Id}/\sigma^2$), the prior
    term is estimated as $J\otimes\overline{I^{-1}}+\overline{(\psi\psi^\top-J)\otimes(I^{-1}-\overline{I^{-1}})}$
    (a control variate, same expectation, much less noise).

    Args:
        curvatures: ``[N, r, r]`` $I(\theta_s)$ at ``N`` draws from the prior (PD).
        informations: ``[N, r, r]`` per-label information $\Sigma(\theta_s)$ of the design.
        prior_scores: ``[N, r]`` $\psi(\theta_s)$.
        n: label budget, or ``[B]`` budgets (the prior expectations are computed once).
        prior_information: ``[r, r]`` $J$, optional.

    Returns:
        The bound (a Monte-Carlo estimate over the ``N`` prior draws); ``[B]`` for several budgets.

    Examples:
        >>> eye = np.eye(1)[None]  # one coordinate, I = Sigma = 1, prior N(0, 1): the Gaussian 1 / (n + 1)
        >>> round(van_trees_bayes_bound(eye.repeat(2, 0), eye.repeat(2, 0), np.array([[1.0], [-1.0]]), 3), 6)
        0.25
    """
    w = as_array("curvatures", curvatures, 3)
    s = as_array("informations", informations, 3)
    psi = as_array("prior_scores", prior_scores, 2)
    num, r = w.shape[0], w.shape[1]
    if w.shape != (num, r, r) or s.shape != w.shape or psi.shape != (num, r):
        raise ShapeError(
            f"curvatures, informations, prior_scores: expected [N, r, r], [N, r, r], [N, r], got "
            f"{list(w.shape)}, {list(s.shape)}, {list(psi.shape)}"
        )
    budgets = np.asarray(n)
    if budgets.ndim > 1 or not np.issubdtype(budgets.dtype, np.integer) or np.any(budgets < 1):
        raise DomainError(f"n: expected a label count >= 1 (or a 1-d array of them), got {n!r}")
    w_inv: Array = np.asarray(np.linalg.inv(0.5 * (w + w.transpose(0, 2, 1))), dtype=np.float64)  # [N, r, r]
    outer: Array = psi[:, :, None] * psi[:, None, :]

    def mean_kron(left: Array, right: Array) -> Array:  # mean_s left_s (x) right_s, laid out [(i, k), (j, l)]
        sums = (left.reshape(num, r * r).T @ right.reshape(num, r * r)).reshape(r, r, r, r)
        return sums.transpose(0, 2, 1, 3).reshape(r * r, r * r) / num

    labels = mean_kron(s, w_inv)
    if prior_information is None:
        prior = mean_kron(outer, w_inv)
    else:
        j = as_array("prior_information", prior_information, 2)
        if j.shape != (r, r):
            raise ShapeError(f"prior_information: expected shape [{r}, {r}], got {list(j.shape)}")
        w_bar = w_inv.mean(axis=0)
        prior = np.kron(j, w_bar) + mean_kron(outer - j, w_inv - w_bar)
    a = np.eye(r).reshape(-1)
    out = [
        float(a @ np.linalg.solve(0.5 * (q + q.T), a)) for q in (int(b) * labels + prior for b in budgets.reshape(-1))
    ]
    return out[0] if budgets.ndim == 0 else np.asarray(out)
