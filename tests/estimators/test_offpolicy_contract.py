"""Contract of the issue-6 estimators: float32/float64, finite gradients, no input mutation, named errors."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators import (
    aggregate,
    flowrl_loss,
    gflowrl_loss,
    headroom,
    no_correction_loss,
    policy_drift,
    recoverability_gain,
    sis_loss,
    truncated_is_loss,
)

G, K, T = 2, 4, 3


def _inputs(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Drawn in float64 and cast, so both dtypes see the same numbers."""
    x = _inputs64()
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in x.items()}


def _inputs64() -> dict[str, torch.Tensor]:
    g, dtype = torch.Generator().manual_seed(0), torch.float64
    logp_old = -torch.rand(G * K, T, generator=g, dtype=dtype) - 0.1
    mask = torch.ones(G * K, T, dtype=torch.bool)
    mask[0, -1] = False
    return {
        "logp": (logp_old + 0.1 * torch.randn(G * K, T, generator=g, dtype=dtype)).clamp(max=-1e-3),
        "logp_old": logp_old,
        "logp_ref": -torch.rand(G * K, T, generator=g, dtype=dtype) - 0.1,
        "adv": torch.randn(G * K, generator=g, dtype=dtype),
        "rewards": (torch.rand(G, K, generator=g) < 0.5).to(dtype),
        "mask": mask,
        "accepted": torch.rand(G * K, T, generator=g) < 0.5,
        "log_z": torch.zeros(G, dtype=dtype),
    }


LOSSES: dict[str, Callable[[dict[str, torch.Tensor], torch.Tensor], torch.Tensor]] = {
    "sis": lambda x, lp: sis_loss(lp, x["logp_old"], x["adv"], x["mask"], x["accepted"])[0],
    "truncated_is": lambda x, lp: truncated_is_loss(lp, x["logp_old"], x["adv"], x["mask"]),
    "no_is_correction": lambda x, lp: no_correction_loss(lp, x["logp_old"], x["adv"], x["mask"]),
    "gflowrl": lambda x, lp: gflowrl_loss(lp, x["logp_old"], x["logp_ref"], x["rewards"], x["mask"])[0],
    "flowrl": lambda x, lp: flowrl_loss(lp, x["logp_old"], x["logp_ref"], x["rewards"], x["mask"], x["log_z"])[0],
}


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_loss_contract(name: str, dtype: torch.dtype) -> None:
    x = _inputs(dtype)
    before = {k: v.clone() for k, v in x.items()}
    lp = x["logp"].clone().requires_grad_(True)
    loss = LOSSES[name](x, lp)
    assert loss.shape == (G * K, T) and loss.dtype == dtype
    assert bool((loss[~x["mask"]] == 0).all())
    (grad,) = torch.autograd.grad(aggregate(loss, x["mask"]), lp)
    assert bool(torch.isfinite(grad).all()) and bool((grad[~x["mask"]] == 0).all())
    assert all(torch.equal(before[k], x[k]) for k in x)  # inputs never mutated


def test_float32_agrees_with_float64() -> None:
    x32, x64 = _inputs(torch.float32), _inputs(torch.float64)
    for name, fn in LOSSES.items():
        a, b = fn(x32, x32["logp"]), fn(x64, x64["logp"])
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5, msg=name)


def test_errors_name_the_argument() -> None:
    x = _inputs(torch.float64)
    with pytest.raises(ShapeError, match="logp_old"):
        truncated_is_loss(x["logp"], x["logp_old"][:, :1], x["adv"], x["mask"])
    with pytest.raises(DomainError, match="cap"):
        truncated_is_loss(x["logp"], x["logp_old"], x["adv"], x["mask"], cap=0.0)
    with pytest.raises(ShapeError, match="log_z"):
        flowrl_loss(x["logp"], x["logp_old"], x["logp_ref"], x["rewards"], x["mask"], torch.zeros(G + 1))
    with pytest.raises(ShapeError, match="mask"):
        headroom(x["logp"].reshape(G, K, T), x["adv"].reshape(G, K), x["mask"].reshape(G, K, T).float())  # type: ignore[arg-type]
    with pytest.raises(ShapeError, match="logp_gen"):
        policy_drift(x["logp"].reshape(G, K, T), x["logp"].reshape(G, K, T)[:, :1], x["mask"].reshape(G, K, T))
    with pytest.raises(ShapeError, match="branch_rewards"):
        recoverability_gain(torch.zeros(2, 3), torch.zeros(3, 2))
