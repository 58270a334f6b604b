r"""Optimal comparison designs: convex programs (cvxpy) and a vectorised Frank-Wolfe solver.

The design matrix is $A(q)=R+\sum_e q_e\,s_e\,g_eg_e^\top$ (``R`` = ridge: ``lambda*I`` or a
given PSD matrix; ``s_e`` optional Fisher weights, default 1 since $\sigma'(0)=1/4$ only
rescales). Criteria over the simplex $q\in\Delta(E)$:

- ``trace`` (the paper's curvature-weighted criterion): $\mathrm{tr}(M A(q)^{-1})$;
- ``A``: $\mathrm{tr}(A(q)^{-1})$ (``M = I``); ``D``: $-\log\det A(q)$; ``E``: $-\lambda_{\min}(A(q))$.

cvxpy: `build_design_problem` builds, `solve_design_problem` solves and raises
`ConvergenceError` on a non-optimal status. `frank_wolfe_design`
solves the ``trace``/``A`` criteria for large pools (one ``E x D`` matmul per iteration, exact
line search, away steps).

Reference: Han, Goyal, Ma (2026), arXiv:2606.19607 (Section 5: convex objective, Frank-Wolfe).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import cvxpy as cp
import numpy as np
from numpy.typing import ArrayLike
from scipy.linalg import qr

from posttrain.errors import ConvergenceError, DomainError, ShapeError
from posttrain.theory.dpo_design import Array, as_array, check_simplex, uniform_design
from posttrain.validate import check_positive

__all__ = [
    "Criterion",
    "DesignProblem",
    "DesignResult",
    "build_design_problem",
    "design_matrix",
    "design_objective",
    "frank_wolfe_design",
    "solve_design_problem",
    "spanning_start",
]


class Criterion(str, Enum):
    """Design criteria (all convex in ``q``)."""

    TRACE = "trace"
    A = "A"
    D = "D"
    E = "E"


@dataclass(frozen=True)
class DesignResult:
    """A solved design."""

    q: Array
    """``[E]`` design weights on the simplex."""
    objective: float
    """Criterion value at ``q``."""
    status: str
    """Solver status (cvxpy status or ``converged`` / ``max_iter`` for Frank-Wolfe)."""
    solver: str
    iterations: int
    duality_gap: float
    """Frank-Wolfe gap (an upper bound on ``objective - optimum``); ``nan`` for cvxpy."""


@dataclass(frozen=True)
class DesignProblem:
    """A built cvxpy problem with its design variable."""

    problem: cp.Problem
    q: cp.Variable
    criterion: Criterion
    objective_fn: Any
    """Numeric twin ``q -> criterion value`` used to report the objective at the returned ``q``."""


def _prepare(
    g: ArrayLike, M: ArrayLike | None, weights: ArrayLike | None, ridge: float | ArrayLike
) -> tuple[Array, Array, Array, Array]:
    gg = as_array("g", g, 2)
    num_edges, d = gg.shape
    s = np.ones(num_edges) if weights is None else as_array("weights", weights, 1)
    if s.shape[0] != num_edges or np.any(s < 0):
        raise DomainError(f"weights: expected [{num_edges}] non-negative values, got shape {list(s.shape)}")
    m = np.eye(d) if M is None else as_array("M", M, 2)
    if m.shape != (d, d):
        raise ShapeError(f"M: expected shape [{d}, {d}], got {list(m.shape)}")
    if np.ndim(ridge) == 0:
        r = check_positive("ridge", float(np.asarray(ridge)), strict=False) * np.eye(d)
    else:
        r = as_array("ridge", ridge, 2)
        if r.shape != (d, d):
            raise ShapeError(f"ridge: expected a scalar or shape [{d}, {d}], got {list(r.shape)}")
    return gg, s, 0.5 * (m + m.T), 0.5 * (r + r.T)


def design_matrix(
    q: ArrayLike, g: ArrayLike, *, weights: ArrayLike | None = None, ridge: float | ArrayLike = 1e-3
) -> Array:
    r"""$A(q)=R+\sum_e q_e s_e g_eg_e^\top$ (``[D, D]``).

    Examples:
        >>> design_matrix(np.array([1.0]), np.array([[1.0, 0.0]]), ridge=0.5).tolist()
        [[1.5, 0.0], [0.0, 0.5]]
    """
    gg, s, _, r = _prepare(g, None, weights, ridge)
    qq = check_simplex("q", q, gg.shape[0])
    a = r + (gg * (qq * s)[:, None]).T @ gg
    return np.asarray(0.5 * (a + a.T))


def _trace_inv(a: Array, m: Array) -> float:
    try:
        chol = np.linalg.cholesky(a)
    except np.linalg.LinAlgError:
        return float("inf")
    linv = np.linalg.solve(chol, np.eye(a.shape[0]))
    return float(np.sum((linv @ m) * linv))


def design_objective(
    q: ArrayLike,
    g: ArrayLike,
    M: ArrayLike | None = None,
    *,
    criterion: Criterion | str = Criterion.TRACE,
    weights: ArrayLike | None = None,
    ridge: float | ArrayLike = 1e-3,
) -> float:
    r"""The criterion value at ``q`` (``inf`` where $A(q)$ is singular for trace/A).

    Examples:
        >>> round(design_objective(np.array([0.5, 0.5]), np.eye(2), ridge=0.0), 12)  # tr((I/2)^{-1})
        4.0
    """
    crit = Criterion(criterion)
    gg, s, m, r = _prepare(g, M, weights, ridge)
    a = design_matrix(q, gg, weights=s, ridge=r)
    if crit in (Criterion.TRACE, Criterion.A):
        return _trace_inv(a, m if crit is Criterion.TRACE else np.eye(a.shape[0]))
    evals = np.linalg.eigvalsh(a)
    if crit is Criterion.E:
        return float(-evals[0])
    return float("inf") if evals[0] <= 0 else float(-np.sum(np.log(evals)))


def build_design_problem(
    g: ArrayLike,
    M: ArrayLike | None = None,
    *,
    criterion: Criterion | str = Criterion.TRACE,
    weights: ArrayLike | None = None,
    ridge: float | ArrayLike = 1e-3,
    costs: ArrayLike | None = None,
) -> DesignProblem:
    r"""Build the convex design program $\min_{q\in\Delta(E)}\Phi(A(q))$ in cvxpy.

    ``trace``: ``matrix_frac(M^{1/2}, A)`` $=\mathrm{tr}(M A^{-1})$; ``A``: the same with
    ``M = I``; ``D``: ``-log_det(A)``; ``E``: ``-lambda_min(A)``. $A(q)$ is assembled from
    its upper triangle (``D(D+1)/2 x E`` coefficients). ``costs`` (optional ``[E]``, extension,
    off by default) adds the labelling-budget constraint $\sum_e q_e c_e\le 1$.
    """
    crit = Criterion(criterion)
    gg, s, m, r = _prepare(g, M, weights, ridge)
    num_edges, d = gg.shape
    iu = np.triu_indices(d)
    coef = (gg[:, iu[0]] * gg[:, iu[1]] * s[:, None]).T  # [D(D+1)/2, E]
    q = cp.Variable(num_edges, nonneg=True)
    upper = cp.vec_to_upper_tri(coef @ q)
    a = r + upper + upper.T - cp.diag(cp.diag(upper))
    if crit in (Criterion.TRACE, Criterion.A):
        mm = m if crit is Criterion.TRACE else np.eye(d)
        evals, evecs = np.linalg.eigh(mm)
        if evals[-1] <= 0:
            raise DomainError("M: expected a non-zero PSD matrix")
        keep = evals > 1e-12 * evals[-1]
        root = evecs[:, keep] * np.sqrt(evals[keep])
        objective = cp.matrix_frac(root, a)
    elif crit is Criterion.D:
        objective = -cp.log_det(a)
    else:
        objective = -cp.lambda_min(a)
    constraints = [cp.sum(q) == 1]
    if costs is not None:
        c = as_array("costs", costs, 1)
        if c.shape[0] != num_edges:
            raise ShapeError(f"costs: expected shape [{num_edges}], got {list(c.shape)}")
        constraints.append(c @ q <= 1)

    def numeric(qv: Array) -> float:
        return design_objective(qv, gg, m, criterion=crit, weights=s, ridge=r)

    return DesignProblem(cp.Problem(cp.Minimize(objective), constraints), q, crit, numeric)


def solve_design_problem(problem: DesignProblem, *, solver: str | None = None, **solver_options: Any) -> DesignResult:
    """Solve a built design program; a status other than optimal / optimal_inaccurate raises.

    Raises:
        ConvergenceError: infeasible, unbounded, or solver failure (the status is in the message).
    """
    try:
        problem.problem.solve(solver=solver, **solver_options)
    except cp.error.SolverError as exc:
        raise ConvergenceError(f"design solver {solver or 'default'} failed: {exc}") from exc
    status = str(problem.problem.status)
    if status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE) or problem.q.value is None:
        raise ConvergenceError(f"design solver {solver or 'default'} stopped with status {status!r}")
    q = np.clip(np.asarray(problem.q.value, dtype=np.float64), 0.0, None)
    q = q / q.sum()
    stats = problem.problem.solver_stats
    return DesignResult(
        q=q,
        objective=float(problem.objective_fn(q)),
        status=status,
        solver=str(stats.solver_name),
        iterations=int(stats.num_iters or 0),
        duality_gap=float("nan"),
    )


def _line_search(a: Array, delta: Array, m: Array, gamma_max: float) -> float:
    r"""Exact minimiser over $[0,\gamma_{max}]$ of $\gamma\mapsto\mathrm{tr}(M(A+\gamma\Delta)^{-1})$.

    With $A=LL^\top$ and $L^{-1}\Delta L^{-\top}=U\Lambda U^\top$ the function is
    $\sum_i m_i/(1+\gamma\lambda_i)$, $m_i=(U^\top L^{-1}ML^{-\top}U)_{ii}$; convex, so the
    root of its derivative is found by bisection.
    """
    linv = np.linalg.solve(np.linalg.cholesky(a), np.eye(a.shape[0]))
    lam, u = np.linalg.eigh(linv @ delta @ linv.T)
    w = linv.T @ u
    mi = np.sum(w * (m @ w), axis=0)
    neg = lam < 0
    hi = gamma_max
    if np.any(neg):
        hi = min(hi, (1.0 - 1e-12) * float(np.min(-1.0 / lam[neg])))

    def slope(gam: float) -> float:
        return float(-np.sum(mi * lam / (1.0 + gam * lam) ** 2))

    if slope(0.0) >= 0.0:
        return 0.0
    if slope(hi) <= 0.0:
        return hi
    lo = 0.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if slope(mid) < 0.0 else (lo, mid)
    return 0.5 * (lo + hi)


def spanning_start(g: ArrayLike, *, rtol: float = 1e-9) -> Array:
    """A sparse starting design: uniform over the edges chosen by column-pivoted QR of ``g^T``.

    The chosen edges span the span of all edge vectors (at most ``D`` of them), so ``A(q0)`` is
    non-singular on the identifiable subspace while the support stays small (away steps then
    have little mass to remove).
    """
    gg = as_array("g", g, 2)
    _, r, piv = qr(gg.T, mode="economic", pivoting=True)
    diag = np.abs(np.diag(r))
    if diag.size == 0 or diag[0] == 0.0:
        raise DomainError("g: every edge vector is zero")
    chosen = piv[: int(np.sum(diag > rtol * diag[0]))]
    q0 = np.zeros(gg.shape[0])
    q0[chosen] = 1.0 / chosen.size
    return q0


def frank_wolfe_design(
    g: ArrayLike,
    M: ArrayLike | None = None,
    *,
    weights: ArrayLike | None = None,
    ridge: float | ArrayLike = 1e-3,
    max_iter: int = 5000,
    tol: float = 1e-4,
    away_steps: bool = True,
    q0: ArrayLike | None = None,
) -> DesignResult:
    r"""Frank-Wolfe (with away steps and exact line search) for $\min_q\mathrm{tr}(M A(q)^{-1})$.

    Gradient $\partial\Phi/\partial q_e=-s_e\,g_e^\top A^{-1}MA^{-1}g_e$ (one ``E x D`` by
    ``D x D`` matmul per iteration). A toward step moves to the edge of most negative gradient; an
    away step moves mass off the support edge of largest gradient when that direction is steeper
    (Wolfe 1970; Todd 2016). The objective never increases. Stops when the FW duality gap
    $\langle\nabla\Phi,q-e_{j^*}\rangle\ge\Phi(q)-\Phi^*$ falls below ``tol * Phi(q)``.

    Args:
        g: ``[E, D]`` edge vectors. M: ``[D, D]`` PSD weight (``None``: A-optimal).
        weights: ``[E]`` Fisher weights ``s_e`` (default 1). ridge: ``lambda`` or a ``[D, D]`` matrix.
        max_iter: iteration cap (``status = "max_iter"`` if reached). tol: relative gap tolerance.
        away_steps: allow away steps. q0: start (default `spanning_start`; uniform if that
            is singular).

    Returns:
        `DesignResult` (``duality_gap`` is the last FW gap).

    Examples:
        >>> res = frank_wolfe_design(np.eye(3), ridge=0.0, tol=1e-10)  # symmetric: uniform is optimal
        >>> res.q.round(6).tolist(), round(res.objective, 6)
        ([0.333333, 0.333333, 0.333333], 9.0)
    """
    gg, s, m, r = _prepare(g, M, weights, ridge)
    num_edges = gg.shape[0]
    if int(max_iter) < 1 or not tol > 0:
        raise DomainError(f"max_iter, tol: expected >= 1 and > 0, got {max_iter}, {tol}")
    q = spanning_start(gg * np.sqrt(s)[:, None]) if q0 is None else check_simplex("q0", q0, num_edges).copy()
    gs = gg * s[:, None]
    a = design_matrix(q, gg, weights=s, ridge=r)
    if q0 is None and not np.isfinite(_trace_inv(a, m)):
        q = uniform_design(num_edges)
        a = design_matrix(q, gg, weights=s, ridge=r)
    if not np.isfinite(_trace_inv(a, m)):
        raise DomainError("q0: the starting design matrix A(q0) is singular")
    gap = float("inf")
    status, it = "max_iter", 0
    for it in range(1, int(max_iter) + 1):
        if it % 100 == 0:  # refresh the incrementally updated A against drift
            a = design_matrix(q, gg, weights=s, ridge=r)
        ainv = np.linalg.inv(a)
        h = ainv @ m @ ainv
        grad = -np.sum((gs @ h) * gg, axis=1)  # [E]
        phi = float(np.trace(m @ ainv))
        toward = int(np.argmin(grad))
        gap = float(q @ grad - grad[toward])
        if gap <= tol * phi:
            status = "converged"
            break
        away, away_gap = -1, -np.inf
        if away_steps:
            support = np.flatnonzero(q > 0)
            away = int(support[np.argmax(grad[support])])
            away_gap = float(grad[away] - q @ grad)
        vertex = r + s[toward] * np.outer(gg[toward], gg[toward])
        if away_gap > gap and q[away] < 1.0:
            vertex = r + s[away] * np.outer(gg[away], gg[away])
            gmax = q[away] / (1.0 - q[away])
            step = _line_search(a, a - vertex, m, gmax)
            a = a + step * (a - vertex)
            q = q * (1.0 + step)
            q[away] = 0.0 if step >= gmax else q[away] - step
        else:
            step = _line_search(a, vertex - a, m, 1.0)
            a = a + step * (vertex - a)
            q = q * (1.0 - step)
            q[toward] += step
        a = 0.5 * (a + a.T)
    q = np.clip(q, 0.0, None)
    q = q / q.sum()
    return DesignResult(q, _trace_inv(design_matrix(q, gg, weights=s, ridge=r), m), status, "frank-wolfe", it, gap)
