"""The estimator contract (posttrain.testing.check_estimator) applied to every public core estimator.

Inputs use distinct sizes for every dimension (G=2, K=3, B=6, T=5, V=7) so that a wrong rank is
never a valid shape. Each estimator is also run on the hard cases the contract names: log-probs
near -1e4 and constant groups.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators import (
    aggregate,
    broadcast_sequence_advantages,
    cispo_loss,
    clipped_ratio_loss,
    drgrpo_advantages,
    group_normalized_advantages,
    group_rewards,
    gspo_loss,
    k1_kl,
    k2_kl,
    k3_kl,
    log_ratio,
    masked_mean,
    masked_sum,
    masked_whiten,
    mean_at_k,
    pass_at_k,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    sequence_log_ratio,
    straight_through,
    token_entropy,
)
from posttrain.testing import ContractFailure, check_estimator

G, K, T, V = 2, 3, 5, 7
B = G * K
Inputs = Callable[[torch.dtype], dict[str, Any]]


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


def _mask() -> torch.Tensor:
    m = torch.ones(B, T, dtype=torch.bool)
    m[0, 3:] = False  # right padding
    m[1, 1] = False  # a hole (e.g. a masked tool output)
    return m


def _rewards(constant: bool) -> Inputs:
    def make(dtype: torch.dtype) -> dict[str, Any]:
        r = torch.randn(G, K, generator=_gen(), dtype=torch.float64)
        if constant:
            r[0] = 0.7  # a constant group: advantages exactly 0, gradients finite
        return {"rewards": r.to(dtype)}

    return make


def _policy(offset: float, token_adv: bool) -> Inputs:
    """A policy batch with log-probs around ``offset`` (0 or -1e4) and a log-ratio within +-0.5."""

    def make(dtype: torch.dtype) -> dict[str, Any]:
        g = _gen()
        logp = (offset - torch.rand(B, T, generator=g, dtype=torch.float64)).to(dtype)
        delta = (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5).to(dtype)
        adv = torch.randn((B, T) if token_adv else (B,), generator=g, dtype=torch.float64).to(dtype)
        return {"logp": logp, "logp_old": logp - delta, "advantages": adv, "mask": _mask()}

    return make


def _pair(first: str, second: str, offset: float = 0.0) -> Inputs:
    def make(dtype: torch.dtype) -> dict[str, Any]:
        g = _gen()
        x = (offset - torch.rand(B, T, generator=g, dtype=torch.float64)).to(dtype)
        return {first: x, second: x - (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5).to(dtype)}

    return make


def _values(**extra: Any) -> Inputs:
    def make(dtype: torch.dtype) -> dict[str, Any]:
        return {"values": torch.randn(B, T, generator=_gen(), dtype=dtype), "mask": _mask(), **extra}

    return make


CLIP_BAD = {"clip_low": [0.0, -0.1, 1.0], "clip_high": [0.0, -0.2]}


@pytest.mark.parametrize("constant", [False, True])
@pytest.mark.parametrize(
    ("fn", "bad"),
    [
        (group_normalized_advantages, {"eps": [0.0, -1e-6, float("nan")]}),
        (lambda rewards: group_normalized_advantages(rewards, scale_by_std=False), {}),
        (drgrpo_advantages, {}),
        (rloo_advantages, {}),
    ],
    ids=["grpo", "grpo-unscaled", "drgrpo", "rloo"],
)
def test_group_advantages_contract(fn: Callable[..., Any], bad: dict[str, list[Any]], constant: bool) -> None:
    check_estimator(fn, _rewards(constant), output_shape=(G, K), bad_values=bad)


def test_group_rewards_contract() -> None:
    def make(dtype: torch.dtype) -> dict[str, Any]:
        return {"rewards": torch.randn(B, generator=_gen(), dtype=dtype), "group_ids": torch.arange(B) % G}

    check_estimator(group_rewards, make, output_shape=(G, K))


def test_broadcast_sequence_advantages_contract() -> None:
    def make(dtype: torch.dtype) -> dict[str, Any]:
        return {"advantages": torch.randn(G, K, generator=_gen(), dtype=dtype), "mask": _mask()}

    # An all-False mask is valid here (every advantage is then 0): no empty-mask check.
    check_estimator(broadcast_sequence_advantages, make, output_shape=(B, T), mask_arg=None)


def test_reinforce_pp_contract() -> None:
    def make(dtype: torch.dtype) -> dict[str, Any]:
        return {"token_rewards": torch.randn(B, T, generator=_gen(), dtype=dtype), "mask": _mask(), "gamma": 0.9}

    bad = {"gamma": [-0.1, 1.5], "eps": [0.0, -1.0]}
    check_estimator(reinforce_pp_advantages, make, output_shape=(B, T), bad_values=bad)


@pytest.mark.parametrize("constant", [False, True])
def test_reinforce_pp_baseline_contract(constant: bool) -> None:
    def make(dtype: torch.dtype) -> dict[str, Any]:
        return {**_rewards(constant)(dtype), "mask": _mask()}

    check_estimator(reinforce_pp_baseline_advantages, make, output_shape=(B, T), bad_values={"eps": [0.0]})


@pytest.mark.parametrize("offset", [0.0, -1e4], ids=["logp~0", "logp~-1e4"])
@pytest.mark.parametrize("token_adv", [False, True], ids=["adv[B]", "adv[B,T]"])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_clipped_ratio_loss_contract(offset: float, token_adv: bool, dual_clip: float | None) -> None:
    def fn(**kw: Any) -> Any:
        return clipped_ratio_loss(**{"dual_clip": dual_clip, **kw})

    fn.__name__ = "clipped_ratio_loss"
    bad = {**CLIP_BAD, "dual_clip": [1.0, 0.5]}
    check_estimator(fn, _policy(offset, token_adv), output_shape=(B, T), bad_values=bad, grad_args=["logp"])


@pytest.mark.parametrize("offset", [0.0, -1e4], ids=["logp~0", "logp~-1e4"])
@pytest.mark.parametrize("token_adv", [False, True], ids=["adv[B]", "adv[B,T]"])
def test_gspo_loss_contract(offset: float, token_adv: bool) -> None:
    check_estimator(gspo_loss, _policy(offset, token_adv), output_shape=(B, T), bad_values=CLIP_BAD, grad_args=["logp"])


CISPO_BAD = {
    "verl": {"clip_mode": ["pytorch", ""], "clip_low": [0.0, -0.1], "clip_high": [0.0, -0.2, float("nan")]},
    "minimax": {"clip_low": [0.2], "clip_high": [0.28, 0.0, float("nan")]},  # an absolute cap below 1 is an error
}


@pytest.mark.parametrize("offset", [0.0, -1e4], ids=["logp~0", "logp~-1e4"])
@pytest.mark.parametrize("token_adv", [False, True], ids=["adv[B]", "adv[B,T]"])
@pytest.mark.parametrize("clip_mode", ["verl", "minimax"])
@pytest.mark.parametrize("on_policy", [False, True], ids=["", "on_policy"])
def test_cispo_loss_contract(offset: float, token_adv: bool, clip_mode: str, on_policy: bool) -> None:
    base = _policy(offset, token_adv)

    def make(dtype: torch.dtype) -> dict[str, Any]:
        kw = {**base(dtype), "clip_mode": clip_mode}
        if on_policy:
            kw["on_policy"] = torch.rand(B, T, generator=_gen()) < 0.5
        return kw

    bad = CISPO_BAD[clip_mode]
    check_estimator(cispo_loss, make, output_shape=(B, T), bad_values=bad, grad_args=["logp"])


@pytest.mark.parametrize("mode", ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_aggregate_contract(mode: str) -> None:
    check_estimator(aggregate, _values(mode=mode), output_shape=(), bad_values={"mode": ["mean", ""]})


def test_aggregate_norm_contract() -> None:
    make = _values(mode="seq-mean-token-sum-norm", horizon=8)
    check_estimator(aggregate, make, output_shape=(), bad_values={"horizon": [0, -3]})


@pytest.mark.parametrize("fn", [masked_sum, masked_mean])
def test_masked_reductions_contract(fn: Callable[..., Any]) -> None:
    # An empty mask is valid for these helpers (the sum is 0, the mean is 0 by definition), and a
    # mask that broadcasts to the values is accepted, so rank changes of one argument can be valid.
    check_estimator(fn, _values(), output_shape=(), mask_arg=None, rank_args=())


def test_masked_whiten_contract() -> None:
    check_estimator(masked_whiten, _values(), output_shape=(B, T), bad_values={"eps": [0.0]})


@pytest.mark.parametrize("offset", [0.0, -1e4], ids=["logp~0", "logp~-1e4"])
@pytest.mark.parametrize("fn", [k1_kl, k2_kl, k3_kl])
def test_kl_contract(fn: Callable[..., Any], offset: float) -> None:
    bad = {"log_ratio_clamp": [0.0], "max_value": [-1.0]} if fn is k3_kl else {}
    check_estimator(fn, _pair("logp", "logp_ref", offset), output_shape=(B, T), bad_values=bad)


def test_straight_through_contract() -> None:
    check_estimator(straight_through, _pair("value", "gradient"), output_shape=(B, T))


def test_log_ratio_contract() -> None:
    check_estimator(log_ratio, _pair("logp", "logp_old", -1e4), output_shape=(B, T), bad_values={"clamp": [0.0]})


def test_sequence_log_ratio_contract() -> None:
    def make(dtype: torch.dtype) -> dict[str, Any]:
        return {**_pair("logp", "logp_old", -1e4)(dtype), "mask": _mask()}

    # A fully masked row has log-ratio 0 by definition, so an all-False mask is valid.
    check_estimator(sequence_log_ratio, make, output_shape=(B,), mask_arg=None)


@pytest.mark.parametrize("chunk_size", [4, 1024])
def test_token_entropy_contract(chunk_size: int) -> None:
    def make(dtype: torch.dtype) -> dict[str, Any]:
        logits = 30 * torch.randn(B, T, V, generator=_gen(), dtype=torch.float64)
        logits[0, 0, :3] = float("-inf")  # banned vocabulary entries contribute 0
        return {"logits": logits.to(dtype), "chunk_size": chunk_size}

    # [N, V] logits are valid too (rank - 1 of [B, T, V]), so the generic rank check is replaced.
    check_estimator(token_entropy, make, output_shape=(B, T), bad_values={"chunk_size": [0, -1, 2.5]}, rank_args=())
    logits = make(torch.float64)["logits"]
    for bad in (logits.unsqueeze(0), logits[0, 0]):
        with pytest.raises(ShapeError, match=r"^logits:"):
            token_entropy(bad)


def test_runner_catches_a_broken_estimator() -> None:
    """The runner itself must fail an estimator that mutates, masks by multiplication and skips checks."""

    def sloppy(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        values.mul_(1.0)  # in place on an input
        return (values * mask).sum() / mask.sum()

    with pytest.raises(ContractFailure) as info:
        check_estimator(sloppy, _values(), output_shape=())
    message = str(info.value)
    for item in ("modified in place", "rank of values", "dtype of mask", "empty mask", "an output changed"):
        assert item in message, item


def badly_annotated(values: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"]) -> Float[Tensor, " B"]:
    """Returns a scalar although its annotation promises one value per sequence."""
    return aggregate(values, mask)


def test_runner_checks_shape_annotations() -> None:
    with pytest.raises(ContractFailure, match="annotations"):
        check_estimator(badly_annotated, _values(), output_shape=())


# pass@k and mean@k take integer counts (numpy or torch), not float tensors: their own contract.
@pytest.mark.parametrize("fn", [pass_at_k, mean_at_k])
def test_pass_at_k_contract(fn: Callable[..., np.ndarray]) -> None:
    n, c, k = np.array([4, 16, 200]), np.array([1, 3, 10]), np.array([2, 8, 100])
    before = (n.copy(), c.copy(), k.copy())
    out = fn(n, c, k)
    assert out.shape == (3,) and out.dtype == np.float64 and np.all(np.isfinite(out))
    assert all(np.array_equal(a, b) for a, b in zip((n, c, k), before, strict=True))  # no mutation
    torch_out = fn(torch.tensor(n), torch.tensor(c), torch.tensor(k))
    np.testing.assert_array_equal(torch_out, out)
    bad_counts: tuple[tuple[tuple[Any, ...], str], ...] = (
        ((4, 1, 5), "k"),
        ((4, 1, 0), "k"),
        ((4, 5, 2), "c"),
        ((4, -1, 2), "c"),
        ((0, 0, 1), "n"),
    )
    for args, arg in bad_counts:
        with pytest.raises(DomainError, match=f"^{arg}:"):
            fn(*args)
    bad_types: tuple[tuple[tuple[Any, ...], str], ...] = (((4.5, 1, 2), "n"), ((4, 1, 2.5), "k"), ((4, True, 1), "c"))
    for args, arg in bad_types:
        with pytest.raises(ShapeError, match=f"^{arg}:"):
            fn(*args)
    with pytest.raises(ShapeError):
        fn(np.array([4, 4]), np.array([1, 1, 1]), 2)
