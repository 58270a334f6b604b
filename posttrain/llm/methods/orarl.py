r"""OraRL in the LLM trainer (docs: methods/orarl.md): the task's reference solution as one oracle row per group.

``algorithm.method: orarl`` with ``rollout.oracle`` set. The oracle stage
(`posttrain.llm.rollout.oracle`) appends each prompt's reference solution as the last row of its
group (``synthetic``), scores it with the same reward and recomputes ``logp_old`` of every row with
the policy. This bundle then, per group of n sampled rows and the oracle (``rollout.group_size = n + 1``):

- advantages (`orarl_batch_advantages`): `posttrain.estimators.advantages.oracle.orarl_advantages` on the
  ``[G, n]`` sampled rewards and the ``[G]`` oracle rewards: policy-only raw-centred baseline,
  directional gain on positive rows, detached capped oracle advantage, sign-balanced selection of
  $K = \lfloor n(1-p)\rfloor$ rows (oracle + ``q_pos`` positives + ``q_neg`` negatives) and the
  post-selection correction; dropped rows get advantage 0;
- the selection reaches the loss through ``RolloutBatch.kept`` (the ``before_update`` hook sets it
  from the same function), so the token mean of PPO-clip (clip 0.2 / 0.2, ``token-mean``, no KL)
  runs over the kept rows only.

Logged (hook): ``orarl/gain`` (mean directional gain g), ``orarl/oracle_advantage`` (mean final
oracle advantage), ``orarl/flips`` (kept sampled rows per group whose sign differs from
$r_i - \mu_\pi$), ``orarl/kept`` (fraction of rows in the loss); the stage logs the oracle's reward.

Simplified against the paper: dropped rows are masked, not sliced out of the batch, so the
update's forward still runs on all n + 1 rows (their gradient is zero): the paper's 1.48x faster
update is not realised here. The oracle is the task's ``solution`` text (no annotation serialiser
per task family beyond that).

Reference: Li, Mu, Li, Qian, Zhang, Hou, Cheng 2026, Annotations as Rollouts (arXiv:2608.20492).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import broadcast_sequence_advantages, orarl_advantages
from posttrain.estimators.advantages import OracleMode, OraRLAdvantages
from posttrain.llm.methods.algorithm import Algorithm, MethodPreset, UpdateContext, preset_algorithm
from posttrain.llm.methods.needs import Need
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.typed import Checked, Range

__all__ = [
    "OraRLOptions",
    "kept_rows",
    "orarl_algorithm",
    "orarl_batch_advantages",
    "orarl_keep_hook",
    "orarl_pipeline",
]

_LOSS = MethodPreset("grpo", "ppo_clip", "token-mean")
"""The paper's update: PPO-clip 0.2 / 0.2 on every kept row, token mean over the mini-batch, no KL."""


def kept_rows(n: int, prune_ratio: float) -> int:
    """$K = \\lfloor n(1-p)\\rfloor$, the rows of a group that stay in the loss (oracle included).

    Examples:
        >>> kept_rows(8, 0.5)
        4
    """
    return math.floor(n * (1.0 - prune_ratio) + 1e-9)


def orarl_pipeline(batch: RolloutBatch, **options: Any) -> OraRLAdvantages:
    """`orarl_advantages` on a batch whose groups end with their oracle row (``synthetic``), ``[G, n+1]`` out."""
    if batch.synthetic is None:
        raise DomainError("synthetic: OraRL needs one oracle row per group (set rollout.oracle)")
    g, k = batch.num_groups, batch.group_size
    last = torch.zeros(g, k, dtype=torch.bool, device=batch.mask.device)
    last[:, -1] = True
    if not torch.equal(batch.synthetic.reshape(g, k), last):
        raise DomainError("synthetic: expected exactly one synthetic (oracle) row per group, its last row")
    rewards = batch.grouped_rewards()
    return orarl_advantages(rewards[:, :-1], rewards[:, -1], **options)


def orarl_batch_advantages(batch: RolloutBatch, **options: Any) -> Tensor:
    """``[B, T]`` OraRL advantages of a batch (`orarl_pipeline`), 0 on dropped rows and off the mask."""
    return broadcast_sequence_advantages(orarl_pipeline(batch, **options).advantages, batch.mask)


def orarl_keep_hook(
    **options: Any,
) -> Callable[[RolloutBatch, Any, UpdateContext], tuple[RolloutBatch, Any, dict[str, Tensor]]]:
    """The ``before_update`` hook: ``kept`` = the sign-balanced selection (computed once per rollout batch)."""

    def hook(batch: RolloutBatch, state: Any, ctx: UpdateContext) -> tuple[RolloutBatch, Any, dict[str, Tensor]]:
        if state is None:
            out = orarl_pipeline(batch, **options)
            keep = out.keep.reshape(-1)
            keep = keep if batch.kept is None else keep & batch.kept
            metrics = {
                "orarl/gain": out.gain.float().mean(),
                "orarl/oracle_advantage": out.advantages[:, -1].float().mean(),
                "orarl/flips": out.flips.float().mean(),
                "orarl/kept": keep.float().mean(),
            }
            state = (keep, metrics)
        keep, metrics = state
        return batch.replace(kept=keep), state, metrics

    return hook


@dataclass(frozen=True)
class OraRLOptions(Checked):
    """``algorithm.options`` of ``orarl`` (the released recipe's defaults).

    ``prune_ratio`` p (null: every row kept, no selection or correction: the "no pruning" ablation),
    ``q_pos`` / ``q_neg`` (kept positive / negative sampled rows; ``q_pos + q_neg + 1 = floor(n (1 - p))``),
    ``gamma`` (directional-gain exponent; 0 disables it), ``oracle_mode`` (``detached``, or ``gap``: the
    "w/o detached oracle" ablation), ``rms_match`` (the post-selection RMS step).
    """

    prune_ratio: Annotated[float, Range(0.0, 1.0, high_open=True)] | None = 0.5
    q_pos: Annotated[int, Range(0, 1 << 16)] = 1
    q_neg: Annotated[int, Range(0, 1 << 16)] = 2
    gamma: Annotated[float, Range(0.0)] = 0.25
    oracle_mode: OracleMode = OracleMode.DETACHED
    rms_match: bool = True


def orarl_algorithm(horizon: int, options: OraRLOptions | None = None, *, group_size: int | None = None) -> Algorithm:
    """The OraRL bundle (``algorithm.method: orarl``; ``rollout.group_size`` = n samples + the oracle; options:
    `OraRLOptions`)."""
    o = options or OraRLOptions()
    prune_ratio, q_pos, q_neg = o.prune_ratio, o.q_pos, o.q_neg
    where = "algorithm.options"
    if group_size is None or group_size < 2:
        raise DomainError(f"rollout.group_size: OraRL needs n >= 1 samples plus the oracle row, got {group_size!r}")
    n = group_size - 1
    keep = n + 1
    if prune_ratio is not None:
        keep = kept_rows(n, prune_ratio)
        if not 2 <= keep <= n + 1:
            raise DomainError(
                f"{where}.prune_ratio: keeps floor(n (1 - p)) = {keep} rows of n = {n} samples + the oracle; "
                "expected 2 <= K <= n + 1 (raise rollout.group_size or lower prune_ratio)"
            )
        if q_pos + q_neg + 1 != keep:
            raise DomainError(
                f"{where}.q_pos, {where}.q_neg: expected q_pos + q_neg + 1 = K = floor(n (1 - p)) = {keep} "
                f"(n = {n}, p = {prune_ratio}), got {q_pos} + {q_neg} + 1"
            )
    kwargs: dict[str, Any] = dict(
        gamma=float(o.gamma), oracle_mode=OracleMode(o.oracle_mode).value, prune=prune_ratio is not None, keep=keep,
        q_pos=int(q_pos), q_neg=int(q_neg), rms_match=bool(o.rms_match),
    )  # fmt: skip
    base = preset_algorithm(_LOSS, horizon=horizon)
    return dataclasses.replace(
        base,
        advantage=functools.partial(orarl_batch_advantages, **kwargs),
        before_update=orarl_keep_hook(**kwargs) if prune_ratio is not None else None,
        needs=base.needs | {Need.SYNTHETIC},
    )
