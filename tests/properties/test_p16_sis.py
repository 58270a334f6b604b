"""Spec 16 section 8: selective importance sampling (rejection test, SIS ratio, limits)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from posttrain.errors import ShapeError
from posttrain.estimators import (
    aggregate,
    clipped_ratio_loss,
    gspo_loss,
    no_correction_loss,
    sis_accept,
    sis_acceptance_prob,
    sis_logp_old,
    sis_loss,
    truncated_is_loss,
)
from posttrain.estimators.importance import sis_divergence, sis_rejection_test, token_in_topk
from posttrain.estimators.losses import sis_gspo_loss


class Batch:
    """Random behaviour and current softmax policies over V tokens at B x T positions, tokens drawn from mu."""

    def __init__(self, seed: int, b: int, t: int, v: int, k: int, drift: float, dtype: torch.dtype = torch.float64):
        g = torch.Generator().manual_seed(seed)
        self.old_logits = torch.randn(b, t, v, generator=g, dtype=dtype)
        self.cur_logits = self.old_logits + drift * torch.randn(b, t, v, generator=g, dtype=dtype)
        old_all = torch.log_softmax(self.old_logits, -1)
        cur_all = torch.log_softmax(self.cur_logits, -1)
        self.tokens = torch.multinomial(old_all.exp().reshape(-1, v), 1, generator=g).reshape(b, t)
        self.topk_idx = old_all.topk(k, dim=-1).indices
        self.in_topk = token_in_topk(self.tokens, self.topk_idx)
        self.old_topk = old_all.gather(-1, self.topk_idx)
        self.cur_topk = cur_all.gather(-1, self.topk_idx)
        self.logp_old = old_all.gather(-1, self.tokens.unsqueeze(-1)).squeeze(-1)
        self.logp = cur_all.gather(-1, self.tokens.unsqueeze(-1)).squeeze(-1)
        self.adv = torch.randn(b, generator=g, dtype=dtype)
        self.mask = torch.rand(b, t, generator=g) < 0.8
        self.mask[:, 0] = True
        self.u = torch.rand(b, t, generator=g, dtype=dtype)

    def accept_prob(self, logp: torch.Tensor | None = None, *, topk_rule: bool = False) -> torch.Tensor:
        """Released acceptance (no top-K rule); ``topk_rule`` gives the earlier reconstruction."""
        lp = self.logp if logp is None else logp
        return sis_acceptance_prob(lp, self.logp_old, self.cur_topk, self.old_topk, self.in_topk if topk_rule else None)


batches = st.builds(
    Batch,
    seed=st.integers(0, 10_000),
    b=st.integers(1, 5),
    t=st.integers(1, 6),
    v=st.integers(2, 7),
    k=st.just(2),
    drift=st.floats(0.0, 1.5),
)


def _loss_and_grad(fn, logp: torch.Tensor, *args, **kw):  # type: ignore[no-untyped-def]
    x = logp.detach().clone().requires_grad_(True)
    out = fn(x, *args, **kw)
    loss = out[0] if isinstance(out, tuple) else out
    mask = args[2]
    total = aggregate(loss, mask)
    (grad,) = torch.autograd.grad(total, x)
    return loss.detach(), grad


@given(seed=st.integers(0, 10_000), b=st.integers(1, 5), t=st.integers(1, 6), v=st.integers(2, 7))
def test_on_policy_limit_is_plain_grpo(seed: int, b: int, t: int, v: int) -> None:
    x = Batch(seed, b, t, v, k=v, drift=0.0)
    acc = sis_accept(x.accept_prob(), x.u)
    assert bool(acc[x.mask].all())  # mu == pi, K = V: every token accepted
    got = _loss_and_grad(sis_loss, x.logp, x.logp_old, x.adv, x.mask, acc)
    ref = _loss_and_grad(clipped_ratio_loss, x.logp, x.logp_old, x.adv, x.mask)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


@given(x=batches)
def test_no_acceptance_is_clipped_token_is(x: Batch) -> None:
    acc = sis_accept(x.accept_prob(), torch.ones_like(x.u))  # u == 1 never accepts
    assert not bool(acc.any())
    got = _loss_and_grad(sis_loss, x.logp, x.logp_old, x.adv, x.mask, acc, clip_high=0.28)
    ref = _loss_and_grad(clipped_ratio_loss, x.logp, x.logp_old, x.adv, x.mask, clip_high=0.28)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


@given(x=batches, zeros=st.booleans(), topk_rule=st.booleans())
def test_one_pass_rejection_test_equals_probability_then_accept(x: Batch, zeros: bool, topk_rule: bool) -> None:
    """``sis_rejection_test`` == ``sis_accept(sis_acceptance_prob(...), u)`` exactly, also for u = 0 draws."""
    u = torch.where(torch.arange(x.u.numel()).reshape(x.u.shape) % 2 == 0, 0.0, x.u) if zeros else x.u
    in_topk = x.in_topk if topk_rule else None
    want = sis_accept(x.accept_prob(topk_rule=topk_rule), u)
    got = sis_rejection_test(x.logp, x.logp_old, x.cur_topk, x.old_topk, in_topk, u)
    assert torch.equal(got, want)
    none = sis_rejection_test(x.logp, x.logp_old, x.cur_topk[..., :0], x.old_topk[..., :0], x.in_topk, u)
    assert not bool(none.any())  # K = 0 with the top-K rule: nothing is accepted


def test_released_test_accepts_tokens_outside_the_top_k() -> None:
    """The released test has no membership rule: outside the top-K, a = min(1, rho/M) like any other token."""
    x = Batch(21, 64, 8, 6, k=2, drift=0.8)
    released, topk = x.accept_prob(), x.accept_prob(topk_rule=True)
    outside = ~x.in_topk
    assert bool(outside.any())
    assert bool((topk[outside] == 0).all()) and bool((released[outside] > 0).all())
    log_m = (x.cur_topk - x.old_topk).amax(-1)
    want = torch.exp((x.logp - x.logp_old - log_m).clamp(max=0.0))
    torch.testing.assert_close(released[outside], want[outside], rtol=1e-12, atol=0)
    assert torch.equal(released[x.in_topk], topk[x.in_topk])  # inside the top-K both forms agree
    m = x.mask
    assert float(released[m].mean()) > float(topk[m].mean())  # a higher accept rate


@given(x=batches, dual=st.sampled_from([None, 3.0]), token_adv=st.booleans())
def test_fused_loss_equals_loss_on_substituted_logp_old(x: Batch, dual: float | None, token_adv: bool) -> None:
    """``sis_loss`` (substitution inside the loss's log-ratio) == the plain loss on ``sis_logp_old``: value,
    gradient and clip diagnostics, whatever the acceptance pattern."""
    acc = sis_accept(x.accept_prob(), x.u)
    adv = x.adv.unsqueeze(-1) * torch.linspace(0.5, 1.5, x.mask.shape[1], dtype=x.adv.dtype) if token_adv else x.adv
    lp = x.logp.clone().requires_grad_(True)
    got, diag = sis_loss(lp, x.logp_old, adv, x.mask, acc, clip_high=0.28, dual_clip=dual)
    (g_got,) = torch.autograd.grad(aggregate(got, x.mask), lp)
    want, clip = clipped_ratio_loss(lp, sis_logp_old(lp, x.logp_old, acc), adv, x.mask, clip_high=0.28, dual_clip=dual)
    (g_want,) = torch.autograd.grad(aggregate(want, x.mask), lp)
    assert torch.equal(got.detach(), want.detach()) and torch.equal(g_got, g_want)
    for a, b in zip(diag.clip, clip, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


@given(x=batches)
def test_weight_is_one_or_rho_with_score_gradient(x: Batch) -> None:
    acc = sis_accept(x.accept_prob(), x.u)
    lp = x.logp.clone().requires_grad_(True)
    ratio = torch.exp(lp - sis_logp_old(lp, x.logp_old, acc))
    rho = torch.exp(x.logp - x.logp_old)
    assert torch.equal(ratio.detach()[acc], torch.ones_like(rho)[acc])
    torch.testing.assert_close(ratio.detach()[~acc], rho[~acc], rtol=0, atol=0)
    (grad,) = torch.autograd.grad(ratio.sum(), lp)
    torch.testing.assert_close(grad[acc], torch.ones_like(rho)[acc])  # d e^{l - sg(l)} / dl = 1
    torch.testing.assert_close(grad[~acc], rho[~acc])


@given(x=batches)
def test_acceptance_probability_range_and_limits(x: Batch) -> None:
    a, a_topk = x.accept_prob(), x.accept_prob(topk_rule=True)
    assert bool(((a >= 0) & (a <= 1)).all()) and bool(((a_topk >= 0) & (a_topk <= 1)).all())
    assert bool((a_topk[~x.in_topk] == 0).all())
    log_m = (x.cur_topk - x.old_topk).amax(-1)
    above = x.logp - x.logp_old >= log_m
    assert bool((a[above] == 1).all()) and bool((a_topk[above & x.in_topk] == 1).all())
    assert bool((a[x.logp == x.logp_old] == 1).all())  # a log-ratio of exactly 0 is always accepted


def test_exact_rejection_sampling_recovers_pi() -> None:
    """K = V: accepted proposals y ~ mu are distributed as pi (chi-square goodness of fit, 1e5 draws)."""
    g = torch.Generator().manual_seed(7)
    v, n = 5, 100_000
    mu = torch.log_softmax(torch.randn(v, generator=g, dtype=torch.float64), -1)
    pi = torch.log_softmax(torch.randn(v, generator=g, dtype=torch.float64), -1)
    y = torch.multinomial(mu.exp(), n, replacement=True, generator=g).reshape(1, n)
    idx = torch.arange(v).expand(1, n, v)
    a = sis_acceptance_prob(pi[y], mu[y], pi.expand(1, n, v), mu.expand(1, n, v), token_in_topk(y, idx))
    acc = sis_accept(a, torch.rand(1, n, generator=g, dtype=torch.float64))
    counts = torch.bincount(y[acc], minlength=v).numpy()
    expected = pi.exp().numpy() * counts.sum()
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    # a wrong target is rejected by the same test (the test has power at this sample size)
    assert stats.chisquare(counts, mu.exp().numpy() * counts.sum()).pvalue < 1e-6


def test_expected_weight_matches_closed_form() -> None:
    """E_u[rho_tilde | y] = rho + a (1 - rho), Monte Carlo over u with a 4-sigma tolerance."""
    x = Batch(3, 4, 5, 6, k=3, drift=0.8)
    a = x.accept_prob()
    rho = torch.exp(x.logp - x.logp_old)
    n = 20_000
    u = torch.rand(n, *a.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    w = torch.where(u < a, torch.ones_like(rho), rho)
    mean, se = w.mean(0), w.std(0) / n**0.5
    closed = rho + a * (1 - rho)
    assert bool(((mean - closed).abs() <= 4 * se + 1e-12).all())


@given(x=batches, clip=st.sampled_from([(0.2, 0.2), (0.2, 0.28), (1.0, 0.5)]))
def test_divergence_is_the_released_per_sequence_mean(x: Batch, clip: tuple[float, float]) -> None:
    """D per sequence, by a loop over tokens: accepted |log rho| in full, rejected |log rho| clipped to the PPO
    range, divided by the length; D_sis keeps only the rejected part (so D_sis <= D_orig)."""
    acc = sis_accept(x.accept_prob(), x.u)
    lo, hi = clip
    d_orig, d_sis = sis_divergence(x.logp, x.logp_old, acc, x.mask, clip_low=lo, clip_high=hi)
    lr = (x.logp - x.logp_old).tolist()
    for b in range(x.mask.shape[0]):
        tot_o = tot_s = 0.0
        n = int(x.mask[b].sum())
        for t in range(x.mask.shape[1]):
            if not x.mask[b, t]:
                continue
            c = abs(min(max(lr[b][t], np.log(1 - lo) if lo < 1 else -np.inf), np.log(1 + hi)))
            tot_o += abs(lr[b][t]) if acc[b, t] else c
            tot_s += 0.0 if acc[b, t] else c
        assert abs(float(d_orig[b]) - tot_o / max(n, 1)) < 1e-12
        assert abs(float(d_sis[b]) - tot_s / max(n, 1)) < 1e-12
    assert bool((d_sis <= d_orig).all())


@given(x=batches)
def test_unclipped_sums_bound_the_sequence_gap(x: Batch) -> None:
    """The theory's quantity (unclipped sums of |log rho|): |prod rho_tilde - 1| <= e^{D_sis} - 1 <= e^{D_orig} - 1."""
    acc = sis_accept(x.accept_prob(), x.u)
    abs_lr = torch.where(x.mask, (x.logp - x.logp_old).abs(), torch.zeros_like(x.logp))
    d_orig, d_sis = abs_lr.sum(-1), torch.where(acc, torch.zeros_like(abs_lr), abs_lr).sum(-1)
    log_w = torch.where(x.mask & ~acc, x.logp - x.logp_old, torch.zeros_like(x.logp)).sum(-1)
    assert bool(((log_w.exp() - 1).abs() <= torch.expm1(d_sis) + 1e-12).all())
    assert bool((torch.expm1(d_sis) <= torch.expm1(d_orig)).all())


def test_no_gradient_through_the_test() -> None:
    x = Batch(11, 4, 6, 5, k=3, drift=0.6)
    lp = x.logp.clone().requires_grad_(True)
    a = sis_acceptance_prob(lp, x.logp_old, x.cur_topk, x.old_topk, x.in_topk)
    assert not a.requires_grad
    acc = sis_accept(a, x.u)
    cur2 = x.cur_topk + 1e-8
    acc2 = sis_accept(sis_acceptance_prob(lp, x.logp_old, cur2, x.old_topk, x.in_topk), x.u)
    assert torch.equal(acc, acc2)  # no flip at this perturbation for this draw
    g1 = _loss_and_grad(sis_loss, x.logp, x.logp_old, x.adv, x.mask, acc)[1]
    g2 = _loss_and_grad(sis_loss, x.logp, x.logp_old, x.adv, x.mask, acc2)[1]
    assert torch.equal(g1, g2)


def test_support_column_impossible_under_both_policies_rejects_without_nan() -> None:
    x = Batch(12, 4, 6, 5, k=3, drift=0.6)
    cur, old = x.cur_topk.clone(), x.old_topk.clone()
    cur[0, 0, 1] = old[0, 0, 1] = -torch.inf  # e.g. top-k sampling: zero mass under both policies
    a = sis_acceptance_prob(x.logp, x.logp_old, cur, old, x.in_topk)
    assert torch.isfinite(a).all() and a[0, 0] == 0
    assert torch.equal(sis_accept(a, x.u), sis_rejection_test(x.logp, x.logp_old, cur, old, x.in_topk, x.u))


@given(x=batches)
def test_masked_positions_never_matter(x: Batch) -> None:
    acc = sis_accept(x.accept_prob(), x.u)
    junk = torch.where(x.mask, torch.zeros_like(x.logp), torch.full_like(x.logp, 3.0))
    loss1, d1 = sis_loss(x.logp, x.logp_old, x.adv, x.mask, acc)
    loss2, d2 = sis_loss(x.logp + junk, x.logp_old - junk, x.adv, x.mask, acc | ~x.mask)
    assert torch.equal(loss1, loss2)
    assert torch.equal(d1.accept_rate, d2.accept_rate)
    assert torch.equal(d1.d_orig, d2.d_orig) and torch.equal(d1.d_sis, d2.d_sis)


def test_same_u_same_loss_and_sis_composes_with_gspo() -> None:
    x = Batch(5, 3, 4, 6, k=6, drift=0.0)
    acc = sis_accept(x.accept_prob(), x.u)
    assert torch.equal(
        sis_loss(x.logp, x.logp_old, x.adv, x.mask, acc)[0], sis_loss(x.logp, x.logp_old, x.adv, x.mask, acc)[0]
    )
    got = gspo_loss(x.logp, sis_logp_old(x.logp, x.logp_old, acc), x.adv, x.mask)[0]
    assert torch.equal(got, gspo_loss(x.logp, x.logp_old, x.adv, x.mask)[0])  # on-policy: SIS is a no-op


@given(x=batches)
def test_baselines_values(x: Batch) -> None:
    rho = torch.exp(x.logp - x.logp_old)
    adv = x.adv.unsqueeze(-1).expand_as(rho)
    tis = truncated_is_loss(x.logp, x.logp_old, x.adv, x.mask, cap=1.5)
    torch.testing.assert_close(tis[x.mask], (-adv * rho.clamp(max=1.5))[x.mask])
    nc = no_correction_loss(x.logp, x.logp_old, x.adv, x.mask)
    torch.testing.assert_close(nc[x.mask], -adv[x.mask])
    assert bool((tis[~x.mask] == 0).all() and (nc[~x.mask] == 0).all())


def test_bad_inputs_raise() -> None:
    x = Batch(1, 2, 3, 4, k=2, drift=0.1)
    with pytest.raises(ShapeError, match="cur_topk_logp"):
        sis_acceptance_prob(x.logp, x.logp_old, x.cur_topk[:, :1], x.old_topk[:, :1], x.in_topk)
    with pytest.raises(ShapeError, match="accepted"):
        sis_loss(x.logp, x.logp_old, x.adv, x.mask, x.mask.float())  # type: ignore[arg-type]
    with pytest.raises(ShapeError, match="topk_idx"):
        token_in_topk(x.tokens, x.topk_idx[:1])


@settings(max_examples=10)
@given(seed=st.integers(0, 100))
def test_float32_matches_float64(seed: int) -> None:
    x = Batch(seed, 3, 4, 5, k=3, drift=0.5)
    acc = sis_accept(x.accept_prob(), x.u)
    l64 = sis_loss(x.logp, x.logp_old, x.adv, x.mask, acc)[0]
    l32 = sis_loss(x.logp.float(), x.logp_old.float(), x.adv.float(), x.mask, acc)[0]
    np.testing.assert_allclose(l32.numpy(), l64.numpy(), rtol=1e-5, atol=1e-6)


@given(x=batches)
def test_sis_gspo_limits(x: Batch) -> None:
    """No token accepted: exactly GSPO. Every token accepted: ratio 1 everywhere, the on-policy GRPO loss."""
    none = torch.zeros_like(x.mask)
    got = _loss_and_grad(sis_gspo_loss, x.logp, x.logp_old, x.adv, x.mask, none)
    ref = _loss_and_grad(gspo_loss, x.logp, x.logp_old, x.adv, x.mask)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-12, atol=1e-15)
    every = torch.ones_like(x.mask)
    got = _loss_and_grad(sis_gspo_loss, x.logp, x.logp_old, x.adv, x.mask, every)
    ref = _loss_and_grad(clipped_ratio_loss, x.logp, x.logp.detach(), x.adv, x.mask)
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], ref[1], rtol=0, atol=0)


@given(x=batches)
def test_sis_gspo_accepted_tokens_keep_the_score_gradient(x: Batch) -> None:
    """Released GSPO + SIS: an accepted token's loss is -A e^{l - sg(l)} whatever its sequence's ratio (no clip);
    the rejected tokens see the sequence ratio of the rejected tokens only."""
    acc = sis_accept(x.accept_prob(), x.u) & x.mask
    lp = x.logp.clone().requires_grad_(True)
    loss, diag = sis_gspo_loss(lp, x.logp_old, x.adv, x.mask, acc)
    (grad,) = torch.autograd.grad(loss.sum(), lp)
    adv = x.adv.unsqueeze(-1).expand_as(lp)
    torch.testing.assert_close(loss.detach()[acc], -adv[acc])
    torch.testing.assert_close(grad[acc], -adv[acc])  # d(-A e^{l - sg(l)})/dl = -A, never clipped to 0
    rej = x.mask & ~acc
    lr = torch.where(rej, x.logp - x.logp_old, torch.zeros_like(x.logp))
    s_rej = torch.exp(lr.sum(-1) / rej.sum(-1).clamp(min=1)).unsqueeze(-1).expand_as(lp)
    want = torch.maximum(-adv * s_rej, -adv * s_rej.clamp(1 - 3e-4, 1 + 4e-4))
    torch.testing.assert_close(loss.detach()[rej], want[rej], rtol=1e-9, atol=1e-12)
    assert bool((loss.detach()[~x.mask] == 0).all())
    assert diag.d_sis is not None and diag.d_orig is not None and bool((diag.d_sis <= diag.d_orig).all())


def test_earlier_gspo_composition_drops_accepted_gradients() -> None:
    """The difference from the earlier reconstruction: gspo_loss(logp, sis_logp_old(...)) clips accepted tokens too."""
    x = Batch(4, 16, 6, 5, k=5, drift=0.6)
    acc = sis_accept(x.accept_prob(), x.u) & x.mask
    earlier = _loss_and_grad(gspo_loss, x.logp, sis_logp_old(x.logp, x.logp_old, acc), x.adv, x.mask)[1]
    released = _loss_and_grad(sis_gspo_loss, x.logp, x.logp_old, x.adv, x.mask, acc)[1]
    assert bool((released[acc] != 0).all())
    assert bool((earlier[acc] == 0).any())  # accepted tokens of sequences whose ratio left GSPO's tiny clip range
