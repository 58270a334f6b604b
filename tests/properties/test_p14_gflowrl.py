"""Spec 14 section 8: GFlowRL flow gaps, in-batch log-partition, loss and gradient; FlowRL baseline."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators import aggregate, flow_gap, flowrl_loss, flowrl_optimal_log_z, gflowrl_loss, mc_log_partition

VARIANTS = ("paper", "normalized", "cprime")
AGG = "seq-mean-token-sum"  # mean over sequences of the per-sequence loss (Eq. 8)


class Groups:
    """G groups of K responses with T token positions, random log-probs and lengths (>= 1 unless ``empty``)."""

    def __init__(self, seed: int, g: int, k: int, t: int, *, empty: bool = False, binary: bool = True):
        gen = torch.Generator().manual_seed(seed)
        b = g * k
        self.g, self.k = g, k
        lengths = torch.randint(0 if empty else 1, t + 1, (b,), generator=gen)
        self.mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
        self.logp_ref = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 2
        self.logp_old = self.logp_ref - 0.3 * torch.randn(b, t, generator=gen, dtype=torch.float64)
        self.logp_old = self.logp_old.clamp(max=0)
        if binary:
            self.rewards = (torch.rand(g, k, generator=gen) < 0.5).to(torch.float64)
        else:
            self.rewards = torch.rand(g, k, generator=gen, dtype=torch.float64)


groups = st.builds(
    Groups, seed=st.integers(0, 10_000), g=st.integers(1, 3), k=st.integers(2, 5), t=st.integers(1, 4),
    binary=st.booleans(),
)  # fmt: skip


def _grad(loss_tok: torch.Tensor, mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    (grad,) = torch.autograd.grad(aggregate(loss_tok, mask, AGG), x)
    return grad


def _target_batch(seed: int, k: int, t: int, beta: float):  # type: ignore[no-untyped-def]
    """One prompt, 6 candidate sequences; pi_old = pi_theta = p* ∝ pi_ref e^{beta r}; K samples split over T tokens."""
    gen = torch.Generator().manual_seed(seed)
    n_seq = 6
    log_ref = torch.log_softmax(torch.randn(n_seq, generator=gen, dtype=torch.float64), -1)
    r = (torch.rand(n_seq, generator=gen) < 0.5).to(torch.float64)
    log_star = torch.log_softmax(log_ref + beta * r, -1)
    pick = torch.multinomial(log_star.exp(), k, replacement=True, generator=gen)
    split = torch.softmax(torch.randn(k, t, generator=gen, dtype=torch.float64), -1)  # token shares of a sequence
    logp = log_star[pick].unsqueeze(-1) * split
    logp_ref = log_ref[pick].unsqueeze(-1) * split
    return logp, logp_ref, r[pick].reshape(1, k), torch.logsumexp(log_ref + beta * r, -1)


@given(seed=st.integers(0, 10_000), k=st.integers(1, 8), t=st.integers(1, 4), beta=st.floats(0.1, 8.0))
def test_fixed_point_cprime_has_zero_gap_loss_and_gradient(seed: int, k: int, t: int, beta: float) -> None:
    logp, logp_ref, r, log_z = _target_batch(seed, k, t, beta)
    mask = torch.ones_like(logp, dtype=torch.bool)
    fg = flow_gap(r, logp, logp_ref, mask, beta=beta, variant="cprime")
    torch.testing.assert_close(fg.gap, torch.zeros_like(fg.gap), atol=1e-10, rtol=0)
    torch.testing.assert_close(fg.log_partition, log_z.reshape(1), atol=1e-10, rtol=0)  # Z_t = log Z exactly
    x = logp.clone().requires_grad_(True)
    loss, _ = gflowrl_loss(x, logp, logp_ref, r, mask, beta=beta, variant="cprime")
    assert float(aggregate(loss, mask, AGG).detach()) <= 1e-20
    torch.testing.assert_close(_grad(loss, mask, x), torch.zeros_like(x), atol=1e-10, rtol=0)


@given(x=groups, variant=st.sampled_from(VARIANTS))
def test_stop_gradient_and_precomputed_gap(x: Groups, variant: str) -> None:
    lp = (x.logp_old + 0.1).clamp(max=0).requires_grad_(True)
    old = x.logp_old.clone().requires_grad_(True)
    ref = x.logp_ref.clone().requires_grad_(True)
    rew = x.rewards.clone().requires_grad_(True)
    loss, _ = gflowrl_loss(lp, old, ref, rew, x.mask, variant=variant)
    grads = torch.autograd.grad(aggregate(loss, x.mask, AGG), [lp, old, ref, rew], allow_unused=True)
    assert all(g is None for g in grads[1:])
    fg = flow_gap(x.rewards, x.logp_old, x.logp_ref, x.mask, variant=variant)
    lp2 = lp.detach().clone().requires_grad_(True)
    loss2, _ = gflowrl_loss(lp2, x.logp_old, x.logp_ref, x.rewards, x.mask, variant=variant, gap=fg)
    assert torch.equal(grads[0], _grad(loss2, x.mask, lp2))


@given(x=groups, c=st.floats(-3, 3), variant=st.sampled_from(VARIANTS))
def test_reward_shift_invariance(x: Groups, c: float, variant: str) -> None:
    a = flow_gap(x.rewards, x.logp_old, x.logp_ref, x.mask, variant=variant).gap
    b = flow_gap(x.rewards + c, x.logp_old, x.logp_ref, x.mask, variant=variant).gap
    torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@given(x=groups, c=st.floats(-3, 3))
def test_reference_shift_invariance(x: Groups, c: float) -> None:
    first = torch.zeros_like(x.mask)
    first[:, 0] = True  # cprime: +c on S_ref_i (one token); normalized: +c on S_ref_i / L_i (every token)
    for variant, shift in (("cprime", first), ("normalized", x.mask)):
        a = flow_gap(x.rewards, x.logp_old, x.logp_ref, x.mask, variant=variant).gap
        b = flow_gap(x.rewards, x.logp_old, x.logp_ref + c * shift, x.mask, variant=variant).gap
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@given(x=groups)
def test_zero_sum_gap(x: Groups) -> None:
    for variant in ("cprime", "normalized"):
        g = flow_gap(x.rewards, x.logp_old, x.logp_ref, x.mask, variant=variant).gap
        torch.testing.assert_close(g.sum(-1), torch.zeros(x.g, dtype=torch.float64), atol=1e-10, rtol=0)


@given(x=groups, variant=st.sampled_from(VARIANTS), up=st.floats(0.0, 0.5), down=st.floats(0.0, 0.5))
def test_clip_bounds_and_gradient_coefficient(x: Groups, variant: str, up: float, down: float) -> None:
    fg = flow_gap(x.rewards, x.logp_old, x.logp_ref, x.mask, variant=variant, max_up=up, max_down=down)
    assert bool((fg.clipped_gap >= -up).all() and (fg.clipped_gap <= down).all())
    lp = x.logp_old.clone().requires_grad_(True)
    loss, _ = gflowrl_loss(lp, x.logp_old, x.logp_ref, x.rewards, x.mask, variant=variant, max_up=up, max_down=down)
    seq = (loss.sum(-1)).sum()
    (grad,) = torch.autograd.grad(seq, lp)
    lam = torch.ones_like(fg.lengths) if variant == "cprime" else fg.lengths
    coef = (grad * lam.reshape(-1, 1))[x.mask]  # d loss_i / d delta_i = 2 w (g~ + delta)
    assert bool((coef.abs() <= 2 * max(up, down) + 1e-12).all())


@given(x=groups, variant=st.sampled_from(VARIANTS))
def test_on_policy_equivalence_with_policy_gradient(x: Groups, variant: str) -> None:
    fg = flow_gap(x.rewards, x.logp_old, x.logp_ref, x.mask, variant=variant)
    lp = x.logp_old.clone().requires_grad_(True)
    loss, _ = gflowrl_loss(lp, x.logp_old, x.logp_ref, x.rewards, x.mask, variant=variant)
    got = _grad(loss, x.mask, lp)
    lp2 = x.logp_old.clone().requires_grad_(True)
    adv = (-2 * fg.clipped_gap).reshape(-1)
    per_len = torch.ones_like(adv) if variant == "cprime" else fg.lengths.reshape(-1).clamp(min=1)
    surrogate = -(adv / per_len * (lp2 * x.mask).sum(-1)).mean()
    (want,) = torch.autograd.grad(surrogate, lp2)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-10)


@given(x=groups)
def test_grpo_like_start(x: Groups) -> None:
    fg = flow_gap(x.rewards, x.logp_ref, x.logp_ref, x.mask, beta=3.0, variant="paper", max_up=1e9, max_down=1e9)
    want = 3.0 * (x.rewards.mean(-1, keepdim=True) - x.rewards)  # A = -2 g = 2 beta (r - rbar)
    torch.testing.assert_close(fg.gap, want, atol=1e-12, rtol=0)


def test_mc_log_partition_consistency_on_an_exact_bandit() -> None:
    """E[Z_t] = log Z - KL(pi_old || p*) <= log Z; the K-sample mean concentrates there (z = 4 standard errors)."""
    gen = torch.Generator().manual_seed(0)
    beta, a = 2.0, 8
    log_ref = torch.log_softmax(torch.randn(a, generator=gen, dtype=torch.float64), -1)
    r = (torch.arange(a) < 3).to(torch.float64)
    log_z = torch.logsumexp(log_ref + beta * r, -1)
    log_star = log_ref + beta * r - log_z
    for log_old in (torch.log_softmax(torch.randn(a, generator=gen, dtype=torch.float64), -1), log_star):
        score = beta * r + log_ref - log_old  # per-arm s_i
        p_old = log_old.exp()
        kl = (p_old * (log_old - log_star)).sum()
        exact_mean = (p_old * score).sum()
        torch.testing.assert_close(exact_mean, log_z - kl, atol=1e-12, rtol=0)
        assert float(exact_mean) <= float(log_z) + 1e-12
        k = 20_000
        arms = torch.multinomial(p_old, k, replacement=True, generator=gen)
        est = mc_log_partition(score[arms].reshape(1, k))
        sd = float(((p_old * (score - exact_mean) ** 2).sum()).sqrt())
        assert abs(float(est[0]) - float(exact_mean)) <= 4 * sd / math.sqrt(k) + 1e-12
    assert float(kl) < 1e-12  # the second policy is p*: equality, every s_i = log Z
    torch.testing.assert_close(est, log_z.reshape(1), atol=1e-12, rtol=0)


@given(x=groups, shift=st.floats(-2, 2))
def test_importance_weight(x: Groups, shift: float) -> None:
    lp = (x.logp_old + shift).requires_grad_(True)
    _, d = gflowrl_loss(lp, x.logp_old, x.logp_ref, x.rewards, x.mask, is_cap=2.0)
    assert float(d.is_weight_mean) <= 2.0 + 1e-12
    _, d0 = gflowrl_loss(x.logp_old, x.logp_old, x.logp_ref, x.rewards, x.mask)
    assert float(d0.is_weight_mean) == 1.0


def test_geometric_and_literal_ratio_coincide_for_length_one() -> None:
    x = Groups(3, 2, 4, 1)
    lp = x.logp_old + 0.2 * torch.randn(
        x.logp_old.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    a = gflowrl_loss(lp, x.logp_old, x.logp_ref, x.rewards, x.mask, geometric_ratio=True)[0]
    b = gflowrl_loss(lp, x.logp_old, x.logp_ref, x.rewards, x.mask, geometric_ratio=False)[0]
    assert torch.equal(a, b)


@given(seed=st.integers(0, 1000), variant=st.sampled_from(VARIANTS))
def test_degenerate_group_has_zero_gap(seed: int, variant: str) -> None:
    x = Groups(seed, 2, 4, 3)
    same = torch.ones_like(x.rewards)
    assert bool((flow_gap(same, x.logp_ref, x.logp_ref, x.mask, variant=variant).gap == 0).all())


@given(seed=st.integers(0, 1000), variant=st.sampled_from(VARIANTS))
def test_masking_and_empty_responses(seed: int, variant: str) -> None:
    x = Groups(seed, 2, 4, 3, empty=True)
    junk = torch.where(x.mask, torch.zeros_like(x.logp_ref), torch.full_like(x.logp_ref, -5.0))
    lp = (x.logp_old + 0.05).clamp(max=0)
    a, da = gflowrl_loss(lp, x.logp_old, x.logp_ref, x.rewards, x.mask, variant=variant)
    b, db = gflowrl_loss(lp + junk, x.logp_old - junk, x.logp_ref + junk, x.rewards, x.mask, variant=variant)
    assert torch.equal(a, b) and torch.equal(da.log_partition, db.log_partition)
    assert bool(torch.isfinite(a).all() and torch.isfinite(da.sequence_loss).all())
    empty = ~x.mask.any(-1).reshape(2, 4)
    assert bool((da.sequence_loss[empty] == 0).all())


@given(x=groups, variant=st.sampled_from(VARIANTS))
def test_permutation_invariance_within_group(x: Groups, variant: str) -> None:
    perm = torch.randperm(x.k, generator=torch.Generator().manual_seed(1))
    rows = (torch.arange(x.g).unsqueeze(1) * x.k + perm.unsqueeze(0)).reshape(-1)
    lp = (x.logp_old + 0.1).clamp(max=0)
    _, d = gflowrl_loss(lp, x.logp_old, x.logp_ref, x.rewards, x.mask, variant=variant)
    _, dp = gflowrl_loss(
        lp[rows], x.logp_old[rows], x.logp_ref[rows], x.rewards[:, perm], x.mask[rows], variant=variant
    )
    torch.testing.assert_close(d.sequence_loss[:, perm], dp.sequence_loss, atol=1e-12, rtol=0)


def test_flowrl_baseline_formula_and_log_z_gradient() -> None:
    x = Groups(4, 2, 3, 2)
    lp = (x.logp_old + 0.1).clamp(max=0).requires_grad_(True)
    log_z = torch.tensor([0.3, -0.2], dtype=torch.float64, requires_grad=True)
    loss, d = flowrl_loss(lp, x.logp_old, x.logp_ref, x.rewards, x.mask, log_z, beta=15.0)
    lengths = x.mask.sum(-1).to(torch.float64)
    s, s_ref, s_old = ((t * x.mask).sum(-1) for t in (lp, x.logp_ref, x.logp_old))
    mu, sd = x.rewards.mean(-1, keepdim=True), x.rewards.std(-1, keepdim=True)
    r_hat = ((x.rewards - mu) / (sd + 1e-6)).reshape(-1)
    resid = log_z.repeat_interleave(3) + (s - s_ref) / lengths - 15.0 * r_hat
    w = torch.exp(s - s_old).clamp(0.8, 1.2).detach()
    torch.testing.assert_close(d.sequence_loss.reshape(-1), (w * resid**2).detach())
    _, g_z = torch.autograd.grad(aggregate(loss, x.mask, AGG), [lp, log_z])
    assert bool(g_z.abs().sum() > 0)


@given(x=groups, shift=st.floats(-0.3, 0.3), clip=st.floats(0.05, 0.5))
def test_flowrl_log_z_gradient_vanishes_at_the_batch_optimum(x: Groups, shift: float, clip: float) -> None:
    """d loss / d log Z = 0 at ``flowrl_optimal_log_z`` (IS weights active: logp != logp_old), and the loss
    there is below the loss at any other log Z (a convex quadratic)."""
    lp = (x.logp_old + shift).clamp(max=0)
    z_star = flowrl_optimal_log_z(lp, x.logp_old, x.logp_ref, x.rewards, x.mask, clip=clip).requires_grad_(True)
    loss, _ = flowrl_loss(lp, x.logp_old, x.logp_ref, x.rewards, x.mask, z_star, clip=clip)
    (g_z,) = torch.autograd.grad(aggregate(loss, x.mask, AGG), z_star)
    torch.testing.assert_close(g_z, torch.zeros_like(g_z), rtol=0, atol=1e-9)
    other = z_star.detach() + torch.linspace(-1.0, 1.0, x.g, dtype=torch.float64) + 0.1
    worse, _ = flowrl_loss(lp, x.logp_old, x.logp_ref, x.rewards, x.mask, other, clip=clip)
    assert float(aggregate(worse, x.mask, AGG)) > float(aggregate(loss.detach(), x.mask, AGG))


@given(x=groups, beta=st.floats(0.5, 15.0))
def test_flowrl_at_the_mc_log_partition_is_unclipped_normalized_gflowrl(x: Groups, beta: float) -> None:
    """On-policy (w = 1), FlowRL with log Z = GFlowRL's in-batch estimate (``normalized`` variant, rewards
    r_hat) has GFlowRL's loss and gradient with the flow-gap clip off: the learned log Z's limit."""
    r_hat = ((x.rewards - x.rewards.mean(-1, keepdim=True)) / (x.rewards.std(-1, keepdim=True) + 1e-6)).detach()
    fg = flow_gap(r_hat, x.logp_old, x.logp_ref, x.mask, beta=beta, variant="normalized", max_up=1e9, max_down=1e9)
    z_opt = flowrl_optimal_log_z(x.logp_old, x.logp_old, x.logp_ref, x.rewards, x.mask, beta=beta)
    torch.testing.assert_close(z_opt, fg.log_partition, rtol=0, atol=1e-9)  # w = 1: optimum = MC estimate
    lp = x.logp_old.clone().requires_grad_(True)
    a, _ = flowrl_loss(lp, x.logp_old, x.logp_ref, x.rewards, x.mask, fg.log_partition, beta=beta, r_hat=r_hat)
    b, _ = gflowrl_loss(lp, x.logp_old, x.logp_ref, r_hat, x.mask, beta=beta, variant="normalized", gap=fg)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-9)
    torch.testing.assert_close(_grad(a, x.mask, lp), _grad(b, x.mask, lp), rtol=0, atol=1e-9)


def test_flowrl_precomputed_r_hat_equals_whole_group_z_scores() -> None:
    """Passing the whole groups' z-scores as ``r_hat`` row by row (micro-batching) gives the whole-batch loss."""
    x = Groups(7, 3, 4, 3)
    log_z = torch.tensor([0.3, -0.2, 1.0], dtype=torch.float64)
    lp = (x.logp_old + 0.05).clamp(max=0)
    whole, _ = flowrl_loss(lp, x.logp_old, x.logp_ref, x.rewards, x.mask, log_z)
    r_hat = (x.rewards - x.rewards.mean(-1, keepdim=True)) / (x.rewards.std(-1, keepdim=True) + 1e-6)
    rows, _ = flowrl_loss(lp, x.logp_old, x.logp_ref, torch.zeros(12, 1, dtype=torch.float64), x.mask,
                          log_z.repeat_interleave(4), r_hat=r_hat.reshape(12, 1))  # fmt: skip
    torch.testing.assert_close(rows, whole, rtol=0, atol=1e-12)
    with pytest.raises(ShapeError, match="r_hat"):
        flowrl_loss(lp, x.logp_old, x.logp_ref, x.rewards, x.mask, log_z, r_hat=r_hat.reshape(4, 3))


def test_bad_inputs_raise() -> None:
    x = Groups(0, 2, 3, 2)
    with pytest.raises(ShapeError, match="logp_old"):
        flow_gap(x.rewards, x.logp_old[:-1], x.logp_ref[:-1], x.mask[:-1])
    with pytest.raises(DomainError, match="variant"):
        flow_gap(x.rewards, x.logp_old, x.logp_ref, x.mask, variant="nope")
    with pytest.raises(DomainError, match="beta"):
        flow_gap(x.rewards, x.logp_old, x.logp_ref, x.mask, beta=0.0)
