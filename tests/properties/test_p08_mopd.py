"""Spec 08 section 8: token-share weights, gap factors, top-k reward, refresh, routing, recovery."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posttrain.errors import DomainError
from posttrain.estimators import full_reverse_kl, topk_reverse_kl_reward
from posttrain.estimators.losses import topk_distill_loss
from posttrain.estimators.metrics import headroom_recovery
from posttrain.estimators.weights import (
    domain_token_counts,
    gap_factors,
    mopd_domain_weights,
    refreshed_reward,
    route_teacher_logprobs,
    token_share_weights,
)
from posttrain.testing import response_masks, token_tensors

F64 = torch.float64


@st.composite
def domain_batches(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, t = draw(st.integers(3, 10)), draw(st.integers(1, 8))
    domain = torch.tensor(draw(st.lists(st.integers(0, 2), min_size=b, max_size=b)))
    mask = draw(response_masks((b, t), contiguous=True))
    targets = draw(token_tensors((3,), low=0.1, high=5.0))
    return domain, mask, targets


@given(domain_batches())
def test_token_share_weights_equalise_domain_mass(batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    domain, mask, targets = batch
    w = mopd_domain_weights(domain, mask, torch.zeros(*mask.shape, 2, dtype=F64), targets=targets, gap_alpha=None)
    n_b = mask.sum(-1).to(F64)
    assert abs(float((w * n_b).sum() / n_b.sum()) - 1.0) < 1e-12  # token-weighted mean 1
    counts = domain_token_counts(domain, mask, 3)
    present = counts > 0
    mass = torch.zeros(3, dtype=F64).index_add(0, domain, w * n_b)
    want = torch.where(present, targets, 0.0)
    assert torch.allclose(mass / mass.sum(), want / want.sum(), atol=1e-4)  # absent domains steal nothing


@given(domain_batches())
def test_ratio_targets_behave_like_fractions(batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    domain, mask, targets = batch
    assert torch.allclose(token_share_weights(domain, mask, targets), token_share_weights(domain, mask, 7.0 * targets))


def test_no_targets_is_naive() -> None:
    mask = torch.ones(3, 2, dtype=torch.bool)
    w = mopd_domain_weights(torch.tensor([0, 1, 1]), mask, torch.zeros(3, 2, 4, dtype=F64), targets=None)
    assert torch.equal(w, torch.ones(3, dtype=F64))


@given(token_tensors((3,), low=0.0, high=2.0), st.floats(0.1, 10.0), st.floats(0.0, 3.0))
def test_gap_factor_properties(m: torch.Tensor, c: float, alpha: float) -> None:
    present = torch.ones(3, dtype=torch.bool)
    assert torch.equal(gap_factors(m, present, alpha=0.0), torch.ones(3, dtype=F64))
    assert torch.allclose(gap_factors(torch.full((3,), 0.7, dtype=F64), present, alpha=alpha), torch.ones(3, dtype=F64))
    f = gap_factors(m, present, alpha=alpha)
    assert bool(((f >= 0.05) & (f <= 20)).all())
    assert torch.allclose(gap_factors(c * m, present, alpha=alpha), f, rtol=1e-9)


@given(token_tensors((2,), low=0.01, high=2.0), st.floats(0.001, 3.0))
def test_a_domain_with_zero_gap_gets_the_floor(m: torch.Tensor, alpha: float) -> None:
    """clip(0^alpha) = 0.05 for every alpha > 0 (a floored ratio (1e-12)^alpha escapes the floor for alpha < ~0.11)."""
    mags = torch.cat([torch.zeros(1, dtype=F64), m])
    f = gap_factors(mags, torch.ones(3, dtype=torch.bool), alpha=alpha)
    assert f[0].item() == 0.05
    assert gap_factors(mags, torch.ones(3, dtype=torch.bool), alpha=0.0)[0].item() == 1.0


def test_negative_gap_magnitude_is_rejected() -> None:
    with pytest.raises(DomainError, match="magnitudes"):
        gap_factors(torch.tensor([0.1, -0.2], dtype=F64), torch.ones(2, dtype=torch.bool))


@given(domain_batches(), st.floats(0.01, 1.0))
def test_raising_a_domain_gap_never_lowers_its_relative_weight(
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], bump: float
) -> None:
    domain, mask, targets = batch
    gen = torch.Generator().manual_seed(0)
    reward = -torch.rand(*mask.shape, 2, generator=gen, dtype=F64)
    d0 = int(domain[0])
    bumped = reward.clone()
    bumped[domain == d0] *= 1.0 + bump
    w1 = mopd_domain_weights(domain, mask, reward, targets=targets)
    w2 = mopd_domain_weights(domain, mask, bumped, targets=targets)
    others = domain != d0
    if bool(others.any()):
        r1 = w1[0] / w1[others]
        r2 = w2[0] / w2[others]
        assert bool((r2 >= r1 * (1 - 1e-9)).all())


@given(token_tensors((2, 3, 6), low=-3.0, high=3.0), token_tensors((2, 3, 6), low=-3.0, high=3.0))
def test_topk_reward_full_vocab_is_minus_kl(s_logits: torch.Tensor, t_logits: torch.Tensor) -> None:
    ls, lt = s_logits.log_softmax(-1), t_logits.log_softmax(-1)
    mask = torch.ones(2, 3, dtype=torch.bool)
    r = topk_reverse_kl_reward(ls, lt, mask)
    assert torch.allclose(r.sum(-1), -full_reverse_kl(ls, lt), atol=1e-9)
    assert bool((r.sum(-1) <= 1e-12).all())
    assert torch.equal(topk_reverse_kl_reward(ls, ls, mask), torch.zeros_like(r))
    top = ls.topk(4, -1).indices
    weights = torch.softmax(ls.gather(-1, top), -1)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3, dtype=F64))


def test_reward_is_detached_and_refresh_matches_recomputation() -> None:
    gen = torch.Generator().manual_seed(0)
    ls = torch.randn(2, 3, 4, generator=gen, dtype=F64).log_softmax(-1).requires_grad_(True)
    lt = torch.randn(2, 3, 4, generator=gen, dtype=F64).log_softmax(-1)
    mask = torch.ones(2, 3, dtype=torch.bool)
    w = torch.tensor([2.0, 0.5], dtype=F64)
    stored = topk_reverse_kl_reward(ls, lt, mask) * w.reshape(-1, 1, 1)
    assert not stored.requires_grad
    assert torch.equal(refreshed_reward(ls, lt, mask, w), stored)  # inner step 0: no change
    moved = (ls.detach() + 0.3 * torch.randn(2, 3, 4, generator=gen, dtype=F64)).log_softmax(-1)
    assert torch.allclose(
        refreshed_reward(moved, lt, mask, w), topk_reverse_kl_reward(moved, lt, mask) * w.reshape(-1, 1, 1)
    )


def test_domain_weights_live_in_the_advantage_only() -> None:
    gen = torch.Generator().manual_seed(1)
    lp = torch.randn(3, 2, 4, generator=gen, dtype=F64).log_softmax(-1)
    lp_old = lp + 0.2 * torch.randn(3, 2, 4, generator=gen, dtype=F64)
    adv = torch.randn(3, 2, 4, generator=gen, dtype=F64)
    mask = torch.ones(3, 2, dtype=torch.bool)
    _, d1 = topk_distill_loss(lp, lp_old, adv, mask)
    _, d2 = topk_distill_loss(lp, lp_old, adv * torch.tensor([30.0, 1.0, 0.1], dtype=F64).reshape(-1, 1, 1), mask)
    assert torch.equal(d1.approx_kl, d2.approx_kl) and torch.equal(d1.ratio_mean, d2.ratio_mean)
    assert torch.equal(d1.clip_frac, d2.clip_frac)


@given(st.integers(0, 1000))
def test_hard_routing_is_one_hot_and_permutation_equivariant(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    lt = torch.randn(3, 5, 2, 4, generator=gen, dtype=F64)
    domain = torch.randint(0, 3, (5,), generator=gen)
    routed = route_teacher_logprobs(lt, domain)
    for b in range(5):
        assert torch.equal(routed[b], lt[int(domain[b]), b])
    perm = torch.randperm(5, generator=gen)
    assert torch.equal(route_teacher_logprobs(lt[:, perm], domain[perm]), routed[perm])
    with pytest.raises(DomainError, match="domain"):
        route_teacher_logprobs(lt, torch.tensor([0, 1, 2, 3, 0]))


def test_recovery_endpoints() -> None:
    init, ref = torch.tensor([0.2, 0.1]), torch.tensor([0.6, 0.9])
    assert torch.equal(headroom_recovery(init, init, ref), torch.zeros(2))
    assert torch.equal(headroom_recovery(ref, init, ref), torch.ones(2))
    with pytest.raises(DomainError):
        headroom_recovery(init, init, init)


def test_gap_factors_are_scale_invariant_at_tiny_magnitudes() -> None:
    """A floor on the mean magnitude broke scale invariance: [1e-12, 0, 0] gave 1.0 and 2 x it gave 2.0."""
    m, present = torch.tensor([1e-12, 0.0, 0.0], dtype=F64), torch.ones(3, dtype=torch.bool)
    torch.testing.assert_close(gap_factors(2.0 * m, present, alpha=1.0), gap_factors(m, present, alpha=1.0))
    assert gap_factors(m, present, alpha=1.0)[0].item() == 3.0
