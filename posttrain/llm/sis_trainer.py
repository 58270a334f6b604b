"""Selective importance sampling in the LLM trainer (spec 16, section 9), with any ratio-based loss.

:class:`SISTrainer` changes two phases of :class:`~posttrain.llm.trainer.Trainer` and no loss:

- after the rollout, one no-grad forward of the (still behaviour) policy stores the behaviour
  top-K token ids and log-probs at every response position (``[B, T, K]``);
- before every optimizer step, one no-grad forward of the current policy gives its log-probs of
  the stored tokens and at the behaviour top-K ids; the rejection test
  (:func:`~posttrain.estimators.sis.sis_acceptance_prob`, :func:`~posttrain.estimators.sis.sis_accept`,
  fresh uniforms from a dedicated generator per step and update) decides which tokens are accepted,
  and the batch's ``logp_old`` is replaced by :func:`~posttrain.estimators.sis.sis_logp_old` (the
  current log-prob on accepted tokens). The algorithm's own loss (PPO-clip, GSPO, ...) then sees a
  ratio of 1 with gradient :math:`\\nabla\\log\\pi_\\theta` on accepted tokens and the ordinary ratio
  on rejected ones: the SIS plug-in without touching the loss.

Cost: one extra forward per optimizer step and one per rollout (logits of the response positions
only). With micro-batching the gradient forward may differ from the no-grad one in the last bits, so
an accepted token's ratio is 1 up to rounding (always inside any clip range). Logged:
``sis/accept_rate`` and ``sis/d_orig``, ``sis/d_sis`` (mean cumulative absolute log-ratio per response),
averaged over the step's updates.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from posttrain.estimators import masked_mean
from posttrain.estimators.sis import sis_accept, sis_acceptance_prob, sis_divergence, sis_logp_old, token_in_topk
from posttrain.llm._derived import rebuild_as
from posttrain.llm.batch import RolloutBatch
from posttrain.llm.trainer import Trainer

__all__ = ["SISTrainer", "response_log_probs"]


def response_log_probs(model: Any, batch: RolloutBatch, temperature: float) -> Tensor:
    """``[B, T, V]`` log-softmax of the logits predicting each response token (no grad)."""
    t = batch.response_ids.shape[1]
    attn = batch.attention_mask().long()
    positions = (attn.cumsum(dim=-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(
            input_ids=batch.input_ids(),
            attention_mask=attn,
            position_ids=positions,
            use_cache=False,
            logits_to_keep=t + 1,
        )
        return torch.log_softmax(out.logits[:, :-1].float() / temperature, dim=-1)


class SISTrainer(Trainer):
    """A :class:`Trainer` applying the SIS rejection test before every optimizer step.

    Args:
        top_k: K of the behaviour envelope (the release's default is 100; capped at the vocabulary).
        **kwargs: the :class:`Trainer` arguments.
    """

    def __init__(self, cfg: Any, *, top_k: int = 100, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        self.top_k = int(top_k)
        self.behaviour: tuple[Tensor, Tensor] | None = None  # (topk_idx, old_topk_logp) of the current batch
        self.updates = 0
        self.sis_log: dict[str, list[float]] = {}

    @classmethod
    def from_trainer(cls, trainer: Trainer, **sis: Any) -> SISTrainer:
        """An SIS trainer on the same model, task, engine, algorithm and fillers (fresh optimizer)."""
        return rebuild_as(cls, trainer, **sis)

    def rollout(self) -> tuple[RolloutBatch, list[str]]:
        batch, texts = super().rollout()
        old = response_log_probs(self.policy, batch, self.cfg.rollout.temperature)
        top = old.topk(min(self.top_k, old.shape[-1]), dim=-1)
        self.behaviour = (top.indices, top.values)
        self.updates = 0
        self.sis_log = {}
        return batch, texts

    def accumulate_gradients(self, batch: RolloutBatch) -> dict[str, float]:
        assert self.behaviour is not None and batch.logp_old is not None
        idx, old_topk = self.behaviour
        cur = response_log_probs(self.policy, batch, self.cfg.rollout.temperature)
        logp = cur.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
        logp = torch.where(batch.mask, logp, torch.zeros((), dtype=logp.dtype))
        logp_old = batch.logp_old.to(logp.dtype)
        a = sis_acceptance_prob(logp, logp_old, cur.gather(-1, idx), old_topk, token_in_topk(batch.response_ids, idx))
        gen = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + self.step * 101 + self.updates)
        accepted = sis_accept(a, torch.rand(a.shape, generator=gen, dtype=a.dtype)) & batch.mask
        self.updates += 1
        d_orig, d_sis = sis_divergence(logp, logp_old, accepted, batch.mask)
        for key, value in (
            ("sis/accept_rate", masked_mean(accepted.to(logp.dtype), batch.mask)),
            ("sis/d_orig", d_orig.mean()),
            ("sis/d_sis", d_sis.mean()),
        ):
            self.sis_log.setdefault(key, []).append(float(value))
        effective = sis_logp_old(logp, logp_old, accepted).to(batch.logp_old.dtype)
        return super().accumulate_gradients(batch.replace(logp_old=effective))

    def train_step(self) -> dict[str, Any]:
        metrics = super().train_step()
        return {**metrics, **{k: sum(v) / len(v) for k, v in self.sis_log.items()}}
