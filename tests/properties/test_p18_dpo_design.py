"""Properties of the DPO pair-design theory (spec 18, section 8)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.special import log_softmax

from posttrain.errors import ConvergenceError
from posttrain.estimators import dpo_loss
from posttrain.theory.dpo_design import (
    centred_basis,
    design_trace,
    edge_vectors,
    fisher_weights,
    information_matrix,
    loglinear_logp,
    policy_curvature,
    rlhf_gap,
    rlhf_objective,
    uniform_design,
    within_prompt_pairs,
)
from posttrain.theory.dpo_design_solvers import (
    build_design_problem,
    design_objective,
    frank_wolfe_design,
    solve_design_problem,
)

seeds = st.integers(0, 2**31 - 1)


def _simplex(rng: np.random.Generator, n: int) -> np.ndarray:
    q = rng.random(n) + 1e-3
    return q / q.sum()


def _tabular(d: int, logp0: np.ndarray, beta: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    phi = np.eye(d)[None]
    edges = within_prompt_pairs(1, d)
    return edges, edge_vectors(phi, edges, beta=beta), policy_curvature(phi, logp0[None], beta=beta)


@given(seed=seeds, e=st.integers(1, 12), d=st.integers(1, 6), alpha=st.floats(0, 1))
def test_information_psd_linear_additive(seed: int, e: int, d: int, alpha: float) -> None:
    rng = np.random.default_rng(seed)
    g, theta = rng.normal(size=(e, d)), rng.normal(size=d)
    q1, q2 = _simplex(rng, e), _simplex(rng, e)
    s1 = information_matrix(g, q1, theta=theta)
    assert np.allclose(s1, s1.T) and np.linalg.eigvalsh(s1).min() >= -1e-10
    mix = information_matrix(g, alpha * q1 + (1 - alpha) * q2, theta=theta)
    assert np.allclose(mix, alpha * s1 + (1 - alpha) * information_matrix(g, q2, theta=theta))
    idx = rng.integers(0, e, size=7)  # an empirical multiset of labelled edges
    w = fisher_weights(g[idx], theta)
    by_hand = sum(w[i] * np.outer(g[j], g[j]) for i, j in enumerate(idx)) / idx.size
    assert np.allclose(information_matrix(g[idx], np.full(idx.size, 1 / idx.size), theta=theta), by_hand)


@given(seed=seeds, d=st.integers(3, 7))
def test_adding_an_edge_is_loewner_monotone(seed: int, d: int) -> None:
    rng = np.random.default_rng(seed)
    logp0 = log_softmax(rng.normal(size=d))
    _, g, m = _tabular(d, logp0)
    counts = rng.integers(1, 4, size=g.shape[0]).astype(float)  # all edges present: connected
    extra = counts.copy()
    extra[rng.integers(g.shape[0])] += 1
    # fixed normalisation by counts: Sigma = sum_e c_e s_e g g^T (not averaged)
    s_before = information_matrix(g, counts / counts.sum()) * counts.sum()
    s_after = information_matrix(g, extra / extra.sum()) * extra.sum()
    assert np.linalg.eigvalsh(s_after - s_before).min() >= -1e-10
    basis = centred_basis(d)
    assert design_trace(m, s_after, basis=basis) <= design_trace(m, s_before, basis=basis) + 1e-10


@settings(max_examples=10)
@given(seed=seeds, d=st.integers(3, 6))
def test_optimal_design_is_permutation_equivariant(seed: int, d: int) -> None:
    rng = np.random.default_rng(seed)
    logp0 = log_softmax(rng.normal(size=d))
    perm = rng.permutation(d)
    edges, g, m = _tabular(d, logp0)
    _, g_p, m_p = _tabular(d, logp0[perm])
    ridge = 1e-6 * np.ones((d, d))
    res = frank_wolfe_design(g, m, ridge=ridge, tol=1e-10, max_iter=20000)
    res_p = frank_wolfe_design(g_p, m_p, ridge=ridge, tol=1e-10, max_iter=20000)
    assert res_p.objective == pytest.approx(res.objective, rel=1e-6)
    # edge (a, b) of the permuted instance is edge (perm[a], perm[b]) of the original
    lookup = {(a, b): i for i, (_, a, b) in enumerate(edges)}
    mapped = [lookup[tuple(sorted((perm[a], perm[b])))] for _, a, b in edges]
    assert np.allclose(res_p.q, res.q[mapped], atol=2e-3)


@given(seed=seeds, c=st.floats(-5, 5))
def test_prompt_shift_and_theta_constant_invariance(seed: int, c: float) -> None:
    rng = np.random.default_rng(seed)
    phi = rng.normal(size=(2, 4, 3))
    edges = within_prompt_pairs(2, 4)
    shifted = phi.copy()
    shifted[1] += rng.normal(size=3) * c  # add c(x) to every completion of prompt 1
    assert np.allclose(edge_vectors(phi, edges), edge_vectors(shifted, edges))
    logp0 = log_softmax(rng.normal(size=(1, 5)), axis=1)
    theta = rng.normal(size=5)
    tab = np.eye(5)[None]
    assert np.allclose(loglinear_logp(tab, theta, logp0), loglinear_logp(tab, theta + c, logp0))


@given(seed=seeds, d=st.integers(2, 9), beta=st.floats(0.1, 5))
def test_uniform_complete_graph_closed_form(seed: int, d: int, beta: float) -> None:
    rng = np.random.default_rng(seed)
    logp0 = log_softmax(rng.normal(size=d))
    _, g, m = _tabular(d, logp0, beta)
    trace = design_trace(m, information_matrix(g, uniform_design(g.shape[0])), basis=centred_basis(d))
    pi0 = np.exp(logp0)
    assert trace == pytest.approx((d - 1) / beta * (1 - pi0 @ pi0), rel=1e-9)


@pytest.mark.parametrize("d", [3, 5])
def test_uniform_reference_makes_uniform_design_optimal(d: int) -> None:
    _, g, m = _tabular(d, np.full(d, -np.log(d)))
    ridge = 1e-6 * np.ones((d, d))
    res = frank_wolfe_design(g, m, ridge=ridge, tol=1e-9, max_iter=20000)
    assert res.status == "converged"
    assert np.abs(res.q - 1 / g.shape[0]).max() < 1e-3
    d_opt = solve_design_problem(build_design_problem(g, criterion="D", ridge=1e-2), solver="CLARABEL")
    assert np.abs(d_opt.q - 1 / g.shape[0]).max() < 1e-3


@given(seed=seeds, beta=st.floats(0.2, 5), c=st.floats(0.1, 10))
def test_criterion_scaling(seed: int, beta: float, c: float) -> None:
    rng = np.random.default_rng(seed)
    d = 4
    logp0 = log_softmax(rng.normal(size=d))
    q = _simplex(rng, d * (d - 1) // 2)
    basis = centred_basis(d)
    _, g1, m1 = _tabular(d, logp0, 1.0)
    _, gb, mb = _tabular(d, logp0, beta)
    t1 = design_trace(m1, information_matrix(g1, q), basis=basis)
    assert design_trace(mb, information_matrix(gb, q), basis=basis) == pytest.approx(t1 / beta, rel=1e-8)
    assert design_trace(c * m1, information_matrix(g1, q), basis=basis) == pytest.approx(c * t1, rel=1e-8)


def test_scaling_m_leaves_the_optimal_design_unchanged() -> None:
    rng = np.random.default_rng(3)
    g, root = rng.normal(size=(30, 4)), rng.normal(size=(4, 4))
    m = root @ root.T
    a = frank_wolfe_design(g, m, tol=1e-10, max_iter=20000)
    b = frank_wolfe_design(g, 7.0 * m, tol=1e-10, max_iter=20000)
    assert b.objective == pytest.approx(7.0 * a.objective, rel=1e-6)
    assert np.allclose(a.q, b.q, atol=1e-3)


@given(seed=seeds, beta=st.floats(0.1, 5))
def test_gap_identity(seed: int, beta: float) -> None:
    rng = np.random.default_rng(seed)
    logp0 = log_softmax(rng.normal(size=(3, 5)), axis=1)
    reward = rng.normal(size=(3, 5))
    logp_star = log_softmax(logp0 + reward / beta, axis=1)
    logp = log_softmax(rng.normal(size=(3, 5)), axis=1)
    direct = rlhf_objective(logp_star, logp0, reward, beta=beta) - rlhf_objective(logp, logp0, reward, beta=beta)
    assert direct == pytest.approx(float(rlhf_gap(logp, logp_star, beta=beta)), abs=1e-9)
    assert direct >= -1e-12
    assert float(rlhf_gap(logp_star, logp_star, beta=beta)) == pytest.approx(0.0, abs=1e-12)


@settings(max_examples=8)
@given(seed=seeds, d=st.integers(2, 6))
@example(seed=13389517, d=2)  # needs 28,610 iterations to certify tol 1e-7 (Frank-Wolfe's rate is sublinear)
def test_frank_wolfe_agrees_with_cvxpy(seed: int, d: int) -> None:
    rng = np.random.default_rng(seed)
    g, root = rng.normal(size=(15, d)), rng.normal(size=(d, d))
    m = root @ root.T + 0.1 * np.eye(d)
    fw = frank_wolfe_design(g, m, ridge=1e-2, tol=1e-7, max_iter=200_000)
    cvx = solve_design_problem(build_design_problem(g, m, ridge=1e-2), solver="CLARABEL")
    assert fw.objective == pytest.approx(cvx.objective, rel=1e-3)
    assert fw.status == "converged"  # the certificate below is the solver's own stopping test
    assert fw.duality_gap <= 1e-7 * fw.objective


def test_frank_wolfe_objective_never_increases() -> None:
    rng = np.random.default_rng(0)
    g = rng.normal(size=(40, 5))
    values = [frank_wolfe_design(g, tol=1e-14, max_iter=k).objective for k in range(1, 40)]
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(values))


def test_plug_in_weights_equal_oracle_weights_at_reference() -> None:
    g = np.random.default_rng(1).normal(size=(6, 3))
    assert np.allclose(fisher_weights(g, np.zeros(3)), fisher_weights(g))


def test_disconnected_design_has_infinite_criterion() -> None:
    d = 5
    edges, g, m = _tabular(d, np.full(d, -np.log(d)))
    q = np.array([1.0 if {a, b} <= {0, 1, 2} or {a, b} == {3, 4} else 0.0 for _, a, b in edges])
    sigma = information_matrix(g, q / q.sum())
    assert np.linalg.matrix_rank(sigma) < d - 1
    assert design_trace(m, sigma, basis=centred_basis(d)) == float("inf")
    assert np.isfinite(design_objective(q / q.sum(), g, m, ridge=1e-3))  # the ridge keeps A invertible


def test_non_optimal_status_raises() -> None:
    g = np.random.default_rng(0).normal(size=(5, 2))
    problem = build_design_problem(g, criterion="A", costs=np.full(5, 2.0))  # sum q c <= 1 is infeasible
    with pytest.raises(ConvergenceError, match="infeasible"):
        solve_design_problem(problem, solver="CLARABEL")


@given(seed=seeds, beta=st.floats(0.05, 2))
def test_dpo_loss_is_the_bradley_terry_likelihood_of_the_loglinear_logit(seed: int, beta: float) -> None:
    rng = np.random.default_rng(seed)
    phi = rng.normal(size=(1, 4, 3))
    logp0 = log_softmax(rng.normal(size=(1, 4)), axis=1)
    theta = rng.normal(size=3)
    logp = loglinear_logp(phi, theta / beta, logp0)[0]  # pi_theta with implicit reward beta * (theta/beta).phi
    t = torch.as_tensor
    loss, diag = dpo_loss(t(logp[[0]]), t(logp[[2]]), t(logp0[0, [0]]), t(logp0[0, [2]]), beta=beta)
    u = theta @ (phi[0, 0] - phi[0, 2])
    assert float(diag.margin[0]) == pytest.approx(u, rel=1e-9, abs=1e-12)
    assert float(loss[0]) == pytest.approx(np.logaddexp(0.0, -u), rel=1e-9)


@given(seed=seeds, eps=st.floats(0, 0.5))
def test_dpo_label_smoothing_is_the_expected_loss_under_flips(seed: int, eps: float) -> None:
    g = torch.Generator().manual_seed(seed)
    lp = [torch.randn(6, generator=g, dtype=torch.float64) for _ in range(4)]
    smooth, _ = dpo_loss(*lp, beta=0.3, label_smoothing=eps)
    plain, _ = dpo_loss(*lp, beta=0.3)
    flipped, _ = dpo_loss(lp[1], lp[0], lp[3], lp[2], beta=0.3)
    torch.testing.assert_close(smooth, (1 - eps) * plain + eps * flipped)
