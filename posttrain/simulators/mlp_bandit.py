r"""Sparse-reward contextual bandit with a small MLP policy, batched over runs (the paper's (docs: methods/muon.md) toy).

Contexts $c \in \{0..C-1\}$, actions $a \in \{0..V-1\}$, each context has ``n_correct``
distinct correct actions; reward 1 for a correct action. Policy: one-hot context -> embedding
$E$ -> $\mathrm{ReLU}(W_1 \cdot)$ -> $\mathrm{ReLU}(W_2 \cdot)$ -> head $W_o$
-> softmax, no biases. Hidden matrices are $\{W_1, W_2\}$, the rest is "fallback".

Every tensor carries a leading run axis ``R`` (seeds x learning rates), so many training runs
advance in one batched step. The exact expected success (all contexts, all actions) sits next
to the sampler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from posttrain.validate import check_positive

__all__ = ["MLPBanditTask", "MLPParams", "exact_success", "forward_logits", "init_params", "make_task", "pretrain"]


@dataclass(frozen=True)
class MLPBanditTask:
    """One task per seed: ``correct [S, C, V]`` boolean and the prior (pretraining) labels ``[S, C]``."""

    correct: Tensor
    prior_labels: Tensor


class MLPParams(NamedTuple):
    """Weights with a leading run axis: E ``[R, C, d]``, W1 ``[R, h1, d]``, W2 ``[R, h2, h1]``, Wo ``[R, V, h2]``."""

    E: Tensor
    W1: Tensor
    W2: Tensor
    Wo: Tensor

    def hidden(self) -> tuple[Tensor, Tensor]:
        return (self.W1, self.W2)

    def fallback(self) -> tuple[Tensor, Tensor]:
        return (self.E, self.Wo)


def make_task(
    seeds: Tensor, *, contexts: int = 64, actions: int = 16, n_correct: int = 2, prior_hit: float = 0.5
) -> MLPBanditTask:
    """Correct action sets and prior labels, one per seed (each from ``torch.Generator().manual_seed(seed)``).

    Prior label of a context: one of its correct actions with probability ``prior_hit``, else a
    uniformly random action.
    """
    correct, labels = [], []
    for s in seeds.tolist():  # one generator per seed keeps each seed's task independent of the others
        g = torch.Generator().manual_seed(int(s))
        perm = torch.argsort(torch.rand(contexts, actions, generator=g), dim=-1)[:, :n_correct]
        c = torch.zeros(contexts, actions, dtype=torch.bool).scatter_(1, perm, True)
        pick = perm[torch.arange(contexts), torch.randint(n_correct, (contexts,), generator=g)]
        rand = torch.randint(actions, (contexts,), generator=g)
        labels.append(torch.where(torch.rand(contexts, generator=g) < prior_hit, pick, rand))
        correct.append(c)
    return MLPBanditTask(torch.stack(correct), torch.stack(labels))


def init_params(
    seeds: Tensor,
    *,
    contexts: int = 64,
    actions: int = 16,
    d: int = 32,
    h1: int = 64,
    h2: int = 64,
    dtype: torch.dtype = torch.float32,
) -> MLPParams:
    """Gaussian init per seed: E ~ N(0,1), W1 ~ N(0,1/d), W2 ~ N(0,1/h1), Wo ~ N(0,1/h2)."""
    out: list[list[Tensor]] = [[], [], [], []]
    for s in seeds.tolist():
        g = torch.Generator().manual_seed(int(s) + 10_000)
        shapes = [(contexts, d, 1.0), (h1, d, 1.0 / d), (h2, h1, 1.0 / h1), (actions, h2, 1.0 / h2)]
        for i, (m, n, var) in enumerate(shapes):
            out[i].append(torch.randn(m, n, generator=g, dtype=dtype) * var**0.5)
    return MLPParams(*(torch.stack(o) for o in out))


def forward_logits(p: MLPParams, ctx: Tensor) -> Tensor:
    """Logits ``[R, N, V]`` for contexts ``ctx [R, N]`` (integer)."""
    h = torch.gather(p.E, 1, ctx.unsqueeze(-1).expand(*ctx.shape, p.E.shape[-1]))
    h = torch.relu(h @ p.W1.mT)
    h = torch.relu(h @ p.W2.mT)
    return h @ p.Wo.mT


def exact_success(p: MLPParams, correct: Tensor) -> Tensor:
    r"""Exact expected success $\frac1C\sum_c\sum_a \pi(a|c)\,1[a\ \mathrm{correct}]$ per run, ``[R]``.

    ``correct`` is ``[R, C, V]`` (the task of each run's seed).
    """
    r, c = correct.shape[0], correct.shape[1]
    ctx = torch.arange(c).expand(r, c)
    probs = torch.softmax(forward_logits(p, ctx), dim=-1)
    return (probs * correct.to(probs.dtype)).sum(-1).mean(-1)


def pretrain(
    p: MLPParams, labels: Tensor, seeds: Tensor, *, steps: int = 150, lr: float = 0.05, batch: int = 128
) -> MLPParams:
    """Plain SGD on cross-entropy to the prior labels ``[R, C]`` ("partial knowledge" base), batched over runs."""
    check_positive("lr", lr)
    gens = [torch.Generator().manual_seed(int(s) + 20_000) for s in seeds.tolist()]
    params = [t.clone().requires_grad_(True) for t in p]
    contexts = labels.shape[1]
    for _ in range(steps):
        ctx = torch.stack([torch.randint(contexts, (batch,), generator=g) for g in gens])
        q = MLPParams(*params)
        logits = forward_logits(q, ctx)
        target = torch.gather(labels, 1, ctx)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
        grads = torch.autograd.grad(loss * labels.shape[0], params)
        with torch.no_grad():
            params = [(t - lr * g).requires_grad_(True) for t, g in zip(params, grads, strict=True)]
    return MLPParams(*(t.detach() for t in params))
