r"""A 1-D "temporal grounding" bandit with a partial-credit reward (the paper's (docs: methods/orarl.md) toy).

Each prompt has a ground-truth interval ``[g_s, g_e]`` of bins and a fixed feature vector
$f_x\in\mathbb R^D$. The policy emits two tokens with parameters shared across prompts
(so prompts compete for capacity):

$$
s\sim\mathrm{softmax}(f_x W_s),\qquad e\mid s\sim\mathrm{softmax}(f_x W_e + U_e[s]).
$$

Reward: the discrete tIoU of the inclusive bin intervals, 0 when $e < s$ (format failure);
optionally binarised at a threshold. The exact expected reward enumerates all ``bins x bins``
answers. Parameters carry a leading seed axis; ``params = (W_s [S, D, A], W_e [S, D, A],
U_e [S, A, A])`` with A = bins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.simulators._base import SeedRNG, sample_categorical

__all__ = ["IntervalTask", "answer_log_probs", "interval_logits", "sample_answers", "tiou"]


def tiou(start: Tensor, end: Tensor, gt_start: Tensor, gt_end: Tensor) -> Tensor:
    """Discrete tIoU of inclusive bin intervals (0 when ``end < start``); broadcasts.

    Examples:
        >>> float(tiou(torch.tensor(2), torch.tensor(5), torch.tensor(4), torch.tensor(7)))
        0.3333333333333333
    """
    inter = (torch.minimum(end, gt_end) - torch.maximum(start, gt_start) + 1).clamp(min=0)
    union = (end - start + 1) + (gt_end - gt_start + 1) - inter
    valid = end >= start
    return torch.where(valid, inter.to(torch.float64) / union.clamp(min=1).to(torch.float64), 0.0)


@dataclass(frozen=True)
class IntervalTask:
    """Per-seed prompts: features ``[S, G, D]`` and ground truth ``gt_start``, ``gt_end`` ``[S, G]``."""

    features: Tensor
    gt_start: Tensor
    gt_end: Tensor
    bins: int

    @classmethod
    def random(
        cls, seeds: int | Sequence[int], *, prompts: int = 64, bins: int = 16, dim: int = 8, max_len: int = 4
    ) -> IntervalTask:
        """Lengths U{1..max_len}, starts U{0..bins-L}, features N(0, I); seed s uses generator ``700 + s``.

        ``seeds``: the seeds themselves, or a count ``n`` for seeds ``0 .. n-1``.
        """
        feats, starts, ends = [], [], []
        for s in range(seeds) if isinstance(seeds, int) else seeds:  # one environment per seed (tiny draws)
            gen = torch.Generator().manual_seed(700 + s)
            length = torch.randint(1, max_len + 1, (prompts,), generator=gen)
            start = (torch.rand(prompts, generator=gen, dtype=torch.float64) * (bins - length + 1)).long()
            feats.append(torch.randn(prompts, dim, generator=gen, dtype=torch.float64))
            starts.append(start)
            ends.append(start + length - 1)
        return cls(torch.stack(feats), torch.stack(starts), torch.stack(ends), bins)

    def reward_table(self, *, threshold: float | None = None) -> Tensor:
        """``[S, G, A, A]`` reward of every answer (s, e); binary ``1[tIoU >= threshold]`` when given."""
        a = torch.arange(self.bins)
        r = tiou(a.view(-1, 1), a.view(1, -1), self.gt_start[..., None, None], self.gt_end[..., None, None])
        return r if threshold is None else (r >= threshold).to(torch.float64)


def interval_logits(features: Tensor, params: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """``(start logits [S, G, A], end logits [S, G, A, A])``: end logits for every possible start."""
    w_s, w_e, u_e = params
    start = features @ w_s
    end = (features @ w_e).unsqueeze(-2) + u_e.unsqueeze(-3)
    return start, end


def answer_log_probs(features: Tensor, params: tuple[Tensor, Tensor, Tensor]) -> Tensor:
    """``[S, G, A, A]`` exact $\\log\\pi(s, e)$ of every answer (differentiable)."""
    start, end = interval_logits(features, params)
    return start.log_softmax(-1).unsqueeze(-1) + end.log_softmax(-1)


def sample_answers(
    features: Tensor, params: tuple[Tensor, Tensor, Tensor], n: int, rng: SeedRNG
) -> tuple[Tensor, Tensor]:
    """``(start, end)`` ``[S, G, n]`` sampled answers (no gradient; one uniform per token)."""
    with torch.no_grad():
        start_logits, end_logits = interval_logits(features, params)
        s, g = features.shape[:2]
        u = rng.rand(g, n, 2)
        start = sample_categorical(start_logits, u[..., 0])  # [S, G, n]
        rows = end_logits.gather(-2, start.unsqueeze(-1).expand(s, g, n, end_logits.shape[-1]))  # [S, G, n, A]
        end = sample_categorical(rows, u[..., 1:])[..., 0]
    return start, end
