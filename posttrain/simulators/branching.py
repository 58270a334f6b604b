"""Branching from a stored prefix of a tabular autoregressive policy (RAIL's interventions, docs: methods/rail.md).

`continue_sequences` keeps the first ``depth`` tokens of a prefix and samples the rest from
the tempered policy $\\mathrm{softmax}(\\theta/\\tau)$ (one uniform per position, a loop over
the T positions only); `node_entropy` gives the normalised next-token entropy at every prefix
of a batch of sequences (the candidate-state feature and the static heuristic's trigger). Builds on
`posttrain.simulators.tabular` (no EOS: every sequence has the full horizon).
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float, Int
from torch import Tensor

from posttrain.errors import ShapeError
from posttrain.simulators._base import Generatorish, sample_categorical, uniform
from posttrain.simulators.tabular import TabularSpec

__all__ = ["continue_sequences", "node_entropy", "node_logits"]


def node_logits(spec: TabularSpec, table: Float[Tensor, "*lead G N V"], tokens: Int[Tensor, "*lead G M T"]) -> Tensor:
    """``[*lead, G, M, T, V]`` logits at the context node of every position of ``tokens``."""
    nodes = spec.prefix_nodes(tokens)  # [*lead, G, M, T]
    lead, (m, t) = nodes.shape[:-2], nodes.shape[-2:]
    flat = nodes.reshape(*lead, m * t, 1).expand(*lead, m * t, spec.vocab)
    return table.gather(-2, flat).reshape(*lead, m, t, spec.vocab)


def node_entropy(spec: TabularSpec, table: Float[Tensor, "*lead G N V"], tokens: Int[Tensor, "*lead G M T"]) -> Tensor:
    """``[*lead, G, M, T]`` next-token entropy / log V at each position's context (position t: prefix y_<t)."""
    logp = torch.log_softmax(node_logits(spec, table, tokens), -1)
    return -(logp.exp() * logp).sum(-1) / math.log(spec.vocab)


def continue_sequences(
    spec: TabularSpec,
    table: Float[Tensor, "*lead G N V"],
    prefixes: Int[Tensor, "*lead G M T"],
    depth: Int[Tensor, "*lead G M"],
    temperature: Float[Tensor, "*lead G M"],
    generator: Generatorish,
) -> Int[Tensor, "*lead G M T"]:
    """Keep ``prefixes[..., :depth]`` and sample positions ``>= depth`` from softmax(logits / temperature).

    Examples:
        >>> spec = TabularSpec(vocab=2, horizon=3)
        >>> table = torch.zeros(1, spec.num_nodes, 2); table[..., 0] = 50.0  # always token 0
        >>> out = continue_sequences(spec, table, torch.tensor([[[1, 1, 1]]]), torch.tensor([[1]]),
        ...                          torch.tensor([[1.0]]), torch.Generator().manual_seed(0))
        >>> out.tolist()
        [[[1, 0, 0]]]
    """
    if spec.eos is not None:
        raise ShapeError("spec: continue_sequences supports specs without EOS only")
    u = uniform(generator, prefixes.shape)
    tokens = prefixes.clone()
    for t in range(spec.horizon):  # autoregressive: position t needs y_<t
        logits = node_logits(spec, table, tokens)[..., t, :] / temperature.unsqueeze(-1)
        draw = sample_categorical(logits, u[..., t : t + 1])[..., 0]
        tokens[..., t] = torch.where(depth <= t, draw, tokens[..., t])
    return tokens
