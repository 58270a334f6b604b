"""A short supervised warm-up on a task's reference solutions, so RL starts from a non-trivial success rate.

Loss: the token-mean negative log-likelihood of ``solution + <eos>`` given the prompt (prompt
tokens carry no loss), AdamW, a fixed number of steps, problems drawn from ``random.Random(seed)``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch

from posttrain.estimators import masked_mean
from posttrain.llm.rollout.engine import left_pad
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.rollout.tasks import Task
from posttrain.llm.rollout.text import encode_prompts, right_pad

__all__ = ["sft_warmup"]


def sft_warmup(
    model: Any,
    tokenizer: Any,
    task: Task,
    *,
    steps: int,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    chat_template: bool = False,
    system: str | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train ``model`` in place for ``steps`` steps of supervised fine-tuning; return the losses.

    ``on_step(step, loss)`` is called after each step (``step`` from 1), e.g. to show progress.
    """
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    device = next(model.parameters()).device
    eos = int(tokenizer.eos_token_id)
    losses = []
    model.train()
    for _ in range(steps):
        problems = task.sample(rng, batch_size)
        prompt_ids, prompt_mask = left_pad(
            encode_prompts(tokenizer, [p.prompt for p in problems], chat_template=chat_template, system=system),
            int(tokenizer.pad_token_id),
        )
        targets = [[*tokenizer(task.solution(p, rng), add_special_tokens=False)["input_ids"], eos] for p in problems]
        response_ids, mask = right_pad(targets, int(tokenizer.pad_token_id))
        logp, _ = token_logprobs(
            model, prompt_ids.to(device), prompt_mask.to(device), response_ids.to(device), mask.to(device)
        )
        loss = -masked_mean(logp, mask.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(len(losses), losses[-1])
    return losses
