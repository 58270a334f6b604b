r"""Comparison curation for DPO as optimal experimental design (Han, Goyal, Ma 2026).

Which within-prompt pairs should be labelled? For a log-linear policy
$\pi_\theta(y|x)\propto\pi_0(y|x)e^{\theta^\top\phi(x,y)}$ trained by DPO on ``n`` labels drawn
from a design ``q`` over candidate edges, the RLHF gap is of order $\tfrac1n\mathrm{tr}(I\Sigma_q^\dagger)$
(upper bound for DPO, Van Trees lower bound for any estimator), with

- the per-label information $\Sigma_q(\theta)=\sum_e q_e\,\sigma'(g_e^\top\theta)\,g_eg_e^\top$,
  $g_e=\beta(\phi(x,y_a)-\phi(x,y_b))$ (`information_matrix`);
- the policy curvature $I(\theta)=\tfrac\beta2\mathbb E_x\mathrm{Cov}_{\pi_\theta(\cdot|x)}[\phi]$
  (`policy_curvature`, *reconstructed normalisation*: it makes ``n * gap -> trace`` with
  constant 1);
- the pseudo-inverse taken on the identifiable subspace (`identifiable_basis`,
  `design_trace`, which returns ``inf`` for a design that does not cover it).

The bounds (`gap_upper_bound`, the Van Trees lower bounds) live in `posttrain.theory.dpo_design_bounds`,
solvers for the optimal design in `posttrain.theory.dpo_design_solvers`, the data pipeline (pool in,
selected pairs out) in `posttrain.theory.dpo_pair_selection`.
Arrays are float64 numpy; dimensions: ``G`` prompts, ``K`` completions per prompt, ``D`` features,
``E`` candidate edges (rows ``(prompt, a, b)``).

Reference: Han, Goyal, Ma (2026), "Which Pairs to Compare for LLM Post-Training?", arXiv:2606.19607.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import expit, log_softmax

from posttrain.errors import DomainError, ShapeError
from posttrain.validate import check_positive

__all__ = [
    "centred_basis",
    "design_trace",
    "edge_vectors",
    "fisher_weights",
    "identifiable_basis",
    "information_matrix",
    "loglinear_logp",
    "policy_curvature",
    "reference_pair_design",
    "rlhf_gap",
    "rlhf_objective",
    "uniform_design",
    "within_prompt_pairs",
]

Array = NDArray[np.float64]


def as_array(name: str, x: ArrayLike, ndim: int | tuple[int, ...]) -> Array:
    """``x`` as a finite float64 array of the given rank(s); errors name the argument."""
    a = np.asarray(x, dtype=np.float64)
    allowed = (ndim,) if isinstance(ndim, int) else ndim
    if a.ndim not in allowed:
        raise ShapeError(f"{name}: expected rank {' or '.join(map(str, allowed))}, got shape {list(a.shape)}")
    if not np.all(np.isfinite(a)):
        raise DomainError(f"{name}: expected finite values, found {int((~np.isfinite(a)).sum())} non-finite")
    return a


def check_simplex(name: str, q: ArrayLike, size: int, *, atol: float = 1e-8) -> Array:
    """``q`` as a probability vector of length ``size`` (non-negative, sums to 1)."""
    a = as_array(name, q, 1)
    if a.shape[0] != size:
        raise ShapeError(f"{name}: expected shape [{size}], got {list(a.shape)}")
    if np.any(a < -atol) or abs(a.sum() - 1.0) > 1e-6:
        raise DomainError(f"{name}: expected a probability vector (q >= 0, sum 1), got sum {a.sum():.6g}")
    return np.clip(a, 0.0, None)


def within_prompt_pairs(num_prompts: int, k: int) -> NDArray[np.int64]:
    """All unordered within-prompt pairs: ``[E, 3]`` rows ``(prompt, a, b)`` with ``a < b``, ``E = G*C(K,2)``.

    Examples:
        >>> within_prompt_pairs(1, 3).tolist()
        [[0, 0, 1], [0, 0, 2], [0, 1, 2]]
    """
    if int(num_prompts) < 1 or int(k) < 2:
        raise DomainError(f"num_prompts, k: expected >= 1 and >= 2, got {num_prompts}, {k}")
    a, b = np.triu_indices(int(k), 1)
    x = np.repeat(np.arange(int(num_prompts)), a.size)
    return np.stack([x, np.tile(a, num_prompts), np.tile(b, num_prompts)], axis=1).astype(np.int64)


def _check_edges(edges: ArrayLike, g_shape: tuple[int, ...]) -> NDArray[np.int64]:
    e = np.asarray(edges)
    if e.ndim != 2 or e.shape[1] != 3 or not np.issubdtype(e.dtype, np.integer):
        raise ShapeError(f"edges: expected an integer array [E, 3] of (prompt, a, b), got {e.dtype} {list(e.shape)}")
    num_prompts, k = g_shape[0], g_shape[1]
    if e.size and (e.min() < 0 or e[:, 0].max() >= num_prompts or e[:, 1:].max() >= k):
        raise DomainError(f"edges: indices out of range for {num_prompts} prompts x {k} completions")
    return e.astype(np.int64)


def edge_vectors(phi: ArrayLike, edges: ArrayLike, *, beta: float = 1.0) -> Array:
    r"""Edge sensitivity vectors $g_e = \beta(\phi(x,y_a)-\phi(x,y_b))$ (the gradient of the DPO logit).

    Args:
        phi: ``[G, K, D]`` features of each completion (tabular: one-hot, ``G = 1``).
        edges: ``[E, 3]`` integer rows ``(prompt, a, b)``.
        beta: DPO temperature, > 0.

    Returns:
        ``[E, D]``.

    Examples:
        >>> edge_vectors(np.eye(3)[None], np.array([[0, 0, 2]]), beta=2.0).tolist()
        [[2.0, 0.0, -2.0]]
    """
    f = as_array("phi", phi, 3)
    beta = check_positive("beta", beta)
    e = _check_edges(edges, f.shape)
    return beta * (f[e[:, 0], e[:, 1]] - f[e[:, 0], e[:, 2]])


def fisher_weights(g: ArrayLike, theta: ArrayLike | None = None) -> Array:
    r"""Per-edge Bradley-Terry Fisher weights $\sigma'(u_e)=\sigma(u_e)(1-\sigma(u_e))$, $u_e=g_e^\top\theta$.

    ``theta=None`` is the reference parameter (all implicit rewards 0, weight 1/4); ``theta`` ``[D]``
    gives ``[E]``, a batch ``[N, D]`` gives ``[N, E]``.

    Examples:
        >>> fisher_weights(np.ones((2, 1))).tolist()
        [0.25, 0.25]
    """
    gg = as_array("g", g, 2)
    if theta is None:
        return np.full(gg.shape[0], 0.25)
    t = as_array("theta", theta, (1, 2))
    if t.shape[-1] != gg.shape[1]:
        raise ShapeError(f"theta: expected shape [..., {gg.shape[1]}] (D of g), got {list(t.shape)}")
    s = expit(t @ gg.T)
    return np.asarray(s * (1.0 - s))


def information_matrix(g: ArrayLike, q: ArrayLike, *, theta: ArrayLike | None = None) -> Array:
    r"""Per-label information of a design: $\Sigma_q(\theta)=\sum_e q_e\,\sigma'(g_e^\top\theta)\,g_eg_e^\top$.

    Symmetric PSD and linear in ``q``. For an empirical multiset of labelled edges pass the rows of
    the multiset and ``q = 1/n`` (the average of per-label rank-one terms).

    Args:
        g: ``[E, D]`` edge vectors (`edge_vectors`).
        q: ``[E]`` design weights on the simplex.
        theta: ``[D]`` parameter at which the Fisher weights are taken (``None``: reference, 1/4), or
            ``[N, D]`` (one matrix per row).

    Returns:
        ``[D, D]`` (``[N, D, D]`` for a batch of ``theta``).

    Examples:
        >>> information_matrix(np.array([[1.0, -1.0]]), np.array([1.0])).tolist()
        [[0.25, -0.25], [-0.25, 0.25]]
    """
    gg = as_array("g", g, 2)
    qq = check_simplex("q", q, gg.shape[0])
    w = qq * fisher_weights(gg, theta)  # [..., E]
    out = np.swapaxes(w[..., None] * gg, -1, -2) @ gg
    return np.asarray(0.5 * (out + np.swapaxes(out, -1, -2)))


def loglinear_logp(phi: ArrayLike, theta: ArrayLike, logp_ref: ArrayLike) -> Array:
    r"""Log-probs of the log-linear policy $\log\pi_\theta(y|x)=\log\pi_0(y|x)+\theta^\top\phi(x,y)-\log Z_\theta(x)$.

    Args:
        phi: ``[G, K, D]``; theta: ``[D]`` or ``[N, D]`` (a batch); logp_ref: ``[G, K]`` (renormalised).

    Returns:
        ``[G, K]`` (or ``[N, G, K]``), each row normalised over the ``K`` completions.
    """
    f = as_array("phi", phi, 3)
    t = as_array("theta", theta, (1, 2))
    l0 = as_array("logp_ref", logp_ref, 2)
    if l0.shape != f.shape[:2] or t.shape[-1] != f.shape[2]:
        raise ShapeError(f"logp_ref/theta: expected [G, K] = {list(f.shape[:2])} and [..., {f.shape[2]}]")
    logits = l0 + np.einsum("gkd,...d->...gk", f, t)
    return np.asarray(log_softmax(logits, axis=-1))


def _prompt_weights(prompt_weights: ArrayLike | None, num_prompts: int) -> Array:
    if prompt_weights is None:
        return np.full(num_prompts, 1.0 / num_prompts)
    return check_simplex("prompt_weights", prompt_weights, num_prompts)


def policy_curvature(
    phi: ArrayLike, logp: ArrayLike, *, beta: float = 1.0, prompt_weights: ArrayLike | None = None
) -> Array:
    r"""Policy curvature $I(\theta)=\tfrac\beta2\sum_x\rho_x\,\mathrm{Cov}_{y\sim\pi_\theta(\cdot|x)}[\phi(x,y)]$.

    *Reconstructed normalisation* (second-order expansion of $\beta\,\mathrm{KL}(\pi_\theta\|\pi_{\theta^*})$);
    the paper absorbs constants into its bounds. Tabular (``phi = I``): $\tfrac\beta2(\mathrm{diag}\,\pi-\pi\pi^\top)$.

    Args:
        phi: ``[G, K, D]`` completion features.
        logp: ``[G, K]`` log-probs of $\pi_\theta$ over each prompt's pool (renormalised here), or
            ``[N, G, K]`` (one policy per row).
        beta: KL strength, > 0.
        prompt_weights: ``[G]`` prompt distribution $\rho$ (default uniform).

    Returns:
        ``[D, D]`` symmetric PSD (``[N, D, D]`` for a batch).

    Examples:
        >>> policy_curvature(np.eye(2)[None], np.log([[0.5, 0.5]]), beta=2.0).tolist()
        [[0.25, -0.25], [-0.25, 0.25]]
    """
    f = as_array("phi", phi, 3)
    lp = as_array("logp", logp, (2, 3))
    if lp.shape[-2:] != f.shape[:2]:
        raise ShapeError(
            f"logp: expected shape [..., {f.shape[0]}, {f.shape[1]}] ([G, K] of phi), got {list(lp.shape)}"
        )
    beta = check_positive("beta", beta)
    rho = _prompt_weights(prompt_weights, f.shape[0])
    pi = np.exp(log_softmax(lp, axis=-1))  # [..., G, K]
    centred = f - np.einsum("...gk,gkd->...gd", pi, f)[..., None, :]  # [..., G, K, D]
    cov = np.einsum("g,...gk,...gkd,...gke->...de", rho, pi, centred, centred, optimize=True)
    return np.asarray(0.5 * beta * 0.5 * (cov + np.swapaxes(cov, -1, -2)))


def identifiable_basis(g: ArrayLike, *, rtol: float = 1e-10) -> Array:
    """Orthonormal basis ``[D, r]`` of the span of the candidate edge vectors (the identifiable subspace).

    Directions orthogonal to every ``g_e`` leave every DPO logit unchanged and cannot be learned.

    Examples:
        >>> identifiable_basis(np.array([[1.0, -1.0], [2.0, -2.0]])).shape
        (2, 1)
    """
    gg = as_array("g", g, 2)
    _, s, vt = np.linalg.svd(gg, full_matrices=False)
    if s.size == 0 or s[0] == 0.0:
        raise DomainError("g: every edge vector is zero; nothing is identifiable")
    return np.asarray(vt[s > rtol * s[0]].T)


def centred_basis(d: int) -> Array:
    """Orthonormal basis ``[d, d-1]`` of the sum-zero subspace (the identifiable subspace of a tabular policy)."""
    if int(d) < 2:
        raise DomainError(f"d: expected >= 2, got {d}")
    q, _ = np.linalg.qr(np.eye(int(d))[:, 1:] - 1.0 / d)
    return np.asarray(q)


def design_trace(
    M: ArrayLike, sigma: ArrayLike, *, basis: ArrayLike | None = None, rtol: float = 1e-9
) -> float | Array:
    r"""The bound's criterion $\mathrm{tr}(M\,\Sigma^\dagger)$ on the identifiable subspace ``U``.

    Computed as $\mathrm{tr}\big((U^\top MU)(U^\top\Sigma U)^{-1}\big)$. Returns ``inf`` when
    $U^\top\Sigma U$ is singular (the design does not cover the identifiable subspace; tabular:
    the comparison graph is disconnected).

    Args:
        M: ``[D, D]`` PSD weight (the policy curvature ``I``), or ``[N, D, D]``.
        sigma: ``[D, D]`` design information, or ``[N, D, D]``.
        basis: ``[D, r]`` orthonormal basis (default: all of ``R^D``).
        rtol: eigenvalues below ``rtol * max`` count as zero.

    Returns:
        A float, or ``[N]`` when either matrix is batched.

    Examples:
        >>> design_trace(np.eye(2), np.diag([2.0, 4.0]))
        0.75
        >>> design_trace(np.eye(2), np.diag([2.0, 0.0]))
        inf
    """
    m = as_array("M", M, (2, 3))
    s = as_array("sigma", sigma, (2, 3))
    d = m.shape[-1]
    if m.shape[-2:] != (d, d) or s.shape[-2:] != (d, d):
        raise ShapeError(f"M, sigma: expected square [..., D, D] of equal size, got {list(m.shape)}, {list(s.shape)}")
    u = np.eye(d) if basis is None else as_array("basis", basis, 2)
    if u.shape[0] != d:
        raise ShapeError(f"basis: expected shape [{d}, r], got {list(u.shape)}")
    su = u.T @ s @ u
    evals, evecs = np.linalg.eigh(0.5 * (su + np.swapaxes(su, -1, -2)))  # [..., r], [..., r, r]
    mu = np.swapaxes(evecs, -1, -2) @ (u.T @ m @ u) @ evecs
    singular = (evals[..., -1] <= 0.0) | (evals[..., 0] <= rtol * evals[..., -1]) if evals.shape[-1] else True
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(singular, np.inf, np.sum(np.diagonal(mu, axis1=-2, axis2=-1) / evals, axis=-1))
    return float(out) if m.ndim == 2 and s.ndim == 2 else np.asarray(out, dtype=np.float64)


def rlhf_objective(
    logp: ArrayLike,
    logp_ref: ArrayLike,
    rewards: ArrayLike,
    *,
    beta: float,
    prompt_weights: ArrayLike | None = None,
) -> float:
    r"""$J(\pi)=\mathbb E_x[\mathbb E_{y\sim\pi}r(x,y)-\beta\,\mathrm{KL}(\pi(\cdot|x)\|\pi_0(\cdot|x))]$ over finite pools.

    Args: ``logp``, ``logp_ref``, ``rewards``: ``[G, K]``; beta > 0; prompt_weights ``[G]``.
    """
    lp, l0, r = as_array("logp", logp, 2), as_array("logp_ref", logp_ref, 2), as_array("rewards", rewards, 2)
    if not lp.shape == l0.shape == r.shape:
        raise ShapeError(
            f"logp, logp_ref, rewards: expected equal [G, K] shapes, got {lp.shape}, {l0.shape}, {r.shape}"
        )
    lp, l0 = log_softmax(lp, axis=1), log_softmax(l0, axis=1)
    pi = np.exp(lp)
    per_prompt = np.sum(pi * (r - check_positive("beta", beta) * (lp - l0)), axis=1)
    return float(_prompt_weights(prompt_weights, lp.shape[0]) @ per_prompt)


def rlhf_gap(logp: ArrayLike, logp_star: ArrayLike, *, beta: float, prompt_weights: ArrayLike | None = None) -> Array:
    r"""Exact RLHF gap $J(\pi^*)-J(\pi)=\beta\,\mathbb E_x\mathrm{KL}(\pi(\cdot|x)\|\pi^*(\cdot|x))\ge0$.

    Args:
        logp: ``[..., G, K]`` log-probs of $\pi$ (a leading batch is allowed).
        logp_star: ``[G, K]`` log-probs of $\pi^*\propto\pi_0e^{r^*/\beta}$.

    Returns:
        ``[...]`` gaps (0-d array without a batch).

    Examples:
        >>> float(rlhf_gap(np.log([[0.5, 0.5]]), np.log([[0.5, 0.5]]), beta=1.0))
        0.0
    """
    lp = log_softmax(np.asarray(logp, dtype=np.float64), axis=-1)
    ls = log_softmax(as_array("logp_star", logp_star, 2), axis=-1)
    if lp.shape[-2:] != ls.shape:
        raise ShapeError(f"logp: expected trailing shape {list(ls.shape)}, got {list(lp.shape)}")
    kl = np.sum(np.exp(lp) * (lp - ls), axis=-1)  # [..., G]
    return np.asarray(check_positive("beta", beta) * (kl @ _prompt_weights(prompt_weights, ls.shape[0])))


def uniform_design(num_edges: int) -> Array:
    """The uniform design ``q_e = 1/E``."""
    if int(num_edges) < 1:
        raise DomainError(f"num_edges: expected >= 1, got {num_edges}")
    return np.full(int(num_edges), 1.0 / int(num_edges))


def reference_pair_design(edges: ArrayLike, logp_ref: ArrayLike) -> Array:
    r"""The $\pi_0$-weighted heuristic $q_e\propto\pi_0(y_a|x)\pi_0(y_b|x)$ (*reconstructed form*).

    Examples:
        >>> reference_pair_design(within_prompt_pairs(1, 3), np.log([[0.5, 0.25, 0.25]])).round(3).tolist()
        [0.4, 0.4, 0.2]
    """
    l0 = log_softmax(as_array("logp_ref", logp_ref, 2), axis=1)
    e = _check_edges(edges, l0.shape)
    logw = l0[e[:, 0], e[:, 1]] + l0[e[:, 0], e[:, 2]]
    w = np.exp(logw - logw.max())
    return np.asarray(w / w.sum())
