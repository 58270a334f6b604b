"""GFlowRL as an :class:`~posttrain.llm.algorithm.Algorithm` bundle for the LLM trainer (spec 14, section 9).

The trainer fills ``logp_ref`` (a reference forward) before the advantages, then calls the
bundle's ``advantage`` on the **whole** rollout batch: that is where the per-prompt statistics
are computed (the in-batch log-partition and the clipped flow gaps of
:func:`posttrain.estimators.gflowrl.flow_gap`), once, before any micro-batching. The clipped gap
is stored in the batch's advantage slot (constant over a response, so advantage logs show flow
gaps). The per-token loss reads it back per row and applies
:func:`posttrain.estimators.gflowrl.gflowrl_loss` with the precomputed gap (IS weight and
residual only depend on the row), so any split into micro-batches gives the same gradient.
Aggregation is ``seq-mean-token-sum`` (the mean over sequences of the per-sequence loss, Eq. 8).
No KL term (the reference enters through the gap) and no entropy bonus, as in the paper.

Selected in YAML as ``algorithm.method: gflowrl`` (registered as a
:class:`~posttrain.llm.algorithm.MethodBundle`; ``algorithm.options`` are this factory's keyword
options); the trainer then builds the reference filler because the bundle declares ``logp_ref``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from posttrain.estimators import AggregationMode, broadcast_sequence_advantages, masked_mean
from posttrain.estimators.gflowrl import FlowGap, LengthNorm, flow_gap, gflowrl_loss
from posttrain.llm.algorithm import Algorithm
from posttrain.llm.batch import RolloutBatch

__all__ = ["GFlowRLStats", "gflowrl_algorithm"]


class GFlowRLStats(NamedTuple):
    """0-d diagnostics logged by the trainer as ``pg/<name>``."""

    gap_saturation: Tensor
    """Fraction of responses whose clipped gap sits at a clip bound (the clip is active)."""
    abs_gap: Tensor
    """Mean absolute clipped flow gap."""
    is_weight_mean: Tensor
    """Mean sequence IS weight (1 on the first update of a batch)."""


def gflowrl_algorithm(
    horizon: int,
    *,
    beta: float = 8.0,
    variant: LengthNorm | str = LengthNorm.PAPER,
    max_up: float = 0.2,
    max_down: float = 0.28,
    is_cap: float = 2.0,
) -> Algorithm:
    """The GFlowRL bundle (defaults: the paper's beta = 8, Eq. 7 bounds, IS cap 2, ``paper`` length variant)."""
    v = LengthNorm.parse(variant)

    def advantage(batch: RolloutBatch) -> Tensor:
        assert batch.logp_old is not None and batch.logp_ref is not None  # declared in `needs`
        gap = flow_gap(
            batch.grouped_rewards(), batch.logp_old, batch.logp_ref, batch.mask,
            beta=beta, variant=v, max_up=max_up, max_down=max_down,
        )  # fmt: skip
        return broadcast_sequence_advantages(gap.clipped_gap, batch.mask)

    def policy_loss(logp: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor) -> tuple[Tensor, GFlowRLStats]:
        rows = logp.shape[0]
        g = masked_mean(advantages, mask, dim=-1).reshape(rows, 1)  # the row's clipped gap
        lengths = mask.sum(-1).to(logp.dtype).reshape(rows, 1)
        zeros = torch.zeros(rows, 1, dtype=logp.dtype, device=logp.device)
        gap = FlowGap(g, g, zeros[:, 0], lengths, lengths > 0)
        loss, diag = gflowrl_loss(logp, logp_old, logp_old, zeros, mask, variant=v, is_cap=is_cap, gap=gap)
        with torch.no_grad():
            at_bound = ((g <= -max_up) | (g >= max_down)) & (lengths > 0)
            stats = GFlowRLStats(masked_mean(at_bound.to(logp.dtype), lengths > 0), g.abs().mean(), diag.is_weight_mean)
        return loss, stats

    return Algorithm(
        advantage=advantage,
        policy_loss=policy_loss,
        aggregation=AggregationMode.SEQ_MEAN_TOKEN_SUM,
        horizon=int(horizon),
        needs=frozenset({"logp_old", "logp_ref"}),
    )
