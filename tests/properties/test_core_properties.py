"""Mathematical properties of the core estimators (hypothesis, float64).

Tolerances: identities that hold exactly in real arithmetic are checked at a few float64 ulps of
the quantities involved. Where a group-normalised advantage divides a centred reward by
``std + eps`` with ``eps = 1e-6``, one rounding (~1e-15 absolute) can become ~1e-9, hence 1e-8.
The statistical test states its z and standard error inline.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from posttrain.estimators import (
    aggregate,
    clipped_ratio_loss,
    group_normalized_advantages,
    gspo_loss,
    k1_kl,
    k2_kl,
    k3_kl,
    masked_whiten,
    mean_at_k,
    pass_at_k,
    reinforce_pp_advantages,
    rloo_advantages,
)
from posttrain.testing import PolicyBatch, grouped_rewards, log_probs, policy_batches, response_masks, token_tensors

GROUP_TOL: dict[str, Any] = dict(rtol=1e-8, atol=1e-8)
ULPS: dict[str, Any] = dict(rtol=1e-12, atol=1e-12)
MODES = ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


# --- group advantages --------------------------------------------------------------------------


@given(grouped_rewards(k=(1, 8)), st.booleans())
def test_group_advantages_sum_to_zero_per_group(rewards: torch.Tensor, scale: bool) -> None:
    adv = group_normalized_advantages(rewards, scale_by_std=scale)
    # |A| <= (K-1)/sqrt(K) with std scaling, <= 10 without: the row sum is a few ulps of that.
    torch.testing.assert_close(adv.sum(-1), torch.zeros(rewards.shape[0], dtype=adv.dtype), rtol=0, atol=1e-12)


@given(grouped_rewards(k=(2, 8)))
def test_rloo_sums_to_zero_and_equals_scaled_centred(rewards: torch.Tensor) -> None:
    k = rewards.shape[-1]
    rloo = rloo_advantages(rewards)
    torch.testing.assert_close(rloo.sum(-1), torch.zeros(rewards.shape[0], dtype=rloo.dtype), rtol=0, atol=1e-12)
    centred = group_normalized_advantages(rewards, scale_by_std=False)
    torch.testing.assert_close(rloo, centred * k / (k - 1), **ULPS)


@given(grouped_rewards(k=(1, 8)), st.data(), st.booleans())
def test_group_advantages_invariant_to_a_constant_per_group(
    rewards: torch.Tensor, data: st.DataObject, scale: bool
) -> None:
    shift = data.draw(token_tensors((rewards.shape[0], 1), low=-5, high=5))
    before = group_normalized_advantages(rewards, scale_by_std=scale)
    after = group_normalized_advantages(rewards + shift, scale_by_std=scale)
    torch.testing.assert_close(after, before, **GROUP_TOL)


@given(grouped_rewards(k=(2, 8)), st.floats(0.01, 100.0), st.sampled_from([1e-6, 1e-4]))
def test_group_advantages_scale_invariant_with_std_scaling(rewards: torch.Tensor, s: float, eps: float) -> None:
    # Exact statement: A(sR; s*eps) = A(R; eps); with eps fixed the invariance is only as eps -> 0.
    torch.testing.assert_close(
        group_normalized_advantages(rewards * s, eps=eps * s),
        group_normalized_advantages(rewards, eps=eps),
        **GROUP_TOL,
    )
    # Without std scaling (Dr.GRPO) advantages scale linearly instead.
    torch.testing.assert_close(
        group_normalized_advantages(rewards * s, scale_by_std=False),
        s * group_normalized_advantages(rewards, scale_by_std=False),
        rtol=1e-12,
        atol=1e-12 * s,
    )


@given(grouped_rewards(k=(2, 8), constant_groups=False))
def test_std_scaled_advantages_have_unit_sample_std_as_eps_vanishes(rewards: torch.Tensor) -> None:
    assume(bool((rewards.std(-1) > 1e-3).all()))
    adv = group_normalized_advantages(rewards, eps=1e-12)
    torch.testing.assert_close(adv.std(-1), torch.ones(rewards.shape[0], dtype=adv.dtype), rtol=1e-8, atol=0)


# --- clipped-ratio loss -----------------------------------------------------------------------


def _grad_of_sum(batch: PolicyBatch, logp: torch.Tensor, **kw: float | None) -> torch.Tensor:
    lp = logp.clone().requires_grad_(True)
    loss, _ = clipped_ratio_loss(lp, batch.logp_old, batch.advantages, batch.mask, **kw)  # type: ignore[arg-type]
    loss.sum().backward()
    assert lp.grad is not None
    return lp.grad


def _token_adv(batch: PolicyBatch) -> torch.Tensor:
    return batch.advantages.unsqueeze(-1).expand_as(batch.logp) if batch.advantages.ndim == 1 else batch.advantages


@given(policy_batches(), st.sampled_from([None, 3.0]))
def test_at_ratio_one_clipped_loss_has_vanilla_policy_gradient(batch: PolicyBatch, dual: float | None) -> None:
    # r = 1 everywhere: d/dlogp of -A r is -A (the REINFORCE gradient) on valid tokens, 0 elsewhere.
    grad = _grad_of_sum(batch, batch.logp_old, dual_clip=dual)
    want = torch.where(batch.mask, -_token_adv(batch), torch.zeros_like(grad))
    torch.testing.assert_close(grad, want, rtol=0, atol=0)


@given(policy_batches(max_log_ratio=1.0), st.sampled_from([(0.2, 0.2), (0.2, 0.28)]), st.sampled_from([None, 1.5]))
def test_gradient_is_zero_exactly_where_clipping_is_active(
    batch: PolicyBatch, clips: tuple[float, float], dual: float | None
) -> None:
    lo, hi = clips
    r = torch.exp(batch.logp - batch.logp_old)
    bounds = [1 - lo, 1 + hi] + ([dual] if dual is not None else [])
    assume(all(bool(((r - b).abs() > 1e-9).all()) for b in bounds))  # no ties at a clip boundary
    a = _token_adv(batch)
    active = ((a > 0) & (r > 1 + hi)) | ((a < 0) & (r < 1 - lo))
    if dual is not None:
        active |= (a < 0) & (r > dual)
    grad = _grad_of_sum(batch, batch.logp, clip_low=lo, clip_high=hi, dual_clip=dual)
    zero_expected = active | ~batch.mask | (a == 0)
    assert bool((grad[zero_expected] == 0).all())
    assert bool((grad[~zero_expected] != 0).all())
    torch.testing.assert_close(grad[~zero_expected], (-a * r)[~zero_expected], **ULPS)


@given(policy_batches(max_log_ratio=0.5))
def test_clipped_loss_with_wide_clip_is_the_unclipped_surrogate(batch: PolicyBatch) -> None:
    # Limiting case: clip range beyond any ratio drawn (|log r| <= 0.5) gives L = -A r.
    loss, diag = clipped_ratio_loss(
        batch.logp, batch.logp_old, batch.advantages, batch.mask, clip_low=0.99, clip_high=5
    )
    r = torch.exp(batch.logp - batch.logp_old)
    torch.testing.assert_close(loss, torch.where(batch.mask, -_token_adv(batch) * r, torch.zeros_like(r)), **ULPS)
    assert float(diag.clip_frac) == 0.0


@given(policy_batches(t=1, max_log_ratio=0.5), st.sampled_from([(0.2, 0.2), (0.1, 0.3)]))
def test_gspo_on_one_token_sequences_is_ppo_clip(batch: PolicyBatch, clips: tuple[float, float]) -> None:
    # Limiting case: with |y_i| = 1 the sequence ratio is the token ratio (value and gradient).
    lo, hi = clips
    lp1, lp2 = batch.logp.clone().requires_grad_(True), batch.logp.clone().requires_grad_(True)
    g_loss, _ = gspo_loss(lp1, batch.logp_old, batch.advantages, batch.mask, clip_low=lo, clip_high=hi)
    p_loss, _ = clipped_ratio_loss(lp2, batch.logp_old, batch.advantages, batch.mask, clip_low=lo, clip_high=hi)
    torch.testing.assert_close(g_loss, p_loss, **ULPS)
    g_loss.sum().backward()
    p_loss.sum().backward()
    torch.testing.assert_close(lp1.grad, lp2.grad, **ULPS)


# --- masked positions ------------------------------------------------------------------------------


@given(policy_batches(), st.data())
def test_masked_positions_never_change_any_output(batch: PolicyBatch, data: st.DataObject) -> None:
    shape = batch.logp.shape
    junk = data.draw(token_tensors(shape, low=-1e4, high=1e4))
    m = batch.mask

    def scramble(x: torch.Tensor) -> torch.Tensor:
        return torch.where(m, x, junk) if x.shape == shape else x

    adv2 = scramble(batch.advantages)
    for fn in (clipped_ratio_loss, gspo_loss):
        loss_a, diag_a = fn(batch.logp, batch.logp_old, batch.advantages, m)
        loss_b, diag_b = fn(scramble(batch.logp), scramble(batch.logp_old), adv2, m)
        for x, y in zip((loss_a, *diag_a), (loss_b, *diag_b), strict=True):
            assert torch.equal(x, y), fn.__name__
    for mode in MODES:
        assert torch.equal(aggregate(batch.logp, m, mode), aggregate(scramble(batch.logp), m, mode)), mode
    assert torch.equal(masked_whiten(batch.logp, m), masked_whiten(scramble(batch.logp), m))
    assert torch.equal(reinforce_pp_advantages(batch.logp, m), reinforce_pp_advantages(scramble(batch.logp), m))


@given(policy_batches())
def test_premasked_aggregate_equals_masked_on_a_policy_loss(batch: PolicyBatch) -> None:
    """``premasked=True`` on a policy loss (0 off the mask) gives the masked aggregate and its gradient."""
    m = batch.mask
    for mode in MODES:
        values = {}
        grads = {}
        for premasked in (False, True):
            lp = batch.logp.detach().requires_grad_(True)
            loss, _ = clipped_ratio_loss(lp, batch.logp_old, batch.advantages, m, dual_clip=3.0)
            values[premasked] = aggregate(loss, m, mode, premasked=premasked)
            (grads[premasked],) = torch.autograd.grad(values[premasked], lp)
        torch.testing.assert_close(values[True], values[False], **ULPS)
        torch.testing.assert_close(grads[True], grads[False], **ULPS)


@given(policy_batches(), st.integers(1, 4), st.data())
def test_aggregation_independent_of_extra_padding(batch: PolicyBatch, extra: int, data: st.DataObject) -> None:
    values, m = batch.logp, batch.mask
    junk = data.draw(token_tensors((values.shape[0], extra), low=-1e4, high=1e4))
    padded_v = torch.cat([values, junk], dim=-1)
    padded_m = torch.cat([m, torch.zeros(values.shape[0], extra, dtype=torch.bool)], dim=-1)
    for mode in ["token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum"]:
        torch.testing.assert_close(aggregate(padded_v, padded_m, mode), aggregate(values, m, mode), **ULPS)
    # The constant-normaliser mode depends on T only through its default horizon.
    h = values.shape[-1]
    torch.testing.assert_close(
        aggregate(padded_v, padded_m, "seq-mean-token-sum-norm", horizon=h),
        aggregate(values, m, "seq-mean-token-sum-norm"),
        **ULPS,
    )


@given(policy_batches())
def test_whitened_advantages_are_centred_with_unit_variance(batch: PolicyBatch) -> None:
    m = batch.mask
    assume(int(m.sum()) >= 2)
    x = batch.logp
    valid = x[m]
    assume(float(valid.var()) > 1e-3)
    w = masked_whiten(x, m, eps=1e-12)
    torch.testing.assert_close(w[m].mean(), torch.zeros((), dtype=w.dtype), rtol=0, atol=1e-10)
    torch.testing.assert_close(w[m].var(), torch.ones((), dtype=w.dtype), rtol=1e-8, atol=0)
    assert bool((w[~m] == 0).all())


# --- KL estimators -------------------------------------------------------------------------------


@given(log_probs((4, 5), low=-50.0), log_probs((4, 5), low=-50.0))
def test_k2_and_k3_are_non_negative(logp: torch.Tensor, logp_ref: torch.Tensor) -> None:
    assert bool((k2_kl(logp, logp_ref) >= 0).all())
    assert bool((k3_kl(logp, logp_ref) >= 0).all())
    assert bool((k3_kl(logp, logp_ref, log_ratio_clamp=20.0, max_value=10.0) >= 0).all())


def test_k1_and_k3_are_unbiased_for_the_exact_kl_of_a_small_categorical() -> None:
    """Sample x ~ pi and average k(x); the mean must be within z = 4 standard errors of KL(pi || ref).

    SE = sample std / sqrt(N) with N = 200,000 draws (a fixed generator, so the test is
    deterministic); z = 4 makes a false alarm for an unbiased estimator about 6e-5 per comparison.
    k2 is biased (E[d^2/2] != KL in general): it is checked to differ by more than 4 SE in the
    first case, so the test can tell a biased estimator from an unbiased one.
    """
    gen = torch.Generator().manual_seed(0)
    n, z = 200_000, 4.0
    cases = [
        (torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]), torch.tensor([0.1, 0.2, 0.3, 0.2, 0.2])),
        (torch.tensor([0.25, 0.25, 0.25, 0.25]), torch.tensor([0.7, 0.1, 0.1, 0.1])),
        (torch.tensor([0.9, 0.1]), torch.tensor([0.85, 0.15])),
    ]
    for i, (p, q) in enumerate(cases):
        p, q = p.double(), q.double()
        exact = float((p * (p / q).log()).sum())
        x = torch.multinomial(p, n, replacement=True, generator=gen)
        logp, logp_ref = p.log()[x], q.log()[x]
        for fn in (k1_kl, k3_kl):
            est = fn(logp, logp_ref)
            se = float(est.std()) / math.sqrt(n)
            assert abs(float(est.mean()) - exact) <= z * se, (fn.__name__, i, float(est.mean()), exact, se)
        if i == 0:
            k2 = k2_kl(logp, logp_ref)
            assert abs(float(k2.mean()) - exact) > z * float(k2.std()) / math.sqrt(n)


# --- pass@k --------------------------------------------------------------------------------------


@settings(max_examples=40)
@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_subset_enumeration(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    subsets = list(itertools.combinations(range(n), k))  # samples 0..c-1 are the correct ones
    brute_pass = sum(any(i < c for i in s) for s in subsets) / len(subsets)
    brute_mean = sum(sum(i < c for i in s) / k for s in subsets) / len(subsets)
    assert math.isclose(float(pass_at_k(n, c, k)), brute_pass, rel_tol=1e-12, abs_tol=1e-12)
    assert math.isclose(float(mean_at_k(n, c, k)), brute_mean, rel_tol=1e-12, abs_tol=1e-12)
    if c in (0, n):
        assert float(pass_at_k(n, c, k)) == float(c == n)  # exact at the ends


@given(st.integers(2, 60).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n - 1))))
def test_pass_at_k_is_monotone_in_k_and_c(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    assert float(pass_at_k(n, c, k + 1)) >= float(pass_at_k(n, c, k))
    if c < n:
        assert float(pass_at_k(n, c + 1, k)) >= float(pass_at_k(n, c, k))


@given(response_masks((3, 4)), st.integers(1, 3))
def test_response_masks_have_a_token_in_every_row(mask: torch.Tensor, _: int) -> None:
    assert mask.dtype == torch.bool and bool(mask.any(-1).all())
