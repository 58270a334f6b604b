"""CISPO (MiniMax-M1, arXiv:2506.13585): the clipped stop-gradient IS weight times REINFORCE, both conventions.

The reference is a float64 numpy transcription of the formula: w = clip(exp(clamp(l - l_old, -20, 20)), lo, hi),
value -w A l, gradient -w A (masked positions 0).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.estimators import (
    AggregationMode,
    aggregate,
    cispo_loss,
    clipped_ratio_loss,
    sis_logp_old,
    truncated_is_loss,
)
from posttrain.testing import PolicyBatch, policy_batches, response_masks

VERL = st.fixed_dictionaries(
    {"clip_mode": st.just("verl"), "clip_low": st.floats(0.01, 1.5), "clip_high": st.floats(0.01, 3.0)}
)
MINIMAX = st.fixed_dictionaries({"clip_mode": st.just("minimax"), "clip_high": st.floats(1.0, 10.0)})
OPTIONS = st.one_of(VERL, MINIMAX)


def _bounds(opts: dict[str, Any]) -> tuple[float, float]:
    if opts["clip_mode"] == "verl":
        return max(1.0 - opts["clip_low"], 0.0), 1.0 + opts["clip_high"]
    return 0.0, opts["clip_high"]


def _reference(x: PolicyBatch, opts: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``(value, d value / d logp)`` per token, straight from the formula."""
    lp, lo_, m = x.logp.numpy(), x.logp_old.numpy(), x.mask.numpy()
    adv = np.broadcast_to(x.advantages.numpy()[:, None] if x.advantages.ndim == 1 else x.advantages.numpy(), lp.shape)
    lo, hi = _bounds(opts)
    w = np.clip(np.exp(np.clip(lp - lo_, -20.0, 20.0)), lo, hi)
    return np.where(m, -w * adv * lp, 0.0), np.where(m, -w * adv, 0.0)


def _value_and_grad(fn: Any, x: PolicyBatch, logp_old: torch.Tensor | None = None, **kw: Any) -> tuple[Any, ...]:
    """Per-token loss and the gradient of its plain sum (the per-token gradient, before aggregation)."""
    logp = x.logp.detach().clone().requires_grad_(True)
    old = x.logp_old if logp_old is None else logp_old
    out = fn(logp, old, x.advantages, x.mask, **kw)
    loss = out[0] if isinstance(out, tuple) else out
    (grad,) = torch.autograd.grad(loss.sum(), logp)
    return loss.detach(), grad


@given(policy_batches(b=(1, 4), t=(1, 6), max_log_ratio=2.0), OPTIONS)
def test_value_and_gradient_match_the_float64_reference(x: PolicyBatch, opts: dict[str, Any]) -> None:
    """d L / d logp = -sg(w) A per token and L = -w A logp, w the clipped ratio of the chosen convention."""
    value, grad = _value_and_grad(cispo_loss, x, **opts)
    ref_value, ref_grad = _reference(x, opts)
    np.testing.assert_allclose(value.numpy(), ref_value, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grad.numpy(), ref_grad, rtol=1e-12, atol=1e-12)


@given(policy_batches(b=(1, 4), t=(1, 6)), OPTIONS, st.sampled_from(list(AggregationMode)))
def test_on_policy_gradient_is_reinforce_and_ppo_clip(
    x: PolicyBatch, opts: dict[str, Any], mode: AggregationMode
) -> None:
    """At logp == logp_old: w = 1, per-token gradient -A, and the aggregated gradient equals PPO-clip's."""
    x = PolicyBatch(x.logp, x.logp.clone(), x.advantages, x.mask)
    _, grad = _value_and_grad(cispo_loss, x, **opts)
    adv = x.advantages.unsqueeze(-1) if x.advantages.ndim == 1 else x.advantages
    torch.testing.assert_close(grad, torch.where(x.mask, -adv.expand_as(grad), 0.0), rtol=0, atol=0)
    grads = []
    for fn in (cispo_loss, clipped_ratio_loss):
        logp = x.logp.detach().clone().requires_grad_(True)
        loss, _ = fn(logp, x.logp_old, x.advantages, x.mask)
        grads.append(torch.autograd.grad(aggregate(loss, x.mask, mode, horizon=8), logp)[0])
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-15)


@given(policy_batches(b=(1, 4), t=(1, 6), max_log_ratio=30.0, dtype=torch.float32), OPTIONS)
def test_weight_never_leaves_the_clip_range(x: PolicyBatch, opts: dict[str, Any]) -> None:
    """The weight -grad/A (log-ratios up to +-30, float32) lies in [lo, hi]; clip_frac counts the clamped tokens."""
    _, grad = _value_and_grad(cispo_loss, x, **opts)
    _, diag = cispo_loss(x.logp, x.logp_old, x.advantages, x.mask, **opts)
    adv = (x.advantages.unsqueeze(-1) if x.advantages.ndim == 1 else x.advantages).expand_as(grad)
    live = x.mask & (adv.abs() >= torch.finfo(adv.dtype).tiny)  # subnormal products lose relative precision
    weight = (-grad[live] / adv[live]).double()
    lo, hi = _bounds(opts)
    assert bool((weight <= hi * (1 + 1e-6)).all()) and bool((weight >= lo * (1 - 1e-6)).all())
    ratio = torch.exp((x.logp - x.logp_old).clamp(-20, 20).double())
    clamped = ((ratio < np.float32(lo)) | (ratio > np.float32(hi))) & x.mask
    assert abs(float(diag.clip_frac) - float(clamped.sum()) / float(x.mask.sum())) <= 1.0 / float(x.mask.sum())


@given(policy_batches(b=(1, 4), t=(2, 6), token_advantages=True), OPTIONS, st.data())
def test_masked_positions_never_reach_value_or_gradient(x: PolicyBatch, opts: dict[str, Any], data: Any) -> None:
    """NaN written at masked positions of logp, logp_old and advantages changes no value or gradient bit."""
    mask = data.draw(response_masks(tuple(x.mask.shape)))
    clean = PolicyBatch(x.logp, x.logp_old, x.advantages, mask)
    nan = torch.tensor(float("nan"), dtype=x.logp.dtype)
    logp, logp_old, adv = (torch.where(mask, t, nan) for t in (x.logp, x.logp_old, x.advantages))
    dirty = PolicyBatch(logp, logp_old, adv, mask)
    value_c, grad_c = _value_and_grad(cispo_loss, clean, **opts)
    value_d, grad_d = _value_and_grad(cispo_loss, dirty, **opts)
    assert torch.equal(value_c, value_d) and torch.equal(grad_c, grad_d)
    assert bool((value_d[~mask] == 0).all()) and bool((grad_d[~mask] == 0).all())


@given(policy_batches(b=(1, 4), t=(1, 6), max_log_ratio=3.0), VERL, st.floats(1.0, 10.0))
def test_verl_weight_is_the_minimax_weight_clamped(x: PolicyBatch, verl: dict[str, Any], cap: float) -> None:
    """With cap >= 1 + eps_high, clip(r, 1-eps_l, 1+eps_h) = clip(min(r, cap), 1-eps_l, 1+eps_h): the conventions
    agree exactly wherever the ratio lies inside both ranges, and the verl weight is the minimax one clamped."""
    cap = max(cap, 1.0 + verl["clip_high"])
    _, g_verl = _value_and_grad(cispo_loss, x, **verl)
    _, g_mm = _value_and_grad(cispo_loss, x, clip_mode="minimax", clip_high=cap)
    adv = (x.advantages.unsqueeze(-1) if x.advantages.ndim == 1 else x.advantages).expand_as(g_mm)
    lo, hi = _bounds(verl)
    ratio = torch.exp(x.logp - x.logp_old)
    inside = x.mask & (ratio >= lo) & (ratio <= hi)
    torch.testing.assert_close(g_verl[inside], g_mm[inside], rtol=0, atol=0)
    live = x.mask & (adv != 0)
    w_mm = -g_mm[live] / adv[live]
    torch.testing.assert_close(g_verl[live], -adv[live] * w_mm.clamp(lo, hi), rtol=1e-12, atol=1e-12)


@given(policy_batches(b=(1, 4), t=(1, 6), max_log_ratio=3.0), st.floats(1.0, 5.0))
def test_minimax_gradient_is_truncated_is(x: PolicyBatch, cap: float) -> None:
    """min(r, C) with C >= 1 is truncated importance sampling: same gradient as ``truncated_is_loss``."""
    _, g_cispo = _value_and_grad(cispo_loss, x, clip_mode="minimax", clip_high=cap)
    _, g_tis = _value_and_grad(truncated_is_loss, x, cap=cap)
    torch.testing.assert_close(g_cispo, g_tis, rtol=1e-12, atol=1e-15)


@settings(max_examples=50)
@given(policy_batches(b=(1, 4), t=(1, 6), max_log_ratio=3.0), OPTIONS, st.data())
def test_on_policy_tokens_have_weight_one_as_sis_substitution(x: PolicyBatch, opts: dict[str, Any], data: Any) -> None:
    """``on_policy=acc`` equals the SIS substitution ``logp_old <- sg(logp)`` on ``acc``: weight 1 there, -A."""
    acc = data.draw(response_masks(tuple(x.mask.shape)))
    v_flag, g_flag = _value_and_grad(cispo_loss, x, on_policy=acc, **opts)
    v_sub, g_sub = _value_and_grad(cispo_loss, x, logp_old=sis_logp_old(x.logp, x.logp_old, acc), **opts)
    torch.testing.assert_close(v_flag, v_sub, rtol=0, atol=0)
    torch.testing.assert_close(g_flag, g_sub, rtol=0, atol=0)
    adv = (x.advantages.unsqueeze(-1) if x.advantages.ndim == 1 else x.advantages).expand_as(g_flag)
    on = acc & x.mask
    torch.testing.assert_close(g_flag[on], -adv[on], rtol=0, atol=0)
    _, g_off = _value_and_grad(cispo_loss, x, **opts)
    torch.testing.assert_close(g_flag[~acc], g_off[~acc], rtol=0, atol=0)
