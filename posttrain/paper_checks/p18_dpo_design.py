"""Paper 18 — which pairs to compare: the plug-in optimal design beats uniform pair sampling for DPO.

Claim (Han, Goyal, Ma 2026, "Which Pairs to Compare for LLM Post-Training?", arXiv:2606.19607):
the RLHF gap of DPO trained on ``n`` labels from a design ``q`` behaves as
``tr(I(theta*) Sigma_q(theta*)^+) / n``; the design minimising that trace at the reference parameter
(plug-in ``D*(theta_0)``) needs far fewer labels than uniform pairs, and the ``pi_0``-weighted
heuristic is worst. The bound's trace orders the designs as the empirical gaps do.

Toy (docs: methods/dpo_design.md), exactly realizable: one prompt, ``d = 20`` completions, ``pi_0(k) ~ k^-2``,
``beta = 1``, ``theta* ~ N(0, 0.3^2 I)`` centred; edges = all 190 pairs, ``g_e = beta (e_a - e_b)``.
Designs: plug-in (Frank-Wolfe on ``tr(I(0) A(q)^-1)``, ``A = Sigma_q + 1e-6 11^T``, 1,500 iterations),
uniform, ``pi_0``-pair heuristic. Labels: ``n`` i.i.d. edges from ``q``, Bradley-Terry outcomes. DPO
fit: ridge-1 logistic MLE on the aggregated edge counts (Newton, batched over seeds x replicates x
designs x budgets). Metric: exact gap ``beta KL(pi_hat || pi*)``.

Simplifications: the normalisation of ``I`` is our reconstruction (constant 1 in
``n gap ~ trace``); the oracle design ``D*(theta*)`` is not run; seeds are draws of ``theta*``, each
averaged over ``replicates`` label sets.

Criterion 3 (the trace ordering of the three designs equals the empirical ordering of the gaps)
is judged pair by pair on per-seed paired differences oriented by the predicted order. The pairs
involving the plug-in design are asserted. The uniform vs ``pi_0``-pair pair is reported only: on
this toy the two traces differ by ~3% (about 11.4 vs 11.8, a predicted n-gap difference of ~0.4),
while the paired standard error of the measured n-gap difference is ~0.7 at 20 seeds x 10
replicates (~0.5 at 40 seeds), so the simulation cannot resolve that ordering at this size; the
check prints the predicted and measured differences side by side with the measured standard error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import log_softmax

from posttrain.paper_checks import register_check
from posttrain.paper_checks.base import Comparison, Metric, PaperCheck, Result, fraction_criterion, mean_criterion
from posttrain.theory.dpo_design import (
    centred_basis,
    design_trace,
    edge_vectors,
    information_matrix,
    policy_curvature,
    reference_pair_design,
    uniform_design,
    within_prompt_pairs,
)
from posttrain.theory.dpo_design_solvers import frank_wolfe_design

DESIGNS = ("plug-in", "uniform", "pi0-pair")


@dataclass(frozen=True)
class Config:
    d: int = 20
    zipf_alpha: float = 2.0
    beta: float = 1.0
    theta_std: float = 0.3
    budgets: tuple[int, ...] = (500, 2000, 8000)
    seeds: int = 20
    replicates: int = 10
    fw_iters: int = 1500
    null_ridge: float = 1e-6
    fit_ridge: float = 1.0
    newton_iters: int = 100
    ratio_threshold: float = 0.75
    win_fraction: float = 0.8
    rate_band: tuple[float, float] = (0.7, 1.4)
    seed: int = 0

    @classmethod
    def smoke(cls) -> Config:
        return cls(budgets=(2000, 8000), seeds=10, replicates=10)


def _fit_dpo(counts: np.ndarray, wins: np.ndarray, g: np.ndarray, *, ridge: float, iters: int) -> np.ndarray:
    """Ridge logistic MLE of theta from aggregated edge counts, batched: counts/wins ``[..., E]`` -> ``[..., D]``."""
    theta = np.zeros((*counts.shape[:-1], g.shape[1]))
    eye = np.eye(g.shape[1])
    for _ in range(iters):
        u = theta @ g.T
        p = 1.0 / (1.0 + np.exp(-u))
        grad = (counts * p - wins) @ g + ridge * theta
        hess = np.einsum("...e,ed,ef->...df", counts * p * (1.0 - p), g, g) + ridge * eye
        step = np.linalg.solve(hess, grad[..., None])[..., 0]
        theta = theta - step
        if np.max(np.abs(step)) < 1e-10:
            break
    return theta


def run(config: Config) -> Result:
    rng = np.random.default_rng(config.seed)
    d, beta = config.d, config.beta
    logp0 = np.log(np.arange(1, d + 1, dtype=np.float64) ** -config.zipf_alpha)[None]
    logp0 = log_softmax(logp0, axis=1)
    phi = np.eye(d)[None]
    edges = within_prompt_pairs(1, d)
    g = edge_vectors(phi, edges, beta=beta)
    num_edges = g.shape[0]
    plug = frank_wolfe_design(
        g,
        policy_curvature(phi, logp0, beta=beta),
        ridge=config.null_ridge * np.ones((d, d)),
        max_iter=config.fw_iters,
        tol=1e-9,
    )
    designs = np.stack([plug.q, uniform_design(num_edges), reference_pair_design(edges, logp0)])  # [3, E]

    theta = rng.normal(0.0, config.theta_std, size=(config.seeds, d))
    theta -= theta.mean(axis=1, keepdims=True)  # [S, D]
    basis = centred_basis(d)
    logp_star = log_softmax(logp0 + theta, axis=1)  # [S, D]
    traces = np.array(
        [
            [
                design_trace(
                    policy_curvature(phi, logp_star[s][None], beta=beta),
                    information_matrix(g, q, theta=theta[s]),
                    basis=basis,
                )
                for q in designs
            ]
            for s in range(config.seeds)
        ]
    )  # [S, 3] (a 60-entry table of 20x20 eigen-solves)

    budgets = np.asarray(config.budgets)
    shape = (config.seeds, len(DESIGNS), budgets.size, config.replicates)
    counts = np.empty((*shape, num_edges))
    for i, q in enumerate(designs):
        for j, n in enumerate(budgets):
            counts[:, i, j] = rng.multinomial(int(n), q, size=(config.seeds, config.replicates))
    p_win = 1.0 / (1.0 + np.exp(-(theta @ g.T)))  # [S, E]
    wins = rng.binomial(counts.astype(np.int64), p_win[:, None, None, None, :]).astype(np.float64)
    theta_hat = _fit_dpo(counts, wins, g, ridge=config.fit_ridge, iters=config.newton_iters)
    logp_hat = log_softmax(logp0 + theta_hat, axis=-1)  # [S, 3, J, R, D]
    kl = np.sum(np.exp(logp_hat) * (logp_hat - logp_star[:, None, None, None, :]), axis=-1)
    gap = beta * kl.mean(axis=-1)  # [S, 3, J]: beta KL(pi_hat || pi*), the exact RLHF gap (rlhf_gap per seed)
    n_gap = gap * budgets  # [S, 3, J]

    metrics: list[Metric] = []
    for i, name in enumerate(DESIGNS):
        metrics.append(Metric(f"trace tr(I Sigma^+) ({name})", tuple(traces[:, i])))
        for j, n in enumerate(budgets):
            metrics.append(Metric(f"n*gap ({name}, n={n})", tuple(n_gap[:, i, j])))
    last = budgets.size - 1
    comparisons: list[Comparison] = []
    for j, n in enumerate(budgets):
        if n < 2000:
            continue
        comparisons.append(
            mean_criterion(
                f"{config.ratio_threshold} * uniform - plug-in n*gap (n={n})",
                config.ratio_threshold * n_gap[:, 1, j] - n_gap[:, 0, j],
                margin=0.0,
                reason="criterion 1: mean gap ratio plug-in/uniform <= 0.75, as a paired difference",
            )
        )
    comparisons.append(
        fraction_criterion(
            f"uniform - plug-in n*gap (n={budgets[-1]})",
            n_gap[:, 1, last] - n_gap[:, 0, last],
            fraction=config.win_fraction,
            reason="criterion 2: plug-in better on >= 80% of theta* draws",
        )
    )
    order = np.argsort(traces.mean(axis=0))  # predicted: smallest trace first
    resolution: list[str] = []
    for a_pos, b_pos in ((0, 1), (0, 2), (1, 2)):
        a, b = int(order[a_pos]), int(order[b_pos])  # trace_a < trace_b predicted
        resolvable = DESIGNS[a] == "plug-in" or DESIGNS[b] == "plug-in"
        measured = n_gap[:, b, last] - n_gap[:, a, last]
        predicted = traces[:, b] - traces[:, a]
        se = float(measured.std(ddof=1) / np.sqrt(measured.size)) if measured.size > 1 else float("nan")
        metrics.append(
            Metric(
                f"predicted n*gap difference, trace {DESIGNS[b]} - {DESIGNS[a]}",
                tuple(predicted),
                note="exact per theta* draw (the bound's trace)",
            )
        )
        comparisons.append(
            mean_criterion(
                f"n*gap {DESIGNS[b]} - {DESIGNS[a]} (n={budgets[-1]}), predicted order",
                measured,
                margin=0.0,
                reason=(
                    "criterion 3: the empirical gap ordering follows the trace ordering"
                    if resolvable
                    else "criterion 3, reported: the two traces are too close for the simulation to order"
                ),
                asserted=resolvable,
            )
        )
        if not resolvable:
            resolution.append(
                f"criterion 3, {DESIGNS[b]} vs {DESIGNS[a]} (reported): predicted n*gap difference "
                f"{predicted.mean():.3g} ({predicted.mean() / traces[:, a].mean():.1%} of the smaller trace), "
                f"measured {measured.mean():.3g} +- {se:.3g} (standard error over {measured.size} seeds)"
            )
    lo, hi = config.rate_band
    for i, name in enumerate(DESIGNS):
        ratio = n_gap[:, i, last] / traces[:, i]
        metrics.append(Metric(f"n*gap / trace ({name}, n={budgets[-1]})", tuple(ratio), paper_value=1.0))
        comparisons.append(
            mean_criterion(
                f"n*gap/trace - {lo} ({name})", ratio - lo, margin=0.0, reason="criterion 4 (1/n rate), low end"
            )
        )
        comparisons.append(
            mean_criterion(
                f"{hi} - n*gap/trace ({name})", hi - ratio, margin=0.0, reason="criterion 4 (1/n rate), high end"
            )
        )
    series = {
        "n * RLHF gap vs labels": {
            "x": budgets.tolist(),
            "lines": {name: n_gap[:, i].mean(axis=0).tolist() for i, name in enumerate(DESIGNS)},
            "xlabel": "labels n",
            "ylabel": "n * E[gap]",
            "logx": True,
        }
    }
    solver = f"plug-in Frank-Wolfe: {plug.iterations} iterations, status {plug.status}, gap {plug.duality_gap:.2e}"
    notes = "\n".join([solver, *resolution])
    return Result(tuple(metrics), tuple(comparisons), notes=notes, extra={"series": series})


register_check(
    PaperCheck(
        id="18",
        paper="Han, Goyal, Ma 2026, Which Pairs to Compare for LLM Post-Training?, arXiv:2606.19607",
        claim=(
            "plug-in optimal pair design halves the DPO RLHF gap vs uniform pairs; tr(I Sigma^+)/n predicts "
            "every design's gap and the plug-in design's rank"
        ),
        reported_claim="the uniform vs pi0-pair ordering (traces ~3% apart) is not resolvable at this size: reported",
        config_type=Config,
        run=run,
    )
)
