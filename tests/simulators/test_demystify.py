"""Paper 06 environments and rewards: exact quantities against direct computation, and input errors."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.errors import DomainError, ShapeError
from posttrain.simulators.demystify import (
    DomainTask,
    TargetTask,
    edit_distance,
    prior_mass,
    process_reward,
    sparse_target_reward,
)


def test_target_task_probability_is_the_product_of_conditionals() -> None:
    task = TargetTask.make(4, (1, 3, 0))
    z = torch.randn(2, 1, task.spec.num_nodes, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for r in range(2):
        p, prev = 1.0, None
        for pos, tok in enumerate(task.target.tolist()):
            node = 0 if pos == 0 else 1 + (pos - 1) * 4 + prev
            p *= float(torch.softmax(z[r, 0, node], -1)[tok])
            prev = tok
        assert math.isclose(float(task.target_logp(z)[r].exp()), p, rel_tol=1e-12)


def test_sft_plus_raises_and_sft_minus_lowers_the_prior() -> None:
    task = TargetTask.make(8, (3, 1, 4, 1, 5, 2))
    z = torch.randn(1, 1, task.spec.num_nodes, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    base = float(task.target_logp(z)[0])
    plus = float(task.target_logp(task.edit(z, lr=1.0, steps=2))[0])
    minus = float(task.target_logp(task.edit(z, lr=-1.0, steps=10))[0])
    assert minus < base < plus
    rates = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
    per_run = task.target_logp(task.edit(z.expand(3, -1, -1, -1), lr=rates, steps=2))
    assert float(per_run[0]) == base and float(per_run[2]) == plus and bool((per_run.diff() > 0).all())


def test_domain_task_features_live_in_their_block_and_metrics_are_exact() -> None:
    task = DomainTask.make(per_domain=5, generator=torch.Generator().manual_seed(1))
    f = task.features
    assert f.shape == (15, 40)
    for p in range(15):
        d = int(task.domain[p])
        own = set(range(12 * d, 12 * d + 12)) | set(range(36, 40))
        assert all(float(f[p, j]) == 0.0 for j in range(40) if j not in own)
    w = torch.randn(2, 8, 40, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    prompts = torch.tensor([[0, 3, 7], [14, 2, 2]])
    probs = torch.softmax(torch.einsum("rqf,rmf->rqm", f[prompts], w), -1)
    acc = probs.gather(-1, task.correct[prompts][..., None])[..., 0].mean(-1)
    ent = -(probs * probs.log()).sum(-1).mean(-1)
    torch.testing.assert_close(task.accuracy(w, prompts), acc)
    torch.testing.assert_close(task.entropy(w, prompts), ent)
    assert bool((task.correct == (f @ task.w_star.T).argmax(-1)).all())


def test_input_errors_name_the_argument() -> None:
    t = torch.tensor([[1, 2]])
    with pytest.raises(ShapeError, match="a"):
        edit_distance(t.float(), torch.tensor([2]), t, torch.tensor([2]))
    with pytest.raises(DomainError, match="b_len"):
        edit_distance(t, torch.tensor([2]), t, torch.tensor([3]))
    with pytest.raises(DomainError, match="max_len"):
        sparse_target_reward(t, torch.tensor([2]), torch.tensor([1]), max_len=0)
    with pytest.raises(ShapeError, match="milestones"):
        process_reward(
            torch.ones(2, 4, dtype=torch.bool),
            torch.tensor([1, 2]),
            looped=torch.tensor([False, False]),
            boxed=torch.tensor([True, True]),
        )
    with pytest.raises(ShapeError, match="hits"):
        prior_mass(torch.zeros(3))
    with pytest.raises(ShapeError, match="weights"):
        DomainTask.make(per_domain=2, generator=torch.Generator()).accuracy(torch.zeros(8, 3), torch.tensor([0]))
