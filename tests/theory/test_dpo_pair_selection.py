"""Unit tests of the pair-selection pipeline and the DPO loss's contract."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators import PREFERENCE_LOSSES, dpo_loss
from posttrain.theory.dpo_design import design_trace, information_matrix, policy_curvature, uniform_design
from posttrain.theory.dpo_pair_selection import (
    select_pairs,
    standardise_features,
    weighted_sample_without_replacement,
)


def _pool(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(12, 5, 6)), rng.normal(size=(12, 5))


def test_selection_is_deterministic_distinct_and_within_prompt() -> None:
    phi, logp = _pool()
    a = select_pairs(phi, logp, 20, seed=3)
    b = select_pairs(phi, logp, 20, seed=3)
    assert np.array_equal(a.edges, b.edges)
    assert len({tuple(e) for e in a.edges.tolist()}) == 20
    assert np.all(a.edges[:, 1] < a.edges[:, 2]) and np.all(a.edges[:, 2] < 5)
    assert 1.0 <= a.prompts_covered <= 12.0 + 1e-9


def test_per_prompt_selection_draws_one_pair_per_prompt() -> None:
    phi, logp = _pool(1)
    out = select_pairs(phi, logp, 1, per_prompt=True, seed=0)
    assert sorted(out.edges[:, 0].tolist()) == list(range(12))


def test_design_beats_uniform_on_its_criterion() -> None:
    phi, logp = _pool(2)
    out = select_pairs(phi, logp, 5)
    f = standardise_features(phi)
    from posttrain.theory.dpo_design import edge_vectors, within_prompt_pairs

    g = edge_vectors(f, within_prompt_pairs(12, 5), beta=0.1)
    m = policy_curvature(f, logp, beta=0.1)
    ridge = 1e-3 * np.eye(6)
    uni = design_trace(m, information_matrix(g, uniform_design(g.shape[0])) * 4 + ridge)
    opt = design_trace(m, information_matrix(g, out.design.q) * 4 + ridge)
    assert opt <= uni


def test_weighted_sampling_frequencies() -> None:
    q = np.array([0.5, 0.3, 0.2, 0.0])
    rng = np.random.default_rng(0)
    first = np.array([weighted_sample_without_replacement(q, 1, rng=rng)[0] for _ in range(4000)])
    freq = np.bincount(first, minlength=4) / first.size
    se = np.sqrt(q * (1 - q) / first.size)
    assert np.all(np.abs(freq - q) <= 4 * se + 1e-12)  # z = 4
    assert set(weighted_sample_without_replacement(q, 4, rng=rng).tolist()) == {0, 1, 2, 3}


def test_errors() -> None:
    phi, logp = _pool()
    with pytest.raises(DomainError, match="n_pairs"):
        select_pairs(phi, logp, 11, per_prompt=True)
    with pytest.raises(ShapeError, match="logp"):
        select_pairs(phi, logp[:, :3], 2)


def test_dpo_loss_contract() -> None:
    assert "dpo" in PREFERENCE_LOSSES
    x = [torch.randn(4, dtype=torch.float64, requires_grad=True) for _ in range(4)]
    before = [t.detach().clone() for t in x]
    loss, diag = dpo_loss(*x, beta=0.1)
    loss.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in x)
    assert all(torch.equal(a.detach(), b) for a, b in zip(x, before, strict=True))
    big = torch.tensor([1e4], dtype=torch.float32)
    z = torch.zeros(1)
    assert torch.isfinite(dpo_loss(-big, big, z, z, beta=1.0)[0]).all()
    with pytest.raises(ShapeError, match="logp_rejected"):
        dpo_loss(x[0], x[1][:2], x[2], x[3])
    with pytest.raises(DomainError, match="beta"):
        dpo_loss(*x, beta=0.0)
    with pytest.raises(DomainError, match="label_smoothing"):
        dpo_loss(*x, label_smoothing=0.7)
    assert diag.accuracy.dtype == torch.float64
