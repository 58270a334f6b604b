r"""A token-tree policy with parameters shared across prompts and prefixes (docs: methods/opd_then_rl.md).

The tabular student of `posttrain.simulators.teacher_tabular` has one independent logit row per
(prompt, prefix) node, so two training signals can never compete for a parameter. Here the logits
at node $n$ of prompt $g$ are a linear read-out of a fixed feature vector,

$$z_{g,n} = \phi_{g,n}^\top W,\qquad \phi_{g,n} \sim \mathcal N(0, I_D / D)\ \text{i.i.d.},\quad W \in \mathbb R^{D\times V},$$

one $W$ for every prompt and node (``D`` much smaller than the number of nodes): every update
moves every node's distribution, and what one signal writes into $W$ another can overwrite
(capacity competition, the setting in which joint objectives can interfere).

- `FeatureStudent`: the features per seed and the policy's logits, sampler and exact success;
- `train_shared`: the on-policy loop of `posttrain.simulators.teacher_tabular.train_with_teacher`
  (sample, score, per-token loss, per-seed token mean, Adam) for the weights ``W``; a method is
  the same ``loss_fn(TeacherStep) -> [B, T]`` (its ``theta`` field holds ``W [R, D, V]``: the
  student has no table).

Runs are ``R = M * S`` rows of weights, method-major: run ``r`` uses seed ``r % S``'s features
and sampling stream, so every method sees the same environment and random numbers per seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.errors import ShapeError
from posttrain.estimators import masked_mean, zero_off_mask
from posttrain.simulators._base import SeedRNG, log_softmax_small, sample_categorical, uniform
from posttrain.simulators.tabular import TabularSpec
from posttrain.simulators.teacher_tabular import TeacherStep

__all__ = ["FeatureStudent", "train_shared"]


@dataclass(frozen=True)
class FeatureStudent:
    """Fixed node features ``[S, G, N, D]`` of a shared linear-softmax student on the tree ``spec``."""

    spec: TabularSpec
    features: Tensor  # [S, G, N, D]

    def __post_init__(self) -> None:
        if self.features.ndim != 4 or self.features.shape[2] != self.spec.num_nodes:
            raise ShapeError(
                f"features: expected [S, G, {self.spec.num_nodes}, D] for {self.spec}, got {list(self.features.shape)}"
            )

    @classmethod
    def random(cls, spec: TabularSpec, seeds: Sequence[int], *, prompts: int, dim: int) -> FeatureStudent:
        """Features $\\mathcal N(0, 1/D)$ per (seed, prompt, node), seed ``s`` from its own generator (stream 77)."""
        rows = []
        for s in seeds:
            gen = torch.Generator().manual_seed(int(s) * 1_000_003 + 77)
            rows.append(torch.randn(prompts, spec.num_nodes, dim, generator=gen, dtype=torch.float64))
        return cls(spec, torch.stack(rows) / dim**0.5)

    @property
    def dim(self) -> int:
        return int(self.features.shape[-1])

    def _rows(self, runs: int, nodes: Tensor) -> Tensor:
        """``[R, G, *rest, D]`` features at node indices ``nodes [R, G, *rest]`` (run ``r`` reads seed ``r % S``)."""
        s, g, n, d = self.features.shape
        if runs % s:
            raise ShapeError(f"weights: {runs} runs are not a whole number of blocks of {s} seeds")
        seed = torch.arange(runs).remainder(s).reshape(runs, *([1] * (nodes.ndim - 1)))
        flat = (seed * g + torch.arange(g).reshape(1, g, *([1] * (nodes.ndim - 2)))) * n + nodes
        return self.features.reshape(-1, d).index_select(0, flat.reshape(-1)).reshape(*nodes.shape, d)

    def logits(self, weights: Tensor, tokens: Tensor) -> Tensor:
        """``[R, G, K, T, V]`` logits at every prefix of ``tokens [R, G, K, T]`` (differentiable in ``weights [R, D, V]``)."""
        feats = self._rows(weights.shape[0], self.spec.prefix_nodes(tokens))  # [R, G, K, T, D]
        return (feats.reshape(weights.shape[0], -1, self.dim) @ weights).reshape(*tokens.shape, -1)

    def token_logp(self, weights: Tensor, tokens: Tensor) -> Tensor:
        """``[R, G, K, T]`` log-prob of each token given its prefix, 0 off the response mask."""
        logp = log_softmax_small(self.logits(weights, tokens)).gather(-1, tokens.unsqueeze(-1))[..., 0]
        return zero_off_mask(logp, self.spec.response_mask(tokens))

    def sample(self, weights: Tensor, k: int, rng: SeedRNG) -> tuple[Tensor, Tensor]:
        """``(tokens, mask) [R, G, K, T]``: ``k`` sequences per prompt (no gradient), one uniform per token."""
        r, g, t = weights.shape[0], self.features.shape[1], self.spec.horizon
        u = uniform(rng, (r, g, k, t))
        w = weights.detach()
        tokens = torch.zeros(r, g, k, t, dtype=torch.long)
        node = torch.zeros(r, g, k, dtype=torch.long)
        for pos in range(t):  # autoregressive: position t needs y_{<t}
            logits = (self._rows(r, node).reshape(r, -1, self.dim) @ w).reshape(r, g, k, -1)
            tokens[..., pos] = sample_categorical(logits, u[..., pos, None])[..., 0]
            node = self.spec.next_node(node, pos, tokens[..., pos])
        return tokens, self.spec.response_mask(tokens)

    def success(self, weights: Tensor, correct: Tensor) -> Tensor:
        """``[R, G]`` exact probability of one of the distinct correct sequences ``correct [R, G, C, T]``."""
        return self.token_logp(weights, correct).sum(-1).exp().sum(-1)


def train_shared(
    student: FeatureStudent,
    w0: Tensor,
    loss_fn: Callable[[TeacherStep], Tensor],
    reward_fn: Callable[[Tensor, Tensor], Tensor],
    *,
    steps: int,
    k: int,
    seeds: Sequence[int],
    lr: float,
) -> Tensor:
    """Run ``steps`` on-policy Adam updates of the weights ``w0 [R, D, V]`` (not mutated); return the final weights.

    ``reward_fn(tokens [R, G, K, T], mask) -> [R, G, K]``; ``seeds`` (length R) name each run's
    sampling stream. Each run's loss is its own token mean, so with Adam the runs are independent.
    """
    rng = SeedRNG.from_seeds(list(seeds), stream=0)
    r, g = w0.shape[0], student.features.shape[1]
    weights = w0.detach().clone().requires_grad_(True)
    opt = torch.optim.Adam([weights], lr=lr)
    empty = torch.zeros(0, r, dtype=w0.dtype)
    for step in range(1, steps + 1):
        with torch.no_grad():
            tokens, mask = student.sample(weights, k, rng)
            rewards = reward_fn(tokens, mask)
        logp = student.token_logp(weights, tokens).reshape(-1, student.spec.horizon)
        flat_mask = mask.reshape(-1, student.spec.horizon)
        ctx = TeacherStep(step, rewards.reshape(r * g, k), logp, logp.detach(), flat_mask, tokens, weights, empty)
        per_run = masked_mean(loss_fn(ctx).reshape(r, -1), flat_mask.reshape(r, -1), dim=-1)
        opt.zero_grad(set_to_none=True)
        per_run.sum().backward()
        opt.step()
    return weights.detach()
