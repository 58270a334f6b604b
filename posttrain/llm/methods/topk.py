r"""Fillers of the top-K batch fields (OPD², docs: methods/opd2.md): the student's support and three models' log-probs on it.

A method that needs ``[B, T, K]`` log-probs (``opd2``) declares ``topk_ids``, ``topk_logp_old``,
``topk_logp_teacher`` and ``topk_logp_ref``; the table `posttrain.llm.methods.needs.NEEDS` maps them to the
callables here and the trainer calls them under ``torch.no_grad`` like any other filler. Every model
runs one batched forward over prompt + response (`vocab_log_softmax`),
takes the full-vocabulary $\log\mathrm{softmax}(z/\tau)$ at the rollout temperature (float32 or
wider) and gathers the K support columns:

- the student (the policy being trained, at fill time = before the step's updates, i.e. the
  behaviour policy up to the engine/trainer mismatch the trainer logs as ``logp_gap``): its top-K ids
  with the sampled id forced in (`topk_support`) and its
  log-probs on them, both from **one** forward (`StudentTopK`);
- the teacher (``model.teacher``) and the teacher-base (``model.reference``, the model of ``logp_ref``):
  one forward each (`topk_logp_filler`).

The trainer fills needs in sorted order, so ``topk_ids`` comes before the ``topk_logp_*`` fields;
a ``topk_logp_*`` filler raises if the support is missing. Simplification: the ``[B, T, V]``
log-softmax of a whole batch is materialised at once (as in the trainer's own log-prob pass), not
chunked over tokens as docs: methods/opd2.md recommends for V ~ 150k.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators.advantages import topk_support
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.logprobs import vocab_log_softmax

__all__ = ["StudentTopK", "on_support", "support_ids", "topk_logp_filler"]


def on_support(logp_v: Float[Tensor, "B T V"], ids: Int[Tensor, "B T K"], batch: RolloutBatch) -> Tensor:
    """``logp_v`` gathered at ``ids``, 0 off the response mask (like the ``[B, T]`` fields)."""
    values = logp_v.gather(-1, ids)
    return torch.where(batch.mask.unsqueeze(-1), values, torch.zeros((), dtype=values.dtype, device=values.device))


def support_ids(batch: RolloutBatch, field: str) -> Tensor:
    if batch.topk_ids is None:
        raise DomainError(f"{field}: needs batch.topk_ids (the student's top-K support) to be filled first, got None")
    return batch.topk_ids


class StudentTopK:
    """The ``topk_ids`` and ``topk_logp_old`` fillers of the policy, sharing one forward.

    `ids` runs the forward, keeps the log-probs it gathered on the support it returns, and
    `logp` hands them out when asked for that very ``topk_ids`` tensor (a one-entry memo keyed by
    tensor identity, cleared on use); for any other support it runs its own forward.

    Args:
        model: the policy (its parameters are not frozen; the trainer calls fillers under no_grad).
        k: support size, clamped to the vocabulary. temperature: the rollout temperature.
    """

    def __init__(self, model: Any, *, k: int, temperature: float) -> None:
        if int(k) < 1:
            raise DomainError(f"k: expected an integer >= 1, got {k!r}")
        self.model, self.k, self.temperature = model, int(k), float(temperature)
        self._memo: tuple[Tensor, Tensor] | None = None

    def ids(self, batch: RolloutBatch) -> Int[Tensor, "B T K"]:
        """The student's top-``min(k, V)`` ids per position, the sampled id forced in (filler of ``topk_ids``)."""
        logp_v = vocab_log_softmax(self.model, batch, temperature=self.temperature)
        ids = topk_support(logp_v, batch.response_ids, k=min(self.k, logp_v.shape[-1]))
        self._memo = (ids, on_support(logp_v, ids, batch))
        return ids

    def logp(self, batch: RolloutBatch) -> Float[Tensor, "B T K"]:
        """The student's log-probs on ``batch.topk_ids`` (filler of ``topk_logp_old``)."""
        ids = support_ids(batch, "topk_logp_old")
        memo, self._memo = self._memo, None
        if memo is not None and memo[0] is ids:
            return memo[1]
        return on_support(vocab_log_softmax(self.model, batch, temperature=self.temperature), ids, batch)


def topk_logp_filler(model: Any, *, temperature: float, field: str) -> Callable[[RolloutBatch], Tensor]:
    """A frozen model's log-probs on ``batch.topk_ids``, one batched forward (filler of ``field``)."""
    model.eval().requires_grad_(False)

    def fill(batch: RolloutBatch) -> Float[Tensor, "B T K"]:
        ids = support_ids(batch, field)
        return on_support(vocab_log_softmax(model, batch, temperature=temperature), ids, batch)

    return fill
