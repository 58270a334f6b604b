r"""Pair selection for a DPO data pipeline: a completion pool in, the pairs to label out (docs: methods/dpo_design.md).

Steps: standardise the completion features (optionally PCA to ``pca_dim``), build all within-prompt
edges ``g_e = beta (phi_a - phi_b)``, estimate the curvature $\hat I(\theta_0)$ as the
$\pi_0$-weighted within-pool covariance of the features (weights from the reference sequence
log-probs renormalised over each prompt's pool; *implementation choice*, the paper's exact estimator
is not available), solve $\min_q\mathrm{tr}(\hat I A(q)^{-1})$ by Frank-Wolfe, and draw the
pairs without replacement proportionally to ``q`` (Efraimidis-Spirakis keys $u^{1/q_e}$,
seeded; edges with ``q_e = 0`` come last in random order). ``per_prompt=True`` normalises ``q``
within each prompt and draws ``n_pairs`` per prompt (response selection). ``max_per_prompt`` caps
the pairs drawn from one prompt in the global draw (the draw walks the without-replacement order
and skips the edges of a prompt that has reached its cap), against designs that concentrate on a
few prompts. ``design="uniform"`` draws from the uniform design over the same edges (the baseline).

Reference: Han, Goyal, Ma (2026), arXiv:2606.19607.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from posttrain.errors import DomainError
from posttrain.theory.dpo_design import (
    Array,
    as_array,
    edge_vectors,
    policy_curvature,
    uniform_design,
    within_prompt_pairs,
)
from posttrain.theory.dpo_design_solvers import DesignResult, design_objective, frank_wolfe_design

__all__ = ["SelectedPairs", "select_pairs", "standardise_features", "weighted_sample_without_replacement"]


@dataclass(frozen=True)
class SelectedPairs:
    """The pairs to send for labelling and what to log about the design."""

    edges: NDArray[np.int64]
    """``[N, 3]`` rows ``(prompt, a, b)`` in draw order."""
    weights: Array
    """``[N]`` design weight ``q_e`` of each selected edge."""
    design: DesignResult
    """The full design over all candidate edges (objective, FW gap, iterations)."""
    prompts_covered: float
    """Effective number of prompts: ``exp`` of the entropy of the per-prompt design mass."""
    uniform_objective: float = float("nan")
    r"""The criterion $\mathrm{tr}(\hat I A(q)^{-1})$ of the uniform design over the same edges."""


def standardise_features(phi: ArrayLike, *, pca_dim: int | None = None) -> Array:
    """Z-score every feature over all completions, then (optionally) project on the top ``pca_dim`` PCs.

    Args: phi ``[G, K, D]``. Returns ``[G, K, D']``.
    """
    f = as_array("phi", phi, 3)
    flat = f.reshape(-1, f.shape[-1])
    std = flat.std(axis=0)
    z = (flat - flat.mean(axis=0)) / np.where(std > 0, std, 1.0)
    if pca_dim is not None:
        if not 1 <= int(pca_dim) <= z.shape[1]:
            raise DomainError(f"pca_dim: expected 1..{z.shape[1]}, got {pca_dim}")
        _, _, vt = np.linalg.svd(z, full_matrices=False)
        z = z @ vt[: int(pca_dim)].T
    return np.asarray(z.reshape(*f.shape[:2], -1))


def weighted_sample_without_replacement(
    q: ArrayLike, n: int, *, rng: np.random.Generator, groups: ArrayLike | None = None
) -> NDArray[np.int64]:
    """Indices of ``n`` draws without replacement with probability proportional to ``q`` (per group if given).

    Efraimidis-Spirakis: keep the largest keys ``log(u) / q``; zero weights get key ``-inf`` and are
    ordered among themselves by a second uniform.
    """
    w = as_array("q", q, 1)
    u = rng.random(w.size)
    keys = np.where(w > 0, np.log(u) / np.where(w > 0, w, 1.0), -np.inf)
    tiebreak = rng.random(w.size)
    if groups is None:
        order = np.lexsort((-tiebreak, -keys))
        return order[: int(n)].astype(np.int64)
    grp = np.asarray(groups)
    order = np.lexsort((-tiebreak, -keys, grp))  # by group, then key descending
    rank = np.empty(w.size, dtype=np.int64)
    sorted_groups = grp[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_groups)) + 1]
    counts = np.diff(np.r_[starts, w.size])
    rank[order] = np.arange(w.size) - np.repeat(starts, counts)
    return np.flatnonzero(rank < int(n)).astype(np.int64)


def select_pairs(
    phi: ArrayLike,
    logp_ref: ArrayLike,
    n_pairs: int,
    *,
    beta: float = 0.1,
    ridge: float = 1e-3,
    pca_dim: int | None = None,
    per_prompt: bool = False,
    seed: int = 0,
    max_iter: int = 2000,
    tol: float = 1e-3,
    max_per_prompt: int | None = None,
    design: str = "optimal",
) -> SelectedPairs:
    r"""Choose which within-prompt pairs to label: the plug-in optimal design at the reference policy.

    Args:
        phi: ``[G, K, D]`` features of each completion (e.g. last-token hidden states of $\pi_0$).
        logp_ref: ``[G, K]`` reference sequence log-probs $\log\pi_0(y|x)$ of the pool.
        n_pairs: pairs to draw in total (``per_prompt=False``) or per prompt (``per_prompt=True``).
        beta: DPO temperature (paper: 0.1). ridge: $\lambda$ of $A(q)$ (paper: 1e-3).
        pca_dim: PCA dimension after standardising (paper: 128; ``None`` keeps all).
        per_prompt: response selection (normalise ``q`` within each prompt's ``C(K, 2)`` pairs).
        seed: seed of the without-replacement draw. max_iter, tol: Frank-Wolfe settings.
        max_per_prompt: at most this many pairs of one prompt (global draw only; ``None``: no cap).
        design: ``"optimal"`` (Frank-Wolfe) or ``"uniform"`` (``q_e = 1/E``, the baseline).

    Returns:
        `SelectedPairs`.

    Examples:
        >>> rng = np.random.default_rng(0)
        >>> out = select_pairs(rng.normal(size=(4, 3, 2)), np.zeros((4, 3)), 1, per_prompt=True)
        >>> sorted(out.edges[:, 0].tolist())
        [0, 1, 2, 3]
    """
    f = standardise_features(phi, pca_dim=pca_dim)
    num_prompts, k = f.shape[:2]
    edges = within_prompt_pairs(num_prompts, k)
    limit = k * (k - 1) // 2 if per_prompt else edges.shape[0]
    if not 1 <= int(n_pairs) <= limit:
        raise DomainError(f"n_pairs: expected 1..{limit}, got {n_pairs}")
    if design not in ("optimal", "uniform"):
        raise DomainError(f"design: expected 'optimal' or 'uniform', got {design!r}")
    if max_per_prompt is not None and (per_prompt or int(max_per_prompt) < 1):
        raise DomainError(f"max_per_prompt: expected None with per_prompt, else >= 1; got {max_per_prompt}")
    if max_per_prompt is not None and int(n_pairs) > num_prompts * min(int(max_per_prompt), k * (k - 1) // 2):
        raise DomainError(
            f"n_pairs: {n_pairs} pairs do not fit {num_prompts} prompts x max_per_prompt={max_per_prompt}"
        )
    g = edge_vectors(f, edges, beta=beta)
    m = policy_curvature(f, logp_ref, beta=beta)
    uniform = uniform_design(edges.shape[0])
    uniform_objective = design_objective(uniform, g, m, ridge=ridge)
    if design == "uniform":
        result = DesignResult(uniform, uniform_objective, "uniform", "none", 0, float("nan"))
    else:
        result = frank_wolfe_design(g, m, ridge=ridge, max_iter=max_iter, tol=tol)
    q = result.q
    mass = np.bincount(edges[:, 0], weights=q, minlength=num_prompts)
    nz = mass[mass > 0]
    covered = float(np.exp(-np.sum(nz * np.log(nz))))
    rng = np.random.default_rng(seed)
    if per_prompt:
        q_local = np.where(mass[edges[:, 0]] > 0, q / np.where(mass > 0, mass, 1.0)[edges[:, 0]], 1.0 / limit)
        idx = weighted_sample_without_replacement(q_local, int(n_pairs), rng=rng, groups=edges[:, 0])
    elif max_per_prompt is None:
        idx = weighted_sample_without_replacement(q, int(n_pairs), rng=rng)
    else:  # the whole draw order, then each prompt's first max_per_prompt edges in it
        order = weighted_sample_without_replacement(q, edges.shape[0], rng=rng)
        prompt = edges[order, 0]
        by_prompt = np.argsort(prompt, kind="stable")
        starts = np.searchsorted(prompt[by_prompt], prompt[by_prompt], side="left")
        rank = np.empty(order.size, dtype=np.int64)
        rank[by_prompt] = np.arange(order.size) - starts  # position of each drawn edge within its prompt
        idx = order[rank < int(max_per_prompt)][: int(n_pairs)]
    return SelectedPairs(edges[idx], q[idx], result, covered, uniform_objective)
