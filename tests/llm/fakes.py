"""Test doubles: a rollout engine that returns a fixed batch, and a task with a fixed reward table."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from posttrain.llm.rollout.engine import Rollouts, left_pad
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.rollout.tasks import Problem


@dataclass
class FixedEngine:
    """Always returns the same responses; behaviour log-probs = the model's at construction + noise."""

    model: Any
    responses: list[list[int]]  # B rows (already grouped: K per prompt, row-major)
    pad_id: int = 0
    noise: float = 0.3
    calls: int = 0

    def generate(self, prompts: Sequence[Sequence[int]], *, n: int, seed: int, greedy: bool = False) -> Rollouts:
        self.calls += 1
        ids, pmask = left_pad(prompts, self.pad_id)
        ids, pmask = ids.repeat_interleave(n, 0), pmask.repeat_interleave(n, 0)
        width = max(len(r) for r in self.responses)
        resp = torch.full((len(self.responses), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros(resp.shape, dtype=torch.bool)
        for i, r in enumerate(self.responses):
            resp[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = True
        with torch.no_grad():
            logp, _ = token_logprobs(self.model, ids, pmask, resp, mask)
        gen = torch.Generator().manual_seed(1234)
        noisy = torch.where(mask, logp + self.noise * torch.randn(logp.shape, generator=gen), torch.zeros(()))
        return Rollouts(ids, pmask, resp, mask, noisy, group_size=n)

    def sync_weights(self, model: Any) -> None:
        pass


@dataclass(frozen=True)
class TableTask:
    """Prompts ``p0, p1, ...`` in order; reward = a fixed function of the completion's length."""

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        return [Problem(f"{rng.randrange(10)}+{i}=", "") for i in range(n)]

    def reward(self, problem: Problem, completion: str) -> float:
        return float(len(completion) % 3) / 2.0

    def solution(self, problem: Problem, rng: random.Random) -> str:
        return "1"
