"""Selective importance sampling in the LLM trainer (docs: methods/sis.md), with any ratio-based loss.

SIS is a bundle hook, not a trainer: `sis_algorithm` (``algorithm.method: sis``, options ``base`` and
``top_k``: `posttrain.llm.methods.catalog.SisOptions`) is a method preset's bundle (``base``, default GRPO) plus a
``before_update`` hook (`sis_before_update`) that the loop calls before every optimizer step:

- the behaviour envelope: one no-grad forward of the behaviour policy (the policy that generated the
  batch) gives its top-K token ids and log-probs at every response position (``[B, T, K]``): the
  batch inputs ``sis_topk_ids`` / ``sis_topk_logp``, filled by the method's own fillers (`SisEnvelope`,
  brought to the run by ``Algorithm.edge``) and marked ``behaviour`` in
  `posttrain.llm.methods.needs.NEEDS`: on-policy they are filled before the step's updates, and a batch
  trained at a lag (``rollout.staleness``) has them filled when it is generated, by the policy of then;
  the hook reads them at a batch's first update as its explicit state;
- at every update, one no-grad forward of the current policy gives its log-probs of the sampled
  tokens and at the behaviour top-K ids; the rejection test as released
  (`sis_rejection_test` without the top-K membership rule: a token
  outside the behaviour's top-K is accepted with probability $\\min(1, \\rho/M)$ like any other;
  fresh uniforms in the log-probs' dtype, float32 or wider, from the update's seed) decides which
  tokens are accepted, and the update's ``logp_old`` is `sis_logp_old`
  (the current log-prob on accepted tokens). The bundle's own loss then sees a ratio of 1 with
  gradient $\\nabla\\log\\pi_\\theta$ on accepted tokens and the ordinary ratio on rejected ones:
  for PPO-clip this is GRPO + SIS exactly as released. With ``base: gspo`` the hook also hands the
  accepted mask to the loss (the batch field ``sis_accepted``) and the loss is GSPO + SIS as
  released (`sis_gspo_loss`: the sequence ratio over the rejected tokens only, accepted tokens
  ratio 1 and unclipped), not the earlier reconstruction ``gspo_loss(logp, sis_logp_old(...))``,
  which averaged over all tokens and clipped every one.

Cost: one extra forward per optimizer step and one for the envelope per batch (logits of the response
positions only). With
micro-batching the gradient forward may differ from the no-grad one in the last bits, so an
accepted token's ratio is 1 up to rounding (always inside any clip range). Logged:
``sis/accept_rate`` and ``sis/d_orig``, ``sis/d_sis`` (the released per-response mean absolute
log-ratio, rejected tokens' clipped to the PPO range 0.2 / 0.2:
`sis_divergence`), averaged over the step's updates.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import masked_mean, sis_logp_old, zero_off_mask
from posttrain.estimators.importance import sis_divergence, sis_rejection_test
from posttrain.estimators.losses import sis_gspo_loss
from posttrain.llm.methods.algorithm import Algorithm, EdgeContext, UpdateContext
from posttrain.llm.methods.needs import Filler, Need, read
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.logprobs import vocab_log_softmax

__all__ = ["SisEnvelope", "released_gspo_sis_loss", "response_log_probs", "sis_algorithm", "sis_before_update"]


def response_log_probs(model: Any, batch: RolloutBatch, temperature: float) -> Tensor:
    """``[B, T, V]`` log-softmax of the logits predicting each response token (no grad)."""
    with torch.no_grad():
        return vocab_log_softmax(model, batch, temperature=temperature)


SisState = tuple[Tensor, Tensor]
"""``(topk_idx [B, T, K], behaviour topk logp [B, T, K])`` of the current rollout batch."""


class SisEnvelope:
    """The fillers of ``sis_topk_ids`` and ``sis_topk_logp``: the policy's top-``min(top_k, V)`` ids and
    log-probs at every response position, from one no-grad forward shared by the two (the ids' call keeps
    the log-probs for the next call on the same batch).

    Args:
        model: the bare policy (at fill time: the behaviour policy). top_k: the envelope's size K.
        temperature: the sampling temperature.
    """

    def __init__(self, model: Any, *, top_k: int, temperature: float) -> None:
        if int(top_k) < 1:
            raise DomainError(f"top_k: expected an integer >= 1, got {top_k!r}")
        self.model, self.top_k, self.temperature = model, int(top_k), float(temperature)
        self._memo: tuple[Tensor, Tensor] | None = None

    def fillers(self) -> dict[Need, Callable[[RolloutBatch], Tensor]]:
        """``{sis_topk_ids: ..., sis_topk_logp: ...}`` (filled in this order: `NEEDS` order)."""
        return {Need.SIS_TOPK_IDS: self.ids, Need.SIS_TOPK_LOGP: self.logp}

    def ids(self, batch: RolloutBatch) -> Tensor:
        """The envelope's ids ``[B, T, K]`` (filler of ``sis_topk_ids``)."""
        cur = response_log_probs(self.model, batch, self.temperature)
        top = cur.topk(min(self.top_k, cur.shape[-1]), dim=-1)
        self._memo = (top.indices, top.values)
        return top.indices

    def logp(self, batch: RolloutBatch) -> Tensor:
        """The policy's log-probs on ``sis_topk_ids`` ``[B, T, K]`` (filler of ``sis_topk_logp``)."""
        memo, self._memo = self._memo, None
        ids = read(batch, Need.SIS_TOPK_IDS)
        if ids is None:
            raise DomainError("sis_topk_logp: needs sis_topk_ids (the envelope's ids) to be filled first")
        if memo is not None and memo[0] is ids:
            return memo[1]
        return response_log_probs(self.model, batch, self.temperature).gather(-1, ids)


def sis_before_update(
    top_k: int,
) -> Callable[[RolloutBatch, SisState | None, UpdateContext], tuple[RolloutBatch, SisState, dict[str, Tensor]]]:
    """The SIS ``before_update`` hook with a behaviour envelope of ``top_k`` ids (capped at the vocabulary)."""

    def hook(
        batch: RolloutBatch, state: SisState | None, ctx: UpdateContext
    ) -> tuple[RolloutBatch, SisState, dict[str, Tensor]]:
        if batch.logp_old is None:
            raise DomainError("batch: logp_old (behaviour log-probs) must be filled before SIS")
        if state is None:  # first update of the batch: the behaviour envelope, filled with the batch
            ids, values = read(batch, Need.SIS_TOPK_IDS), read(batch, Need.SIS_TOPK_LOGP)
            if ids is None or values is None:
                raise DomainError("batch: sis_topk_ids and sis_topk_logp (the behaviour envelope) must be filled")
            state = (ids, values)
        cur = response_log_probs(ctx.model, batch, ctx.temperature)
        idx, old_topk = state
        logp = cur.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
        logp = zero_off_mask(logp, batch.mask)
        logp_old = batch.logp_old.to(logp.dtype)
        gen = torch.Generator().manual_seed(ctx.seed)
        u = torch.rand(logp.shape, generator=gen, dtype=logp.dtype)  # float32 or wider (logp is)
        accepted = sis_rejection_test(logp, logp_old, cur.gather(-1, idx), old_topk, None, u) & batch.mask
        d_orig, d_sis = sis_divergence(logp, logp_old, accepted, batch.mask)
        metrics = {
            "sis/accept_rate": masked_mean(accepted.to(logp.dtype), batch.mask),
            "sis/d_orig": d_orig.mean(),
            "sis/d_sis": d_sis.mean(),
        }
        effective = sis_logp_old(logp, logp_old, accepted).to(batch.logp_old.dtype)
        return batch.replace(logp_old=effective, sis_accepted=accepted), state, metrics

    return hook


def sis_algorithm(inner: Algorithm, *, base: str, top_k: int = 100) -> Algorithm:
    """``inner`` (the ``base`` method's bundle) with the SIS hook (``algorithm.method: sis``)."""
    if int(top_k) < 1:
        raise DomainError(f"top_k: expected an integer >= 1, got {top_k!r}")
    if inner.schedule is not None or inner.before_update is not None or inner.edge is not None:
        raise DomainError(f"base: SIS wraps an unscheduled method without its own hook or run pieces, got {base!r}")
    envelope = frozenset({Need.SIS_TOPK_IDS, Need.SIS_TOPK_LOGP})

    def edge(ctx: EdgeContext) -> tuple[tuple[Any, ...], dict[Need, Filler]]:
        return (), SisEnvelope(ctx.policy, top_k=top_k, temperature=ctx.temperature).fillers()

    hooked = dataclasses.replace(
        inner, before_update=sis_before_update(top_k), needs=inner.needs | envelope, provides=envelope, edge=edge
    )
    if base != "gspo":
        return hooked
    options = dict(getattr(inner.policy_loss, "keywords", {}))
    return dataclasses.replace(
        hooked,
        policy_loss=functools.partial(released_gspo_sis_loss, **options),
        loss_needs=(*inner.loss_needs, Need.SIS_ACCEPTED),
    )


def released_gspo_sis_loss(
    logp: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor, sis_accepted: Tensor | None, **options: Any
) -> tuple[Tensor, Any]:
    """GSPO + SIS as released (`sis_gspo_loss`) on the hook's ``sis_accepted`` mask.

    ``logp_old`` is the hook's effective one; on rejected tokens it is the behaviour log-prob, and
    `sis_gspo_loss` reads it only there, so the value equals the loss on the behaviour log-probs.
    """
    if sis_accepted is None:
        raise DomainError("batch: sis_accepted must be filled by the SIS hook before the GSPO + SIS loss")
    return sis_gspo_loss(logp, logp_old, advantages, mask, sis_accepted, divergence=False, **options)
