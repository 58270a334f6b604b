"""The compute floor of one GRPO step: the FLOPs of the work a step needs, over a measured matmul rate.

A step samples responses and trains on them once (no reference model). The work it needs, with each prompt
computed once per group, is one forward over the G prompts and over every response token but the last
(whose output predicts nothing), with the LM head at the positions that predict a response token; that
forward ``F`` is done once to sample (prefill + decode) and once more to train, whose backward costs
twice its forward:

    needed = F + 3 F = 4 F,    F = sum over fed tokens of (2 N + 4 L d_attn c) + 2 V d x (predicting positions)

(N the non-embedding weights of the transformer layers, L layers, d_attn the attention width, c the
context length of the token, V d the LM head). Padding, rows that have ended, and the repeated prompts are
not needed work. The floor is ``needed / rate``, ``rate`` the FLOP/s of a float32 ``[M, d] x [d, d_ffn]``
matmul measured in the same run, ``M`` the rows of a training forward (an ideal: decode-sized products
run slower).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks._timing import clock

__all__ = ["ModelShape", "matmul_rate", "needed_flops"]


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs of a causal LM: non-embedding weights, layers, widths, vocabulary."""

    n: float
    layers: int
    d_model: int
    d_attn: int
    d_ffn: int
    vocab: int

    @classmethod
    def of(cls, model: Any) -> ModelShape:
        c = model.config
        emb = {id(p) for p in model.get_input_embeddings().parameters()}
        emb |= {id(p) for p in model.get_output_embeddings().parameters()}
        n = sum(p.numel() for p in model.parameters() if p.ndim >= 2 and id(p) not in emb)
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(float(n), c.num_hidden_layers, c.hidden_size, c.num_attention_heads * head_dim,
                   c.intermediate_size, c.vocab_size)  # fmt: skip


def needed_flops(shape: ModelShape, prompt_lengths: Sequence[int], response_lengths: Sequence[Sequence[int]]) -> float:
    """``4 F`` (see the module) for G prompts of ``prompt_lengths`` and their ``[G][K]`` response lengths."""
    s = shape
    per_token = 2.0 * s.n
    attention = 4.0 * s.layers * s.d_attn  # x context length
    head = 2.0 * s.vocab * s.d_model
    forward = 0.0
    for p, lengths in zip(prompt_lengths, response_lengths, strict=True):
        forward += p * per_token + attention * p * (p + 1) / 2 + head  # the prompt once; its last logits
        for length in lengths:
            fed = max(int(length) - 1, 0)
            contexts = fed * p + fed * (fed + 1) / 2  # token i of the response sees p + i + 1 positions
            forward += fed * (per_token + head) + attention * contexts
    return 4.0 * forward


def matmul_rate(rows: int, d: int, d_ffn: int, *, repeats: int = 7) -> float:
    """FLOP/s of a float32 ``[rows, d] x [d, d_ffn]`` matmul (best of ``repeats``, timed by :func:`clock`)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(rows, d, generator=g), torch.randn(d, d_ffn, generator=g)
    now, best = clock(), float("inf")
    a @ b  # warm-up
    for _ in range(repeats):
        start = now()
        for _ in range(4):
            a @ b
        best = min(best, (now() - start) / 4)
    return 2.0 * rows * d * d_ffn / best
