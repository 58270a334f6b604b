"""Benchmark: path-space estimators (paper 09) vectorised over paths and steps vs a per-path Python loop.

Both sides compute the same five quantities for every path of a 2-D flow sampled with the eta = 1
SDE: the Girsanov log-weight of a perturbed drift, the Itô-integral policy gradient, the stochastic
value-gradient form, the deterministic value gradient at ``M`` re-noised times and the group KDE
value gradient. The reference loops over paths (each path's steps and times as small torch
tensors, the same formulas written out); the candidate is one call per estimator on ``[N, S, D]``.
Results are compared first in float64 (rtol 1e-10); then both sides are timed in float32, interleaved
(``benchmarks._timing.time_pair``), best of ``repeats``, and the ratio is printed. Target (issue 8):
>= 50x. The exit status is 0 either way: this is a measurement.

Run: ``python -m benchmarks.bench_path_space [--paths 2048 --steps 100]``.
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
from torch import Tensor

from benchmarks._timing import Row, time_pair
from posttrain.estimators import (
    deterministic_value_gradient,
    girsanov_log_weights,
    ito_policy_gradient,
    kde_value_gradient,
    stochastic_value_gradient,
    value_gradient_policy_gradient,
)
from posttrain.simulators.sde import GaussianMixture, forward_noise, simulate_flow_sde

TARGET = 50.0


def make_inputs(paths: int, steps: int, times: int, group: int, dim: int = 2, seed: int = 0) -> dict[str, Tensor]:
    """A sampled batch: paths of the eta = 1 sampler on a 2-D ring mixture plus re-noised points."""
    gm = GaussianMixture.ring_2d() if dim == 2 else GaussianMixture.bimodal_1d()
    g = torch.Generator().manual_seed(seed)
    p = simulate_flow_sde(gm.velocity, gm.sample_t(paths, 0.95, generator=g), t_start=0.95, steps=steps, generator=g)
    x0 = p.states[:, -1]
    t = 0.05 + 0.9 * torch.rand(paths, times, generator=g, dtype=torch.float64)
    x_t, v = forward_noise(x0, t, torch.randn(paths, times, dim, generator=g, dtype=torch.float64))
    return {
        "adv": torch.tanh(x0[:, 0]),
        "delta_drift": 0.1 * torch.randn(paths, steps, dim, generator=g, dtype=torch.float64),
        "drift_grad": torch.randn(paths, steps, dim, generator=g, dtype=torch.float64),
        "diffusion": p.diffusion.clamp_min(1e-3),
        "noise": p.noise,
        "dr": p.dr,
        "x0": x0,
        "t": t,
        "x_t": x_t,
        "v": v,
        "v_old": gm.velocity(x_t, t),
        "group": torch.tensor(group),
    }


def vectorised(inp: dict[str, Tensor]) -> Tensor:
    """All five estimators in one batched call each; returns ``[N, 5 + 2 M]`` (weights, grads, ...)."""
    n, m = inp["t"].shape
    k = int(inp["group"])
    logw = girsanov_log_weights(inp["delta_drift"], inp["diffusion"], inp["noise"], inp["dr"]).sum(-1)
    ito = ito_policy_gradient(inp["adv"], inp["drift_grad"], inp["diffusion"], inp["noise"], inp["dr"])
    sto = stochastic_value_gradient(inp["adv"], inp["diffusion"], inp["noise"], inp["dr"])
    vg_form = value_gradient_policy_gradient(inp["drift_grad"], sto, inp["dr"])
    det = deterministic_value_gradient(inp["adv"], inp["v"], inp["v_old"], inp["t"])
    kde = kde_value_gradient(
        inp["x_t"].reshape(n // k, k * m, -1),
        inp["t"].reshape(n // k, k * m),
        inp["x0"].reshape(n // k, k, -1),
        inp["adv"].reshape(n // k, k),
    ).grad
    return torch.cat([torch.stack([logw, ito, vg_form], 1), det[..., 0], kde.reshape(n, m, -1)[..., 0]], 1)


def per_path_loop(inp: dict[str, Tensor]) -> Tensor:
    """The same numbers, one path at a time (the formulas written out on per-path tensors)."""
    n = inp["t"].shape[0]
    k = int(inp["group"])
    g, dr = inp["diffusion"], inp["dr"]
    rows = []
    for i in range(n):
        a, eps, grad_mu = inp["adv"][i], inp["noise"][i], inp["drift_grad"][i]  # [S, D]
        u = inp["delta_drift"][i] / g[:, None]
        logw = ((u * eps).sum(-1) * dr.sqrt() - 0.5 * (u**2).sum(-1) * dr).sum()
        ito = a * ((grad_mu * eps).sum(-1) * dr.sqrt() / g).sum()
        sto = a * eps / (g * dr.sqrt())[:, None]
        vg_form = ((grad_mu * sto).sum(-1) * dr).sum()
        t = inp["t"][i]  # [M]
        det = -(1 - t) / t * a * (inp["v"][i, :, 0] - inp["v_old"][i, :, 0])
        first = (i // k) * k
        members, adv_g = inp["x0"][first : first + k], inp["adv"][first : first + k]  # [K, D], [K]
        resid = inp["x_t"][i][:, None, :] - (1 - t)[:, None, None] * members[None]  # [M, K, D]
        w = torch.softmax(-(resid**2).sum(-1) / (2 * t[:, None] ** 2), -1)
        value = (w * adv_g).sum(-1, keepdim=True)
        kde = -((w * (adv_g - value) / t[:, None] ** 2)[..., None] * resid).sum(1)[:, 0]
        rows.append(torch.cat([torch.stack([logw, ito, vg_form]), det, kde]))
    return torch.stack(rows)


def run(
    *,
    paths: int = 2048,
    steps: int = 100,
    times: int = 10,
    group: int = 16,
    dims: tuple[int, ...] = (1, 2),
    repeats: int = 5,
    dtype: torch.dtype = torch.float32,
) -> list[Row]:
    """Per state dimension: check agreement (float64), then time both sides interleaved in ``dtype``.

    ``D = 1`` is the workload of paper check 09 (a 1-D flow, 100 Euler steps); ``D = 2`` the 2-D ring.
    """
    rows = []
    for dim in dims:
        inp64 = make_inputs(paths, steps, times, group, dim)
        torch.testing.assert_close(vectorised(inp64), per_path_loop(inp64), rtol=1e-10, atol=1e-10)
        inp = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inp64.items()}
        t_ours, t_ref = time_pair(partial(vectorised, inp), partial(per_path_loop, inp), repeats=repeats)
        name = f"path-space estimators [N={paths} paths, S={steps} steps, D={dim}, KDE K={group}]"
        rows.append(Row(name, t_ours, t_ref, "per-path loop", TARGET, True))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--paths", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for row in run(paths=args.paths, steps=args.steps, repeats=args.repeats):
        print(
            f"{row.name}: per-path loop {row.reference_s * 1e3:.1f} ms, vectorised {row.ours_s * 1e3:.2f} ms, "
            f"ratio {row.ratio:.1f}x (target >= {TARGET:.0f}x, {'met' if row.met else 'NOT met'})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
