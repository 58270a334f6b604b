"""The task's reference solution as one extra row per group: a gold rollout scored by the same reward.

`OracleStage` is a `RolloutStage` (``rollout.oracle`` in the config). With
``rollout.group_size = n + 1`` the engine samples ``n`` responses per prompt (`OracleStage.fresh_samples`,
as RAIL samples ``K - b``); `OracleStage.after_rollout` then

1. writes each prompt's reference solution with the task's own serialiser (``Task.solution(problem,
   rng)``: the completion text the supervised warm-up trains on), tokenised like a sampled response:
   its tokens, then ``<eos>``. It is not cut to ``rollout.max_new_tokens`` (a cut answer would no
   longer score); the response width grows to fit;
2. scores it with the step's reward (``StepContext.score``, the function that scored the sampled rows:
   the oracle's reward is computed, never assumed). A reward below ``expected_reward`` means the
   serialisation does not round-trip through the reward's parser (it silently shrinks OraRL's
   oracle signal): counted in ``oracle/below_expected`` and warned about (`OracleWarning`);
3. appends it as the last row of its group, marked in ``RolloutBatch.synthetic`` (so the step log
   leaves it out of the reward curves);
4. recomputes ``logp_old`` of every row with the policy (no grad, `token_logprobs`, micro-batches of
   whole groups): the engine has no log-prob for a row it did not sample, and the gold row's
   importance ratio must come from the same forward as the update's.

OraRL (`posttrain.llm.methods.orarl`) reads the synthetic rows; any other method trains on them as
on sampled rows (GRPO then is the paper's "naive GT injection" baseline). Logged per step:
``oracle/reward_mean`` and ``oracle/below_expected`` (groups whose oracle scored below
``expected_reward``). The stage keeps no state; the solution's random draws (tasks with several
correct answers) come from a generator seeded by the step's seed.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.rollout.stages import StatelessStage, StepContext
from posttrain.llm.rollout.text import right_pad
from posttrain.llm.typed import Checked

__all__ = ["OracleConfig", "OracleStage", "OracleWarning", "solution_ids"]

_PER_PROMPT = ("prompt_ids", "prompt_mask", "domain", "prompt_features")
"""Row fields shared by the rows of a group: the oracle row copies its group's."""


class OracleWarning(UserWarning):
    """A serialised reference solution scored below ``rollout.oracle.expected_reward``."""


@dataclass(frozen=True)
class OracleConfig(Checked):
    """``rollout.oracle``: append the task's reference solution to every group (`posttrain.llm.rollout.oracle`).

    ``expected_reward``: what a correct serialisation scores (1 for the built-in tasks); an oracle
    below it is counted in ``oracle/below_expected`` and warned about.
    """

    expected_reward: float = 1.0


def solution_ids(tokenizer: Any, text: str) -> list[int]:
    """A completion text as response token ids: its tokens (no special tokens added), then ``<eos>``.

    Examples:
        >>> from posttrain.llm.tools.tiny import char_tokenizer
        >>> tok = char_tokenizer()
        >>> solution_ids(tok, "12")[-1] == tok.eos_token_id, len(solution_ids(tok, "12"))
        (True, 3)
    """
    return [*tokenizer(text, add_special_tokens=False)["input_ids"], int(tokenizer.eos_token_id)]


def _append_per_group(x: Tensor, extra: Tensor, n: int) -> Tensor:
    """Rows ``[G*n, ...]`` with one ``extra [G, ...]`` row after each group's ``n``: ``[G*(n+1), ...]``."""
    g = extra.shape[0]
    grouped = x.reshape(g, n, *x.shape[1:])
    return torch.cat([grouped, extra.unsqueeze(1)], dim=1).reshape(g * (n + 1), *x.shape[1:])


def _widen(x: Tensor, width: int, value: float | int | bool) -> Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[-1]), value=value)


class OracleStage(StatelessStage):
    """Appends one reference-solution row (``synthetic``) to every group; recomputes ``logp_old`` of all rows.

    Args:
        cfg: the ``rollout.oracle`` section. tokenizer: the policy's tokenizer (``eos_token_id``).
        task: the run's task (its ``solution``). micro_batch_size: rows per no-grad forward of the
            ``logp_old`` recomputation (a multiple of the group size; None: the whole batch at once).
    """

    def __init__(self, cfg: OracleConfig, *, tokenizer: Any, task: Any, micro_batch_size: int | None = None) -> None:
        self.cfg, self.tokenizer, self.task, self.micro_batch_size = cfg, tokenizer, task, micro_batch_size

    def fresh_samples(self, group_size: int) -> int:
        if group_size < 2:
            raise DomainError(f"rollout.group_size: the oracle row needs groups of at least 2 rows, got {group_size}")
        return group_size - 1

    def after_rollout(self, batch: RolloutBatch, ctx: StepContext) -> tuple[RolloutBatch, dict[str, float]]:
        n, g, dev = batch.group_size, batch.num_groups, batch.mask.device
        if len(ctx.problems) != g:
            raise DomainError(f"problems: the oracle stage needs the step's {g} problems, got {len(ctx.problems)}")
        rng = random.Random(ctx.seed * 7919 + 0x0A)
        texts = [str(self.task.solution(p, rng)) for p in ctx.problems]
        ids, mask = right_pad([solution_ids(self.tokenizer, t) for t in texts], ctx.pad_id)
        oracle_reward = ctx.score(ids, mask, 1).to(device=dev, dtype=batch.rewards.dtype)  # [G], same reward
        width = max(batch.response_ids.shape[1], ids.shape[1])
        new: dict[str, Tensor] = {
            "response_ids": _append_per_group(_widen(batch.response_ids, width, ctx.pad_id), _widen(ids, width, ctx.pad_id).to(dev), n),
            "mask": _append_per_group(_widen(batch.mask, width, False), _widen(mask, width, False).to(dev), n),
            "rewards": _append_per_group(batch.rewards, oracle_reward, n),
            "synthetic": _append_per_group(torch.zeros(g * n, dtype=torch.bool, device=dev), torch.ones(g, dtype=torch.bool, device=dev), n),
        }  # fmt: skip
        if batch.judged is not None:  # the oracle's reward is always a number (a NaN was scored 0 by ctx.score)
            new["judged"] = _append_per_group(batch.judged, torch.ones(g, dtype=torch.bool, device=dev), n)
        for name, value in vars(batch).items():
            if name in new or name == "logp_old" or not isinstance(value, Tensor):
                continue
            if name not in _PER_PROMPT:
                raise DomainError(f"{name}: the oracle stage cannot extend this batch field (set before it)")
            new[name] = _append_per_group(value, value[::n], n)
        out = RolloutBatch(**new, group_size=n + 1)  # type: ignore[arg-type]
        out = out.replace(logp_old=self._logp_old(out, ctx))
        below = oracle_reward < self.cfg.expected_reward
        if bool(below.any()):
            shown = [(t, float(r)) for t, r, b in zip(texts, oracle_reward.tolist(), below.tolist(), strict=True) if b]
            warnings.warn(
                f"rollout.oracle: {int(below.sum())} of {g} reference solutions scored below expected_reward="
                f"{self.cfg.expected_reward} (the serialisation does not round-trip through the reward), e.g. "
                f"{shown[:3]}",
                OracleWarning,
                stacklevel=2,
            )
        return out, {"oracle/reward_mean": float(oracle_reward.mean()), "oracle/below_expected": float(below.sum())}

    def _logp_old(self, batch: RolloutBatch, ctx: StepContext) -> Tensor:
        """``[B, T]`` log-probs of every row under the current policy (no grad), in whole-group micro-batches."""
        size = self.micro_batch_size or batch.batch_size
        size = max(size - size % batch.group_size, batch.group_size)
        parts = []
        with torch.no_grad():
            for i in range(0, batch.batch_size, size):
                mb = batch.rows(i, min(i + size, batch.batch_size))
                logp, _ = token_logprobs(
                    ctx.policy, mb.prompt_ids, mb.prompt_mask, mb.response_ids, mb.mask, temperature=ctx.temperature,
                    group_size=mb.group_size,
                )  # fmt: skip
                parts.append(logp)
        return torch.cat(parts)
