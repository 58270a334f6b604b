"""Headroom-Drift Replay in the LLM trainer (spec 02, section 9): stored GRPO groups join the fresh batch.

:class:`ReplayTrainer` changes only the rollout phase of :class:`~posttrain.llm.trainer.Trainer`:

1. the fresh batch is generated, scored and prepared exactly as on-policy (same prompts, same seeds:
   replay uses no random numbers);
2. the previous step's mixed-outcome groups enter the FIFO buffer (equivalent to ingress after that
   step's update, since nothing reads the buffer in between; no same-step replay);
3. one teacher-forced pass (no grad) gives the current log-probs of every stored response; the
   buffer is ranked, gated and refreshed by :func:`posttrain.estimators.replay.replay_select`;
4. the admitted groups are appended to the batch with their stored behaviour log-probs as
   ``logp_old`` (spec 02 §10.1) and re-prepared, so the method's own advantages (for GRPO equal to
   the stored ones: they depend on the group's rewards only) and needed fields are filled.

The update is the algorithm's usual loss over fresh + replayed groups. Logged per step:
``replay/groups`` (admitted), ``replay/scanned``, ``replay/buffer`` and ``replay/ratio`` (replayed
rows / all rows). Simplifications: every stored response is re-scored each step (the scan is cheap
at toy scale; a production run caps and batches it with the old-log-prob pass); ``reward_mean``
in the step log includes replayed groups; stored ``logp_gen`` is the rollout engine's log-prob
(equal to the trainer's numerics for the HF engine).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from posttrain.estimators.replay import ReplayBuffer, replay_add, replay_init, replay_rule, replay_select
from posttrain.llm._derived import rebuild_as
from posttrain.llm.batch import RolloutBatch
from posttrain.llm.generate import token_logprobs
from posttrain.llm.trainer import Trainer

__all__ = ["ReplayTrainer"]


def _pad_right(x: Tensor, width: int, value: float | int | bool) -> Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[-1]), value=value)


def _pad_left(x: Tensor, width: int, value: float | int | bool) -> Tensor:
    return torch.nn.functional.pad(x, (width - x.shape[-1], 0), value=value)


class ReplayTrainer(Trainer):
    """A :class:`Trainer` whose batches are the fresh groups plus up to ``k_rep`` replayed ones.

    Args:
        rule: a name in ``registry("replay")`` (``hdr``, ``naive_recency``, ``headroom_only``, ``drift_only``).
        k_rep: replay budget (groups per step). tau: drift threshold. capacity: buffer size (groups).
        success_threshold: ingress indicator ``r >= threshold`` (None: ``r > 0``).
        **kwargs: the :class:`Trainer` arguments.
    """

    def __init__(
        self,
        cfg: Any,
        *,
        rule: str = "hdr",
        k_rep: int = 2,
        tau: float = 1e-2,
        capacity: int = 8,
        success_threshold: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(cfg, **kwargs)
        self.rule, self.k_rep, self.tau, self.capacity = replay_rule(rule), int(k_rep), float(tau), int(capacity)
        self.success_threshold = success_threshold
        self.horizon = cfg.rollout.max_new_tokens
        self.buffer: ReplayBuffer = replay_init(cfg.rollout.group_size, self.horizon)
        self.prompts: dict[int, tuple[Tensor, Tensor]] = {}  # group id -> (prompt_ids [K, P], prompt_mask [K, P])
        self.next_id = 0
        self.pending: RolloutBatch | None = None
        self.replay_log: dict[str, float] = {}

    @classmethod
    def from_trainer(cls, trainer: Trainer, **replay: Any) -> ReplayTrainer:
        """A replay trainer on the same model, task, engine, algorithm and fillers (fresh optimizer)."""
        return rebuild_as(cls, trainer, **replay)

    # ------------------------------------------------------------------ phase E (deferred ingress)
    def _ingress(self, fresh: RolloutBatch, step: int) -> None:
        g, k = fresh.num_groups, fresh.group_size
        assert fresh.advantages is not None and fresh.logp_old is not None
        ids = torch.arange(self.next_id, self.next_id + g)
        self.next_id += g
        for i, gid in enumerate(ids.tolist()):
            rows = slice(i * k, (i + 1) * k)
            self.prompts[gid] = (fresh.prompt_ids[rows], fresh.prompt_mask[rows])
        seq_adv = torch.where(fresh.mask, fresh.advantages, torch.nan).nanmean(-1).nan_to_num(0.0)
        self.buffer = replay_add(
            self.buffer,
            tokens=_pad_right(fresh.response_ids, self.horizon, 0).reshape(g, k, -1),
            mask=_pad_right(fresh.mask, self.horizon, False).reshape(g, k, -1),
            rewards=fresh.rewards.reshape(g, k).float(), advantages=seq_adv.reshape(g, k).float(),
            logp_gen=_pad_right(fresh.logp_old, self.horizon, 0.0).reshape(g, k, -1).float(),
            prompt=ids, step=step, capacity=self.capacity, success_threshold=self.success_threshold,
        )  # fmt: skip
        kept = set(self.buffer.prompt.tolist())
        self.prompts = {gid: v for gid, v in self.prompts.items() if gid in kept}

    # ------------------------------------------------------------------ phases B-C and the mixed batch
    def _stored_rows(self, groups: list[int]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Prompt ids/mask (left-padded to a common width) and responses of the given buffer rows."""
        prompts = [self.prompts[int(self.buffer.prompt[c])] for c in groups]
        width = max(p[0].shape[-1] for p in prompts)
        p_ids = torch.cat([_pad_left(p[0], width, self.tokenizer.pad_token_id) for p in prompts])
        p_mask = torch.cat([_pad_left(p[1], width, False) for p in prompts])
        k = self.buffer.tokens.shape[1]
        rows = len(groups) * k
        return p_ids, p_mask, self.buffer.tokens[groups].reshape(rows, -1), self.buffer.mask[groups].reshape(rows, -1)

    def _select(self) -> list[int]:
        if self.buffer.size == 0 or self.k_rep == 0:
            self.replay_log = {"replay/groups": 0.0, "replay/scanned": 0.0, "replay/buffer": float(self.buffer.size)}
            return []
        groups = list(range(self.buffer.size))
        p_ids, p_mask, r_ids, r_mask = self._stored_rows(groups)
        with torch.no_grad():  # the teacher-forced gating pass
            logp, _ = token_logprobs(self.model, p_ids, p_mask, r_ids, r_mask, temperature=self.cfg.rollout.temperature)
        logp = torch.where(r_mask, logp, torch.zeros((), dtype=logp.dtype)).reshape(self.buffer.logp_gen.shape)
        sel, self.buffer = replay_select(
            self.buffer, logp.to(self.buffer.logp_gen.dtype), k_rep=self.k_rep,
            tau=self.rule.threshold(self.tau), order=self.rule.order, step=self.step,
        )  # fmt: skip
        self.replay_log = {
            "replay/groups": float(sel.rows.numel()),
            "replay/scanned": float(sel.scanned.sum()),
            "replay/buffer": float(self.buffer.size),
        }
        return sel.rows.tolist()

    def _mixed(self, fresh: RolloutBatch, groups: list[int]) -> RolloutBatch:
        assert fresh.logp_old is not None
        p_ids, p_mask, r_ids, r_mask = self._stored_rows(groups)
        width_p = max(fresh.prompt_ids.shape[-1], p_ids.shape[-1])
        width_t = max(fresh.response_ids.shape[-1], int(r_mask.any(0).nonzero().max()) + 1)
        pad = self.tokenizer.pad_token_id
        logp_gen = self.buffer.logp_gen[groups].reshape(r_ids.shape).to(fresh.logp_old.dtype)
        mixed = RolloutBatch(
            prompt_ids=torch.cat([_pad_left(fresh.prompt_ids, width_p, pad), _pad_left(p_ids, width_p, pad)]),
            prompt_mask=torch.cat([_pad_left(fresh.prompt_mask, width_p, False), _pad_left(p_mask, width_p, False)]),
            response_ids=torch.cat([_pad_right(fresh.response_ids, width_t, pad), r_ids[:, :width_t]]),
            mask=torch.cat([_pad_right(fresh.mask, width_t, False), r_mask[:, :width_t]]),
            rewards=torch.cat([fresh.rewards, self.buffer.rewards[groups].reshape(-1).to(fresh.rewards.dtype)]),
            group_size=fresh.group_size,
            logp_old=torch.cat([_pad_right(fresh.logp_old, width_t, 0.0), logp_gen[:, :width_t]]),
        )
        return self.prepare(mixed)

    # ------------------------------------------------------------------ the rollout phase
    def rollout(self) -> tuple[RolloutBatch, list[str]]:
        fresh, texts = super().rollout()  # phase A, exactly as on-policy
        if self.pending is not None:
            self._ingress(self.pending, self.step - 1)
        groups = self._select()
        self.pending = fresh
        batch = self._mixed(fresh, groups) if groups else fresh
        self.replay_log["replay/ratio"] = 1.0 - fresh.batch_size / batch.batch_size
        return batch, texts

    def train_step(self) -> dict[str, Any]:
        metrics = super().train_step()
        return {**metrics, **self.replay_log}
