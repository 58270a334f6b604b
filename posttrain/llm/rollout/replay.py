"""Headroom-Drift Replay in the LLM trainer (docs: methods/hdr.md): stored GRPO groups join the fresh batch.

`ReplayStage` is a `RolloutStage` (``rollout.replay`` in the config):

1. the fresh batch is generated and scored exactly as on-policy (same prompts, same seeds: replay
   uses no random numbers);
2. `after_rollout`: one teacher-forced pass (no grad) gives the current log-probs
   of every stored response; the buffer is ranked, gated and refreshed by
   `posttrain.estimators.selection.replay.replay_select`; the admitted groups are appended to the fresh
   batch with their stored behaviour log-probs as ``logp_old`` (docs: methods/hdr.md). The loop then fills
   the method's advantages (for GRPO equal to the stored ones: they depend on the group's rewards
   only) and needed fields on the mixed batch;
3. `after_update`: the step's mixed-outcome fresh groups enter the FIFO buffer
   with their advantages (ingress after the update: no same-step replay).

The state (buffer tensors, the stored prompts, the next group id) is explicit and checkpointed.
Logged per step: ``replay/groups`` (admitted), ``replay/scanned``, ``replay/buffer`` and
``replay/ratio`` (replayed rows / all rows). Simplifications: every stored response is re-scored
each step (the scan is cheap at toy scale; a production run caps and batches it with the
old-log-prob pass); ``reward_mean`` in the step log includes replayed groups; stored ``logp_gen``
is the rollout engine's log-prob (equal to the trainer's numerics for the HF engine).

Data parallel: the buffer is per rank. Under DDP each rank stores its own fresh groups and replays its
own, so ranks may replay different numbers of groups and run different numbers of micro-batch forwards
per update; this is safe because the DDP forward is no collective
(`wrap_model` turns off its buffer sync), the gradients are all-reduced
once per update (after each rank's last micro-batch) and the trainer's all-reduces (loss normaliser,
FLOPs) run once per update / step on every rank. The gating pass uses the unwrapped policy. Tested
(``tests/llm/test_distributed.py``): 2 gloo ranks, micro-batches of one group, rank 0 replaying groups
and rank 1 none, complete 3 steps with equal all-reduce counts and bitwise-identical weights. Under
FSDP2 ranks with unequal buffers would run unequal numbers of sharded forwards (all-gathers), so
replay is refused there at config load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor

from posttrain.estimators import replay_add, replay_init, replay_select, zero_off_mask
from posttrain.estimators.selection import REPLAY_RULES, ReplayBuffer, replay_rule
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.engine import left_pad
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.rollout.stages import StepContext
from posttrain.llm.typed import Checked, OneOf, Range

__all__ = ["ReplayConfig", "ReplayStage"]


def _pad_right(x: Tensor, width: int, value: float | int | bool) -> Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[-1]), value=value)


def _pad_left(x: Tensor, width: int, value: float | int | bool) -> Tensor:
    return torch.nn.functional.pad(x, (width - x.shape[-1], 0), value=value)


@dataclass(frozen=True)
class ReplayConfig(Checked):
    """``rollout.replay``: Headroom-Drift Replay of stored groups (docs: methods/hdr.md; `posttrain.llm.rollout.replay`).

    ``rule``: a name in ``registry("replay")``; ``k_rep``: groups replayed per step (0: on-policy);
    ``tau``: drift gate; ``capacity``: buffer size (groups); ``success_threshold``: ingress
    indicator ``r >= threshold`` (null: ``r > 0``).
    """

    rule: Annotated[str, OneOf(REPLAY_RULES)] = "hdr"
    k_rep: Annotated[int, Range(0, 1 << 12)] = 2
    tau: Annotated[float, Range(0.0)] = 1e-2
    capacity: Annotated[int, Range(1, 1 << 16)] = 8
    success_threshold: float | None = None


class ReplayStage:
    """Appends up to ``k_rep`` replayed groups to every fresh batch; stores the fresh groups after the update.

    Args:
        cfg: rule (a name in ``registry("replay")``), k_rep, tau, capacity, success_threshold.
        group_size: K. horizon: the longest response the buffer stores (tokens).
    """

    def __init__(self, cfg: ReplayConfig, *, group_size: int, horizon: int) -> None:
        self.cfg, self.rule, self.horizon = cfg, replay_rule(cfg.rule), int(horizon)
        self.buffer: ReplayBuffer = replay_init(group_size, self.horizon)
        self.prompts: dict[int, list[int]] = {}  # group id -> prompt token ids
        self.next_id = 0
        self._fresh_rows = 0  # within a step: the fresh rows lead the batch handed to after_update

    def fresh_samples(self, group_size: int) -> int:
        return group_size

    # ------------------------------------------------------------------ phases B-C and the mixed batch
    def after_rollout(self, batch: RolloutBatch, ctx: StepContext) -> tuple[RolloutBatch, dict[str, float]]:
        self._fresh_rows = batch.batch_size
        groups, metrics = self._select(ctx)
        mixed = self._mixed(batch, groups, ctx.pad_id) if groups else batch  # the buffer lives on the CPU
        return mixed, {**metrics, "replay/ratio": 1.0 - batch.batch_size / mixed.batch_size}

    def _stored_rows(
        self, groups: list[int], pad_id: int, device: torch.device
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Prompt ids/mask (left-padded) and responses ``[R*K, horizon]`` of the given buffer rows, on ``device``."""
        k = self.buffer.tokens.shape[1]
        p_ids, p_mask = left_pad([self.prompts[int(self.buffer.prompt[c])] for c in groups], pad_id)
        rows = len(groups) * k
        parts = (
            p_ids.repeat_interleave(k, 0),
            p_mask.repeat_interleave(k, 0),
            self.buffer.tokens[groups].reshape(rows, -1),
            self.buffer.mask[groups].reshape(rows, -1),
        )
        return tuple(t.to(device) for t in parts)  # type: ignore[return-value]

    def _select(self, ctx: StepContext) -> tuple[list[int], dict[str, float]]:
        """The admitted buffer rows (the buffer's caches refreshed) and the scan's metrics."""
        if self.buffer.size == 0 or self.cfg.k_rep == 0:
            return [], {"replay/groups": 0.0, "replay/scanned": 0.0, "replay/buffer": float(self.buffer.size)}
        device = next(ctx.policy.parameters()).device
        p_ids, p_mask, r_ids, r_mask = self._stored_rows(list(range(self.buffer.size)), ctx.pad_id, device)
        with torch.no_grad():  # the teacher-forced gating pass
            logp, _ = token_logprobs(
                ctx.policy, p_ids, p_mask, r_ids, r_mask, temperature=ctx.temperature,
                group_size=self.buffer.tokens.shape[1],
            )  # fmt: skip
        logp = zero_off_mask(logp, r_mask)
        logp = logp.cpu().reshape(self.buffer.logp_gen.shape)
        sel, self.buffer = replay_select(
            self.buffer, logp.to(self.buffer.logp_gen.dtype), k_rep=self.cfg.k_rep,
            tau=self.rule.threshold(self.cfg.tau), order=self.rule.order, step=ctx.step,
        )  # fmt: skip
        log = {"replay/scanned": float(sel.scanned.sum()), "replay/buffer": float(self.buffer.size)}
        return sel.rows.tolist(), {"replay/groups": float(sel.rows.numel()), **log}

    def _mixed(self, fresh: RolloutBatch, groups: list[int], pad: int) -> RolloutBatch:
        assert fresh.logp_old is not None
        device = fresh.mask.device
        p_ids, p_mask, r_ids, r_mask = self._stored_rows(groups, pad, device)
        width_p = max(fresh.prompt_ids.shape[-1], p_ids.shape[-1])
        width_t = max(fresh.response_ids.shape[-1], int(r_mask.any(0).nonzero().max()) + 1)
        logp_gen = self.buffer.logp_gen[groups].reshape(r_ids.shape).to(device, fresh.logp_old.dtype)
        return RolloutBatch(
            prompt_ids=torch.cat([_pad_left(fresh.prompt_ids, width_p, pad), _pad_left(p_ids, width_p, pad)]),
            prompt_mask=torch.cat([_pad_left(fresh.prompt_mask, width_p, False), _pad_left(p_mask, width_p, False)]),
            response_ids=torch.cat([_pad_right(fresh.response_ids, width_t, pad), r_ids[:, :width_t]]),
            mask=torch.cat([_pad_right(fresh.mask, width_t, False), r_mask[:, :width_t]]),
            rewards=torch.cat([fresh.rewards, self.buffer.rewards[groups].reshape(-1).to(device, fresh.rewards.dtype)]),
            group_size=fresh.group_size,
            logp_old=torch.cat([_pad_right(fresh.logp_old, width_t, 0.0), logp_gen[:, :width_t]]),
        )

    # ------------------------------------------------------------------ phase E (ingress after the update)
    def after_update(self, batch: RolloutBatch, ctx: StepContext) -> None:
        fresh = batch.rows(0, self._fresh_rows).to("cpu")
        g, k = fresh.num_groups, fresh.group_size
        assert fresh.advantages is not None and fresh.logp_old is not None
        if fresh.response_ids.shape[-1] > self.horizon:
            raise ValueError(
                f"replay: responses of {fresh.response_ids.shape[-1]} tokens exceed the buffer's {self.horizon}"
            )
        ids = torch.arange(self.next_id, self.next_id + g)
        self.next_id += g
        self.prompts.update({int(gid): list(p) for gid, p in zip(ids.tolist(), ctx.prompts, strict=True)})
        seq_adv = torch.where(fresh.mask, fresh.advantages, torch.nan).nanmean(-1).nan_to_num(0.0)
        self.buffer = replay_add(
            self.buffer,
            tokens=_pad_right(fresh.response_ids, self.horizon, ctx.pad_id).reshape(g, k, -1),
            mask=_pad_right(fresh.mask, self.horizon, False).reshape(g, k, -1),
            rewards=fresh.rewards.reshape(g, k).float(), advantages=seq_adv.reshape(g, k).float(),
            logp_gen=_pad_right(fresh.logp_old, self.horizon, 0.0).reshape(g, k, -1).float(),
            prompt=ids, step=ctx.step, capacity=self.cfg.capacity, success_threshold=self.cfg.success_threshold,
        )  # fmt: skip
        kept = set(self.buffer.prompt.tolist())
        self.prompts = {gid: p for gid, p in self.prompts.items() if gid in kept}

    # ------------------------------------------------------------------ explicit state
    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer._asdict(), "prompts": dict(self.prompts), "next_id": self.next_id}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.buffer = ReplayBuffer(**state["buffer"])
        self.prompts = {int(g): list(p) for g, p in state["prompts"].items()}
        self.next_id = int(state["next_id"])
