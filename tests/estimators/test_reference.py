"""The vectorised core estimators against the loop implementations of tests/reference.py (float64).

Tolerances: float64 arithmetic in a different order agrees to a few ulps (rtol 1e-12) except where a
difference of nearly equal numbers is divided by a small denominator: group advantages divide a
centred reward (one rounding of the mean, ~1e-15 absolute) by ``std + eps >= eps = 1e-6``, hence atol
1e-8 there; whitening divides by ``sqrt(var + 1e-8) >= 1e-4``, hence atol 1e-10.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.estimators import (
    aggregate,
    clipped_ratio_loss,
    group_normalized_advantages,
    gspo_loss,
    k1_kl,
    k2_kl,
    k3_kl,
    pass_at_k,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    token_entropy,
)
from posttrain.testing import grouped_rewards, log_probs, policy_batches, response_masks, token_tensors
from tests import reference as ref

EXACT: dict[str, Any] = dict(rtol=1e-12, atol=1e-12)
GROUP_TOL: dict[str, Any] = dict(rtol=1e-9, atol=1e-8)
WHITEN_TOL: dict[str, Any] = dict(rtol=1e-9, atol=1e-10)
F64 = torch.float64


def _t(x: object) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


@given(grouped_rewards(groups=(1, 4), k=(1, 6)), st.booleans(), st.sampled_from([1e-6, 1e-4, 1e-9]))
def test_group_normalized_advantages_match_loop(rewards: torch.Tensor, scale: bool, eps: float) -> None:
    got = group_normalized_advantages(rewards, scale_by_std=scale, eps=eps)
    want = _t(ref.group_normalized_advantages(rewards.tolist(), scale_by_std=scale, eps=eps))
    torch.testing.assert_close(got, want, **GROUP_TOL)


@given(grouped_rewards(groups=(1, 4), k=(2, 6)))
def test_rloo_matches_loop(rewards: torch.Tensor) -> None:
    torch.testing.assert_close(rloo_advantages(rewards), _t(ref.rloo_advantages(rewards.tolist())), **GROUP_TOL)


@st.composite
def _token_rewards_and_mask(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    b, t = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    return draw(token_tensors((b, t), low=-2, high=2)), draw(response_masks((b, t)))


@given(_token_rewards_and_mask(), st.sampled_from([1.0, 0.9, 0.0]))
def test_reinforce_pp_matches_loop(data: tuple[torch.Tensor, torch.Tensor], gamma: float) -> None:
    r, m = data
    want = _t(ref.reinforce_pp_advantages(r.tolist(), m.tolist(), gamma=gamma))
    torch.testing.assert_close(reinforce_pp_advantages(r, m, gamma=gamma), want, **WHITEN_TOL)


@st.composite
def _rewards_and_mask(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    rewards = draw(grouped_rewards(groups=(1, 3), k=(2, 4)))
    return rewards, draw(response_masks((rewards.numel(), draw(st.integers(1, 5)))))


@given(_rewards_and_mask())
def test_reinforce_pp_baseline_matches_loop(data: tuple[torch.Tensor, torch.Tensor]) -> None:
    rewards, m = data
    want = _t(ref.reinforce_pp_baseline_advantages(rewards.tolist(), m.tolist()))
    torch.testing.assert_close(reinforce_pp_baseline_advantages(rewards, m), want, **WHITEN_TOL)


def _token_adv(adv: torch.Tensor, shape: torch.Size) -> list[list[float]]:
    return (adv.unsqueeze(-1).expand(shape) if adv.ndim == 1 else adv).tolist()


@given(
    policy_batches(max_log_ratio=1.0),
    st.sampled_from([(0.2, 0.2), (0.2, 0.28), (0.1, 0.5)]),
    st.sampled_from([None, 3.0, 1.5]),
)
def test_clipped_ratio_loss_matches_loop(batch, clips: tuple[float, float], dual: float | None) -> None:  # type: ignore[no-untyped-def]
    lo, hi = clips
    loss, diag = clipped_ratio_loss(
        batch.logp, batch.logp_old, batch.advantages, batch.mask, clip_low=lo, clip_high=hi, dual_clip=dual
    )
    want, want_diag = ref.clipped_ratio_loss(
        batch.logp.tolist(),
        batch.logp_old.tolist(),
        _token_adv(batch.advantages, batch.logp.shape),
        batch.mask.tolist(),
        clip_low=lo,
        clip_high=hi,
        dual_clip=dual,
    )
    torch.testing.assert_close(loss, _t(want), **EXACT)
    for name, value in want_diag.items():
        assert math.isclose(float(getattr(diag, name)), value, rel_tol=1e-12, abs_tol=1e-12), name


@given(policy_batches(max_log_ratio=1e-3), st.sampled_from([(3e-4, 4e-4), (0.2, 0.2)]))
def test_gspo_loss_matches_loop(batch, clips: tuple[float, float]) -> None:  # type: ignore[no-untyped-def]
    lo, hi = clips
    loss, _ = gspo_loss(batch.logp, batch.logp_old, batch.advantages, batch.mask, clip_low=lo, clip_high=hi)
    adv = _token_adv(batch.advantages, batch.logp.shape)
    want = ref.gspo_loss(
        batch.logp.tolist(), batch.logp_old.tolist(), adv, batch.mask.tolist(), clip_low=lo, clip_high=hi
    )
    torch.testing.assert_close(loss, _t(want), **EXACT)


MODES = ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


@st.composite
def _values_and_any_mask(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks here may have fully masked rows (but not be empty)."""
    b, t = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    m = draw(response_masks((b, t)))
    drop = draw(st.lists(st.booleans(), min_size=b, max_size=b))
    if not all(drop):
        m[torch.tensor(drop)] = False
    return draw(token_tensors((b, t))), m


@given(_values_and_any_mask(), st.sampled_from(MODES), st.sampled_from([None, 7]))
def test_aggregate_matches_loop(data: tuple[torch.Tensor, torch.Tensor], mode: str, horizon: int | None) -> None:
    v, m = data
    got = float(aggregate(v, m, mode, horizon=horizon))
    assert math.isclose(got, ref.aggregate(v.tolist(), m.tolist(), mode, horizon=horizon), rel_tol=1e-12, abs_tol=1e-12)


@given(log_probs((3, 4)), log_probs((3, 4)))
def test_kl_estimators_match_loop(logp: torch.Tensor, logp_ref: torch.Tensor) -> None:
    for fn, scalar in ((k1_kl, ref.k1), (k2_kl, ref.k2), (k3_kl, ref.k3)):
        want = _t(
            [
                [scalar(a, b) for a, b in zip(r1, r2, strict=True)]
                for r1, r2 in zip(logp.tolist(), logp_ref.tolist(), strict=True)
            ]
        )
        # k3 = e^x - x - 1 from math.exp loses ~1e-16 * e^x absolutely; ours uses expm1 (more accurate).
        torch.testing.assert_close(fn(logp, logp_ref), want, rtol=1e-12, atol=1e-16 * float(want.abs().max() + 1) * 8)


@given(token_tensors((2, 3, 5), low=-30, high=30), st.sampled_from([1, 2, 1024]))
def test_token_entropy_matches_loop(logits: torch.Tensor, chunk: int) -> None:
    torch.testing.assert_close(token_entropy(logits, chunk_size=chunk), _t(ref.token_entropy(logits.tolist())), **EXACT)


@settings(max_examples=40)
@given(st.integers(1, 40).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_matches_exact_rational(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    assert math.isclose(float(pass_at_k(n, c, k)), ref.pass_at_k(n, c, k), rel_tol=1e-12, abs_tol=1e-15)
