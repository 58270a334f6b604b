"""Regression tests of the fuzzing findings (each failed before its fix), and fused == plain for PPO-clip."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import DomainError
from posttrain.estimators import (
    clipped_ratio_loss,
    controller_init,
    controller_update,
    exopd_advantages,
    full_reverse_kl,
    group_normalized_advantages,
    k1_kl,
    k3_kl,
    kdrl_advantages,
    no_correction_loss,
    orarl_advantages,
    ppo_clip_objective,
    replay_init,
    replay_select,
    self_routing_probabilities,
    truncated_is_loss,
    zscore_rewards,
)
from posttrain.testing import policy_batches

NEG_INF = float("-inf")


@pytest.mark.parametrize("fn", [no_correction_loss, truncated_is_loss])
@pytest.mark.parametrize("fill", [NEG_INF, float("inf"), float("nan")])
def test_masked_nonfinite_never_reaches_a_gradient(fn: Any, fill: float) -> None:
    mask = torch.tensor([[True, True, False], [True, False, False]])
    logp = torch.tensor([[-1.0, -0.5, fill], [-2.0, fill, fill]]).requires_grad_()
    logp_old = torch.tensor([[-1.1, -0.4, fill], [-2.0, fill, fill]]).requires_grad_()
    adv = torch.tensor([1.0, -1.0]).requires_grad_()
    loss = fn(logp, logp_old, adv, mask)
    loss.sum().backward()
    for g in (logp.grad, logp_old.grad, adv.grad):
        assert g is None or bool(torch.isfinite(g).all())
    assert bool((logp.grad[~mask] == 0).all())
    assert bool((loss[~mask] == 0).all())


def test_k3_cap_gives_zero_gradient_not_nan() -> None:
    lp = torch.tensor([[-1.0, -1.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-200.0, -1.5, 40.0]])  # d = 199 (cap binds, k3 > 10), 0.5, -41 (e^41 overflows float32)
    value = k3_kl(lp, ref, max_value=10.0)
    value.sum().backward()
    assert value[0, 0] == 10.0 and value[0, 2] == 10.0
    assert lp.grad is not None and bool(torch.isfinite(lp.grad).all())
    assert lp.grad[0, 0] == 0.0 and lp.grad[0, 2] == 0.0
    torch.testing.assert_close(lp.grad[0, 1], 1 - torch.exp(torch.tensor(-0.5)))  # d k3 / d d = 1 - e^{-d}


def test_k3_default_is_finite_at_large_gaps() -> None:
    lp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    value = k3_kl(lp, torch.tensor([[1e4 - 1.0, -1e4]]))
    value.sum().backward()
    assert bool(torch.isfinite(value).all()) and bool(torch.isfinite(lp.grad).all())
    assert not bool(torch.isfinite(k3_kl(lp, torch.tensor([[1e4 - 1.0, -1e4]]), log_ratio_clamp=None)).all())


def test_full_reverse_kl_infinite_kl_is_an_error_naming_the_teacher() -> None:
    student = torch.log(torch.tensor([[[0.5, 0.5, 0.0]]]))
    with pytest.raises(DomainError, match=r"^logp_teacher:"):
        full_reverse_kl(student, torch.log(torch.tensor([[[1.0, 0.0, 0.0]]])))
    # a zero-probability token of the student contributes 0 whatever the teacher says
    assert float(full_reverse_kl(student, torch.log(torch.tensor([[[0.5, 0.5, 0.0]]])))) == 0.0


def test_half_precision_is_computed_in_float32() -> None:
    rewards = torch.tensor([[0.0, 300.0, 0.0, 0.0]])
    half = group_normalized_advantages(rewards.half())
    assert half.dtype == torch.float16
    torch.testing.assert_close(half, group_normalized_advantages(rewards).half())
    assert float(half[0, 1]) > 1.0  # computed in float16 every advantage was 0 (the variance overflowed)


def test_half_precision_clipped_loss_at_large_log_ratio() -> None:
    lp = torch.full((1, 2), 11.5, dtype=torch.float16).requires_grad_()  # ratio e^11.5 > float16 max
    mask = torch.ones(1, 2, dtype=torch.bool)
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float16)
    loss, _ = clipped_ratio_loss(lp, torch.zeros_like(lp), adv, mask, dual_clip=3.0)
    loss.sum().backward()
    assert loss.dtype == torch.float16 and loss[0].tolist() == pytest.approx([-1.2, 3.0], abs=1e-3)
    assert lp.grad is not None and bool((lp.grad == 0).all())  # both clipped; was NaN (0 * inf)


def test_controller_update_with_ridge_zero() -> None:
    state = controller_init(2, 2, dtype=torch.float32)
    features = torch.full((2, 2), 1e4)  # collinear: the normal equations are singular without a ridge
    out = controller_update(state, features, torch.tensor([0, 0]), torch.tensor([1.0, 2.0]), 0, ridge=0.0)
    assert bool(torch.isfinite(out.coef).all())


def test_unknown_options_raise_domain_error_naming_the_argument() -> None:
    rewards, oracle = torch.zeros(2, 3), torch.ones(2)
    with pytest.raises(DomainError, match=r"^oracle_mode:"):
        orarl_advantages(rewards, oracle, oracle_mode="nope")
    with pytest.raises(DomainError, match=r"^delta_mode:"):
        self_routing_probabilities(torch.zeros(2, 3), torch.zeros(2, 3), delta_mode="nope")
    buf = replay_init(4, 3)
    with pytest.raises(DomainError, match=r"^order:"):
        replay_select(buf, torch.zeros(0, 4, 3), k_rep=1, tau=0.1, order="nope")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), NEG_INF])
def test_nonfinite_valid_entries_raise(value: float) -> None:
    x = torch.full((2, 3), -0.5)
    bad = x.clone()
    bad[1, 2] = value
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(DomainError, match=r"^logp_ref:"):
        k1_kl(x, bad)
    with pytest.raises(DomainError, match=r"^logp_teacher:"):
        exopd_advantages(x, bad, x, mask)
    with pytest.raises(DomainError, match=r"^opd:"):
        kdrl_advantages(torch.zeros(2), bad, mask)


# --- the fused PPO-clip loss against its plain form -------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    policy_batches(max_log_ratio=1.0),
    st.sampled_from([(0.2, 0.2), (0.2, 0.28), (0.1, 0.5)]),
    st.sampled_from([None, 3.0]),
    st.booleans(),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_fused_equals_plain(
    batch, clips: tuple[float, float], dual: float | None, on: bool, dtype: torch.dtype
) -> None:  # type: ignore[no-untyped-def]
    lo, hi = clips
    on_policy = (torch.arange(batch.logp.numel()).reshape(batch.logp.shape) % 3 == 0) if on else None
    results = []
    for fused in (True, False):
        lp = batch.logp.to(dtype).requires_grad_()
        old = batch.logp_old.to(dtype).requires_grad_()
        adv = batch.advantages.to(dtype)
        loss, diag = clipped_ratio_loss(
            lp, old, adv, batch.mask, clip_low=lo, clip_high=hi, dual_clip=dual, on_policy=on_policy, fused=fused
        )
        (loss * torch.linspace(-1, 2, loss.numel(), dtype=dtype).reshape(loss.shape)).sum().backward()
        results.append((loss.detach(), diag, lp.grad, old.grad))
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-6}
    for a, b in zip(results[0], results[1], strict=True):
        torch.testing.assert_close(a, b, **tol)


def test_plain_form_is_the_paper_formula() -> None:
    r = torch.tensor([1.5, 0.5, 1.5, 0.5, 5.0, 0.9])
    a = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0, 0.0])
    loss, clipped, dual = ppo_clip_objective(r, a, clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    want = torch.maximum(-a * r, -a * r.clamp(0.8, 1.2))
    want = torch.where(a < 0, torch.minimum(want, -3.0 * a), want)
    torch.testing.assert_close(loss, want)
    assert clipped.tolist() == [True, False, False, True, False, False]
    assert dual.tolist() == [False, False, False, False, True, False]


def test_fused_path_handles_clamped_log_ratios_like_the_plain_form() -> None:
    lp = torch.tensor([[25.0, -25.0, 0.1]], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(1, 3, dtype=torch.bool)
    adv = torch.tensor([[-1.0, 1.0, 1.0]], dtype=torch.float64)
    a, da = clipped_ratio_loss(lp, torch.zeros_like(lp), adv, mask)
    b, db = clipped_ratio_loss(lp, torch.zeros_like(lp), adv, mask, fused=False)
    torch.testing.assert_close(a, b)
    assert da == db


def test_zscore_rewards_constant_population_has_a_finite_gradient() -> None:
    rewards = torch.full((4,), 0.5, dtype=torch.float64, requires_grad=True)
    w = torch.arange(4.0, dtype=torch.float64)
    z = zscore_rewards(rewards)
    (z * w).sum().backward()
    # at centred rewards 0 the std term has subgradient 0: dz/dR = (I - 11^T/P) / eps (was NaN from sqrt'(0))
    assert bool((z == 0).all())
    torch.testing.assert_close(rewards.grad, (w - w.mean()) / 1e-8)
