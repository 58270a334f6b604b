"""Path-space estimators (paper 09): the estimator contract and per-path loop references in float64.

The loops below use Python scalars over paths, steps and group members, written from the docstring
formulas; vectorised and loop results agree to rtol 1e-12 (float64, different summation order).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from posttrain.errors import DomainError
from posttrain.estimators import (
    VALUE_GRADIENTS,
    awm_loss,
    deterministic_value_gradient,
    girsanov_log_weights,
    ito_policy_gradient,
    kde_value_gradient,
    nft_loss,
    path_score,
    scale_bounded_loss,
    stochastic_value_gradient,
    value_gradient_policy_gradient,
)
from posttrain.testing import check_estimator

N, S, D, G, K, M = 5, 4, 2, 3, 6, 7  # distinct sizes so that a wrong axis cannot pass as another


def _steps(dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "diffusion": torch.rand(S, generator=g, dtype=torch.float64).add(0.5).to(dtype),
        "noise": torch.randn(N, S, D, generator=g, dtype=torch.float64).to(dtype),
        "dr": torch.rand(S, generator=g, dtype=torch.float64).add(0.1).to(dtype),
    }


def _rand(*shape: int, dtype: torch.dtype = torch.float64, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def _times(*shape: int, dtype: torch.dtype = torch.float64, seed: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (0.05 + 0.9 * torch.rand(*shape, generator=g, dtype=torch.float64)).to(dtype)


def test_contract_girsanov_log_weights() -> None:
    check_estimator(
        girsanov_log_weights,
        lambda dt: {"delta_drift": _rand(N, S, D, dtype=dt), **_steps(dt)},
        output_shape=(N, S),
        mask_arg=None,
    )


def test_contract_path_score_and_ito() -> None:
    check_estimator(
        path_score,
        lambda dt: {"drift_grad": _rand(N, S, D, dtype=dt), **_steps(dt)},
        output_shape=(N, S),
        mask_arg=None,
    )
    check_estimator(
        ito_policy_gradient,
        lambda dt: {
            "advantages": _rand(N, dtype=dt, seed=3),
            "drift_grad": _rand(N, S, D, dtype=dt),
            **_steps(dt),
            "step_weights": _rand(N, S, dtype=dt, seed=4),
        },
        output_shape=(N,),
        mask_arg=None,
        rank_args=("advantages", "drift_grad", "diffusion", "noise", "dr"),  # step_weights may be [S] or [N, S]
    )


def test_contract_value_gradients() -> None:
    check_estimator(
        stochastic_value_gradient,
        lambda dt: {"advantages": _rand(N, dtype=dt, seed=3), **_steps(dt)},
        output_shape=(N, S, D),
        mask_arg=None,
    )
    check_estimator(
        value_gradient_policy_gradient,
        lambda dt: {
            "drift_grad": _rand(N, S, D, dtype=dt),
            "value_grad": _rand(N, S, D, dtype=dt, seed=5),
            "dr": _steps(dt)["dr"],
        },
        output_shape=(N,),
        mask_arg=None,
    )
    check_estimator(
        deterministic_value_gradient,
        lambda dt: {
            "advantages": _rand(N, dtype=dt, seed=3),
            "v_target": _rand(N, M, D, dtype=dt),
            "v_old": _rand(N, M, D, dtype=dt, seed=6),
            "t": _times(N, M, dtype=dt),
        },
        output_shape=(N, M, D),
        mask_arg=None,
    )
    check_estimator(
        kde_value_gradient,
        lambda dt: {
            "x_t": _rand(G, M, D, dtype=dt),
            "t": _times(G, M, dtype=dt),
            "x0": _rand(G, K, D, dtype=dt, seed=7),
            "advantages": _rand(G, K, dtype=dt, seed=8),
        },
        output_shape=(G, M, D),
        mask_arg=None,
    )


def test_domain_errors_name_the_argument() -> None:
    st = _steps(torch.float64)
    with pytest.raises(DomainError, match="diffusion"):
        girsanov_log_weights(_rand(N, S, D), torch.zeros(S, dtype=torch.float64), st["noise"], st["dr"])
    with pytest.raises(DomainError, match="dr"):
        path_score(_rand(N, S, D), st["diffusion"], st["noise"], -st["dr"])
    with pytest.raises(DomainError, match="t"):
        kde_value_gradient(_rand(G, M, D), torch.zeros(G, M, dtype=torch.float64), _rand(G, K, D), _rand(G, K))


def test_value_gradient_registry_lists_the_three_estimators() -> None:
    assert {"stochastic", "deterministic", "kde"} <= set(VALUE_GRADIENTS.names())


def _loop_girsanov_and_ito(inp: dict[str, Any]) -> tuple[list[list[float]], list[float]]:
    n, s, d = inp["noise"].shape
    logw, ito = [], []
    for i in range(n):
        row, total = [], 0.0
        for k in range(s):
            g, dr = float(inp["diffusion"][k]), float(inp["dr"][k])
            u = [float(inp["delta_drift"][i, k, j]) / g for j in range(d)]
            eps = [float(inp["noise"][i, k, j]) for j in range(d)]
            row.append(
                sum(a * b for a, b in zip(u, eps, strict=True)) * math.sqrt(dr) - 0.5 * sum(a * a for a in u) * dr
            )
            score = sum(float(inp["drift_grad"][i, k, j]) * eps[j] for j in range(d)) * math.sqrt(dr) / g
            total += float(inp["step_weights"][i, k]) * score
        logw.append(row)
        ito.append(float(inp["advantages"][i]) * total)
    return logw, ito


def _loop_kde(x_t: torch.Tensor, t: torch.Tensor, x0: torch.Tensor, adv: torch.Tensor) -> list[list[list[float]]]:
    out = []
    for gi in range(x_t.shape[0]):
        rows = []
        for q in range(x_t.shape[1]):
            tq = float(t[gi, q])
            resid = [
                [float(x_t[gi, q, j]) - (1 - tq) * float(x0[gi, m, j]) for j in range(x_t.shape[2])]
                for m in range(x0.shape[1])
            ]
            logw = [-sum(r * r for r in res) / (2 * tq * tq) for res in resid]
            top = max(logw)
            w = [math.exp(v - top) for v in logw]
            w = [v / sum(w) for v in w]
            value = sum(wi * float(a) for wi, a in zip(w, adv[gi], strict=True))
            rows.append(
                [
                    sum(-w[m] * (float(adv[gi, m]) - value) * resid[m][j] / tq**2 for m in range(len(w)))
                    for j in range(x_t.shape[2])
                ]
            )
        out.append(rows)
    return out


def test_vectorised_matches_per_path_loops() -> None:
    inp = {
        "delta_drift": _rand(N, S, D, seed=9),
        "drift_grad": _rand(N, S, D, seed=10),
        "advantages": _rand(N, seed=11),
        "step_weights": _rand(N, S, seed=12),
        **_steps(torch.float64, seed=13),
    }
    logw, ito = _loop_girsanov_and_ito(inp)
    torch.testing.assert_close(
        girsanov_log_weights(inp["delta_drift"], inp["diffusion"], inp["noise"], inp["dr"]),
        torch.tensor(logw, dtype=torch.float64),
        rtol=1e-12,
        atol=1e-12,
    )
    got = ito_policy_gradient(
        inp["advantages"],
        inp["drift_grad"],
        inp["diffusion"],
        inp["noise"],
        inp["dr"],
        step_weights=inp["step_weights"],
    )
    torch.testing.assert_close(got, torch.tensor(ito, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    x_t, t, x0, adv = _rand(G, M, D, seed=14), _times(G, M), _rand(G, K, D, seed=15), _rand(G, K, seed=16)
    torch.testing.assert_close(
        kde_value_gradient(x_t, t, x0, adv).grad,
        torch.tensor(_loop_kde(x_t, t, x0, adv), dtype=torch.float64),
        rtol=1e-12,
        atol=1e-12,
    )


def test_kde_is_stable_in_high_dimension() -> None:
    """Weights through a log-softmax: D = 4096 latent dims with t = 0.05 give finite, saturated weights."""
    g = torch.Generator().manual_seed(17)
    x0 = torch.randn(1, 4, 4096, generator=g, dtype=torch.float32)
    t = torch.full((1, 4), 0.05)
    x_t = (1 - t[..., None]) * x0 + t[..., None] * torch.randn(1, 4, 4096, generator=g)
    out = kde_value_gradient(x_t, t, x0, torch.tensor([[1.0, 0.0, 0.5, 2.0]]))
    assert bool(torch.isfinite(out.grad).all())
    torch.testing.assert_close(out.effective_size, torch.ones(1, 4))


def test_contract_forward_matching_losses() -> None:
    def velocities(dt: torch.dtype) -> dict[str, torch.Tensor]:
        return {
            "v_theta": _rand(N, D, dtype=dt, seed=20),
            "v_old": _rand(N, D, dtype=dt, seed=21),
            "v_target": _rand(N, D, dtype=dt, seed=22),
        }

    rank: tuple[str, ...] = ()  # per-sample losses accept any leading shape
    check_estimator(
        scale_bounded_loss,
        lambda dt: {**velocities(dt), "advantages": _rand(N, dtype=dt, seed=23), "t": _times(N, dtype=dt)},
        output_shape=(N,),
        mask_arg=None,
        rank_args=rank,
        bad_values={"kappa": [-0.1, 1.5], "gamma": [0.5]},
    )
    check_estimator(
        nft_loss,
        lambda dt: {
            **velocities(dt),
            "rho": torch.rand(N, generator=torch.Generator().manual_seed(24), dtype=torch.float64).to(dt),
        },
        output_shape=(N,),
        mask_arg=None,
        rank_args=rank,
        bad_values={"beta": [0.0, -1.0]},
    )
    check_estimator(
        awm_loss,
        lambda dt: {
            "v_theta": _rand(N, D, dtype=dt, seed=20),
            "v_target": _rand(N, D, dtype=dt),
            "advantages": _rand(N, dtype=dt, seed=23),
            "weight": _times(N, dtype=dt),
        },
        output_shape=(N,),
        mask_arg=None,
        rank_args=rank,
    )
