"""Spec 04 section 8: memberships, router limits, confidence calibration, queues as a partition."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from posttrain.estimators import (
    aggregate,
    clipped_ratio_loss,
    group_normalized_advantages,
    k3_kl,
    self_routing_probabilities,
)
from posttrain.estimators.losses import routed_loss
from posttrain.estimators.selection import (
    Recipe,
    accuracy_memberships,
    confidence_features,
    random_routes,
    rollout_confidence,
    route_masks,
    router_probabilities,
    router_scores,
    sample_routes,
)
from posttrain.testing import grouped_rewards, token_tensors

F64 = torch.float64


@st.composite
def routing_batches(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    rewards = draw(grouped_rewards(groups=(2, 6), k=(2, 6), binary=True))
    entropy = draw(token_tensors(tuple(rewards.shape), low=0.0, high=3.0))
    return rewards, entropy


@given(token_tensors((16,), low=0.0, high=1.0))
def test_memberships_sum_to_one_and_are_symmetric(acc: torch.Tensor) -> None:
    w = accuracy_memberships(acc)
    assert bool(((w > 0) & (w < 1)).all())
    assert torch.allclose(w.sum(-1), torch.ones(16, dtype=F64))
    assert torch.allclose(w[:, 0], accuracy_memberships(1.0 - acc)[:, 2], atol=1e-12)


def test_membership_argmax_and_monotonicity() -> None:
    assert accuracy_memberships(torch.tensor([0.0, 0.5, 1.0], dtype=F64)).argmax(-1).tolist() == [0, 1, 2]
    w = accuracy_memberships(torch.linspace(0, 1, 101, dtype=F64))
    assert bool((w[1:, 0] <= w[:-1, 0]).all() and (w[1:, 2] >= w[:-1, 2]).all())


@given(routing_batches())
def test_probabilities_are_a_distribution_and_permutation_invariant(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    rewards, entropy = batch
    p = self_routing_probabilities(rewards, entropy)
    assert bool((p >= 0).all())
    assert torch.allclose(p.sum(-1), torch.ones(p.shape[0], dtype=F64), atol=1e-6)
    perm = torch.randperm(rewards.shape[1], generator=torch.Generator().manual_seed(0))
    assert torch.allclose(self_routing_probabilities(rewards[:, perm], entropy[:, perm]), p, atol=1e-12)


@given(routing_batches(), st.floats(0.1, 10.0), st.floats(-5.0, 5.0))
def test_confidence_is_affine_invariant_and_in_unit_interval(
    batch: tuple[torch.Tensor, torch.Tensor], a: float, b: float
) -> None:
    _, entropy = batch
    kappa = rollout_confidence(entropy)
    assert bool(((kappa >= 0) & (kappa <= 1)).all())
    spread = float(entropy.max() - entropy.min())
    if spread > 1e-3:  # the min-max epsilon is negligible against the spread
        assert torch.allclose(rollout_confidence(a * entropy + b), kappa, atol=1e-4)


def _probs(acc: float, c: float, c_pos: float, c_neg: float, dev: float) -> torch.Tensor:
    omega = accuracy_memberships(torch.tensor([acc], dtype=F64))
    feats = torch.tensor([[c, c_pos, c_neg, dev]], dtype=F64)
    return router_probabilities(router_scores(omega, feats))[0]


@given(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1))
def test_router_limits(c: float, c_pos: float, dev: float) -> None:
    solved = _probs(1.0, c, c_pos, 0.0, dev)
    assert float(solved[Recipe.OPSD]) <= 1e-3 and float(solved[Recipe.SKIP]) <= 1e-3
    assert int(_probs(0.5, c, c_pos, c, dev).argmax()) == Recipe.GRPO
    assert int(_probs(0.0, 1.0, 0.0, 1.0, dev).argmax()) == Recipe.SKIP
    assert int(_probs(0.0, 0.0, 0.0, 0.0, dev).argmax()) == Recipe.OPSD


def test_zero_scores_fall_back_to_grpo() -> None:
    p = router_probabilities(torch.zeros(2, 4, dtype=F64))
    assert p[:, Recipe.GRPO].tolist() == [1.0, 1.0]


@given(routing_batches(), st.integers(0, 1000))
def test_routes_are_deterministic_and_a_partition(batch: tuple[torch.Tensor, torch.Tensor], seed: int) -> None:
    rewards, entropy = batch
    p = self_routing_probabilities(rewards, entropy)
    u = torch.rand(rewards.shape[0], generator=torch.Generator().manual_seed(seed), dtype=F64)
    routes = sample_routes(p, u)
    assert torch.equal(routes, sample_routes(p, u.clone()))
    assert bool((p.gather(-1, routes.unsqueeze(-1)) > 0).all())  # never a zero-probability recipe
    masks = route_masks(routes)
    assert torch.equal(masks.sum(0), torch.ones(rewards.shape[0], dtype=torch.long))
    rnd = random_routes(torch.tensor([0.3, 0.1, 0.4, 0.2], dtype=F64), u)
    assert torch.equal(route_masks(rnd).sum(0), torch.ones(rewards.shape[0], dtype=torch.long))


@st.composite
def paired_batches(draw: st.DrawFn) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    a = draw(routing_batches())
    g, k = a[0].shape
    rewards = draw(grouped_rewards(groups=g, k=k, binary=True))
    return a, (rewards, draw(token_tensors((g, k), low=0.0, high=3.0)))


@given(paired_batches())
def test_leading_axes_are_independent_routing_batches(pair: tuple[tuple[torch.Tensor, torch.Tensor], ...]) -> None:
    a, b = pair
    stacked = self_routing_probabilities(torch.stack([a[0], b[0]]), torch.stack([a[1], b[1]]))
    assert torch.allclose(stacked[0], self_routing_probabilities(*a), atol=1e-12)
    assert torch.allclose(stacked[1], self_routing_probabilities(*b), atol=1e-12)


def test_random_router_matches_its_marginal() -> None:
    marginal = torch.tensor([0.3, 0.1, 0.4, 0.2], dtype=F64)
    n = 20000
    routes = random_routes(marginal, torch.rand(n, generator=torch.Generator().manual_seed(1), dtype=F64))
    freq = route_masks(routes).sum(-1).to(F64) / n
    se = (marginal * (1 - marginal) / n).sqrt()
    assert bool(((freq - marginal).abs() <= 4 * se).all())  # z = 4 standard errors


def _recipe_batch(seed: int, g: int = 4, k: int = 3, t: int = 5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(g * k, t, generator=gen, dtype=F64)
    rewards = (torch.rand(g, k, generator=gen) < 0.5).to(F64)
    mask = torch.rand(g * k, t, generator=gen) < 0.8
    mask[:, 0] = True
    return logp, rewards, mask


@given(st.integers(0, 500), st.lists(st.integers(0, 3), min_size=4, max_size=4))
def test_routed_loss_queues(seed: int, routes_list: list[int]) -> None:
    logp, rewards, mask = _recipe_batch(seed)
    routes = torch.tensor(routes_list)
    grpo, _ = clipped_ratio_loss(logp, logp.detach() - 0.05, group_normalized_advantages(rewards).reshape(-1), mask)
    opsd = k3_kl(logp, logp - 0.3)
    reg = 0.1 * k3_kl(logp, logp + 0.2)
    nan = torch.full_like(logp, float("nan"))  # SKIP's slice must never be read
    losses = torch.stack([grpo, opsd, reg, nan])
    total = routed_loss(losses, routes, mask)
    # reference: loop over queues
    row_route = routes.repeat_interleave(3)
    num, den = 0.0, 0
    for r, lt in enumerate([grpo, opsd, reg]):
        rows = row_route == r
        if rows.any():
            n_r = int((routes == r).sum())
            num += n_r * float(aggregate(lt[rows], mask[rows], "token-mean"))
            den += n_r
    want = 0.0 if den == 0 else num / den
    assert abs(float(total) - want) < 1e-12
    if all(r == Recipe.SKIP for r in routes_list):
        assert float(total) == 0.0
    if all(r == Recipe.GRPO for r in routes_list):
        assert float(total) == float(aggregate(grpo, mask, "token-mean"))


def test_forced_grpo_on_constant_group_gives_zero_gradient_and_reg_at_reference_is_flat() -> None:
    logp, _, mask = _recipe_batch(0)
    lp = logp.clone().requires_grad_(True)
    adv = group_normalized_advantages(torch.ones(4, 3, dtype=F64)).reshape(-1)
    grpo, _ = clipped_ratio_loss(lp, lp.detach(), adv, mask)
    reg = 0.1 * k3_kl(lp, lp.detach())
    losses = torch.stack([grpo, torch.zeros_like(grpo), reg, torch.zeros_like(grpo)])
    total = routed_loss(losses, torch.tensor([0, 0, 2, 2]), mask)
    (grad,) = torch.autograd.grad(total, lp)
    assert float(total.detach()) == 0.0 and float(grad.abs().max()) == 0.0


def test_confidence_features_reconstruction() -> None:
    kappa = torch.tensor([[0.9, 0.1], [0.2, 0.4]], dtype=F64)
    correct = torch.tensor([[True, False], [False, False]])
    f = confidence_features(kappa, correct)
    assert torch.allclose(f[:, 0], kappa.mean(-1))
    assert torch.allclose(f[:, 1], torch.tensor([0.9, 0.0], dtype=F64))  # no correct rollout -> 0
    assert torch.allclose(f[:, 2], torch.tensor([0.1, 0.3], dtype=F64))
    assert bool(((f[:, 3] >= 0) & (f[:, 3] <= 1)).all())
