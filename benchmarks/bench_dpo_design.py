"""Benchmark: Frank-Wolfe optimal pair design (paper 18) vs the cvxpy convex program, side by side.

Pool: ``prompts x C(K, 2)`` within-prompt pairs (default 1,000 x C(5, 2) = 10,000 edges) with
``D = 64`` standardised features (decaying spectrum), ``g_e = beta (phi_a - phi_b)``, ``beta = 0.1``,
curvature ``M = I(theta_0)`` from random reference log-probs, ridge ``1e-3`` (the paper's values).
Both sides minimise ``tr(M A(q)^-1)`` over the simplex: Frank-Wolfe with away steps (stopped at a
relative duality gap ``--tol``, which bounds its suboptimality) and cvxpy ``matrix_frac`` with
``--solver`` (SCS by default). Prints both objectives, their relative difference and the time
ratio. Targets (issue 8): FW objective within 1% of cvxpy's and >= 10x faster. Wall-clock times;
BLAS/OpenMP/MKL are pinned to one thread for both sides (set before numpy loads; on a shared machine
multi-threaded BLAS on 64 x 64 matrices mostly waits for cores). The exit status is 0 either way:
this is a measurement.

Run: ``python -m benchmarks.bench_dpo_design [--prompts 1000 --k 5 --d 64]`` (``--small``: 60 x 5, d = 8).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from scipy.special import log_softmax  # noqa: E402

from posttrain.theory.dpo_design import edge_vectors, policy_curvature, within_prompt_pairs  # noqa: E402
from posttrain.theory.dpo_design_solvers import (  # noqa: E402
    build_design_problem,
    frank_wolfe_design,
    solve_design_problem,
)

TARGET_SPEEDUP = 10.0
TARGET_GAP = 0.01


def make_pool(prompts: int, k: int, d: int, *, beta: float = 0.1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Edge vectors ``[E, D]`` and curvature ``[D, D]`` of a synthetic completion pool."""
    rng = np.random.default_rng(seed)
    scales = 1.0 / np.sqrt(np.arange(1, d + 1))
    phi = rng.standard_normal((prompts, k, d)) * scales + rng.standard_normal((prompts, 1, d))
    phi = (phi - phi.mean(axis=(0, 1))) / phi.std(axis=(0, 1))
    logp = log_softmax(2.0 * rng.standard_normal((prompts, k)), axis=1)
    g = edge_vectors(phi, within_prompt_pairs(prompts, k), beta=beta)
    return g, policy_curvature(phi, logp, beta=beta)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_dpo_design", description=__doc__)
    p.add_argument("--prompts", type=int, default=1000)
    p.add_argument("--k", type=int, default=5, help="completions per prompt (C(k, 2) edges each)")
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--ridge", type=float, default=1e-3)
    p.add_argument("--tol", type=float, default=TARGET_GAP, help="FW relative duality-gap stop")
    p.add_argument("--solver", default="SCS")
    p.add_argument("--eps", type=float, default=1e-5, help="SCS eps_abs = eps_rel")
    p.add_argument("--small", action="store_true")
    args = p.parse_args(argv)
    prompts, d = (60, 8) if args.small else (args.prompts, args.d)
    g, m = make_pool(prompts, args.k, d)
    print(f"pool: {g.shape[0]} edges, D = {d}, ridge = {args.ridge}, solver = {args.solver}", flush=True)

    t0 = time.perf_counter()
    fw = frank_wolfe_design(g, m, ridge=args.ridge, tol=args.tol, max_iter=100_000)
    t_fw = time.perf_counter() - t0
    print(
        f"frank-wolfe: objective {fw.objective:.6g}, {fw.iterations} iterations ({fw.status}), "
        f"relative FW gap {fw.duality_gap / fw.objective:.2e}, support {(fw.q > 0).sum()}, {t_fw:.2f} s",
        flush=True,
    )

    options = {"eps_abs": args.eps, "eps_rel": args.eps} if args.solver.upper() == "SCS" else {}
    t0 = time.perf_counter()
    cvx = solve_design_problem(build_design_problem(g, m, ridge=args.ridge), solver=args.solver, **options)
    t_cvx = time.perf_counter() - t0
    print(
        f"cvxpy/{cvx.solver}: objective {cvx.objective:.6g} ({cvx.status}), {cvx.iterations} iterations, "
        f"{t_cvx:.2f} s (build + compile + solve)",
        flush=True,
    )

    rel = (fw.objective - cvx.objective) / cvx.objective
    speedup = t_cvx / t_fw
    print(f"FW objective vs cvxpy: {rel:+.3%} (target <= {TARGET_GAP:.0%}: {'yes' if rel <= TARGET_GAP else 'NO'})")
    print(
        f"speed-up cvxpy / FW: {speedup:.1f}x (target >= {TARGET_SPEEDUP:g}x: "
        f"{'yes' if speedup >= TARGET_SPEEDUP else 'NO'})"
    )


if __name__ == "__main__":
    main()
