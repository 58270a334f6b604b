"""Rollout stages: components the training loop calls at fixed points of every step.

A stage changes what the loop trains on without the loop knowing which method it is: the loop
calls every stage in order at the same points of every step and merges the metrics they return.

1. before generation, `RolloutStage.fresh_samples` says how many responses per prompt the
   engine samples for the stage to hand on ``group_size`` (RAIL samples ``K - b`` and adds ``b``
   branches; replay samples all ``K``);
2. after the fresh responses are scored (raw batch: rewards and behaviour log-probs, nothing else),
   `RolloutStage.after_rollout` may extend or replace the batch (replayed groups, branch
   continuations) and returns its metrics; the loop then fills the algorithm's needs and the
   advantages once, on the final batch;
3. after the step's optimizer updates, `RolloutStage.after_update` sees the prepared batch
   (e.g. replay ingress of the fresh groups).

A stage's state is explicit (``state_dict``/``load_state_dict`` of plain tensors and Python
values, checkpointed by the trainer with the optimizer). Stages are built from the config at the
edge (`posttrain.llm.run.build_stages`, from ``rollout.replay`` and ``rollout.branching``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.engine import RolloutEngine
from posttrain.llm.rollout.logprobs import token_logprobs

__all__ = ["RolloutStage", "StatelessStage", "StepContext"]


@dataclass(frozen=True)
class StepContext:
    """What a stage may use during one step.

    Attributes:
        step: index of the step being run (the number of completed steps before it).
        steps: ``optim.steps`` (training progress is ``step / steps``).
        seed: the seed of the step's fresh rollout (a stage derives its own engine seeds from it).
        policy: the bare policy model (forwards under ``torch.no_grad`` only).
        engine: the rollout engine (stages generate through the Protocol).
        prompts: this rank's G prompts as token id lists, one per group.
        score: ``score(response_ids [B, T], mask [B, T], n) -> rewards [B]`` of group-major rows, ``n`` per prompt.
        pad_id: the tokenizer's pad id. temperature: the sampling temperature.
        problems: this rank's G problems (`posttrain.llm.rollout.tasks.Problem`: prompt, gold answer, task
            data), one per group, in the order of ``prompts``; empty where the caller has none.
    """

    step: int
    steps: int
    seed: int
    policy: Any
    engine: RolloutEngine
    prompts: Sequence[Sequence[int]]
    score: Callable[[Tensor, Tensor, int], Tensor]
    pad_id: int
    temperature: float
    problems: Sequence[Any] = ()

    def token_entropy(self, batch: RolloutBatch) -> Tensor:
        """``[B, T]`` full-vocabulary entropy of every response token of ``batch`` under the policy at the
        sampling temperature (the behaviour policy at rollout time; no gradient; 0 off the mask)."""
        with torch.no_grad():
            _, entropy = token_logprobs(
                self.policy, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask,
                temperature=self.temperature, with_entropy=True, group_size=batch.group_size,
            )  # fmt: skip
        assert entropy is not None
        return entropy


@runtime_checkable
class RolloutStage(Protocol):
    """A rollout-phase component with explicit state; see the module docstring for when each method runs."""

    def fresh_samples(self, group_size: int) -> int:
        """Responses per prompt the stage needs on input to hand on groups of ``group_size``."""
        ...

    def after_rollout(self, batch: RolloutBatch, ctx: StepContext) -> tuple[RolloutBatch, dict[str, float]]:
        """The batch to train on (raw: no advantages or filled needs yet) and the stage's metrics."""
        ...

    def after_update(self, batch: RolloutBatch, ctx: StepContext) -> None:
        """Called with the prepared batch once the step's optimizer updates are done."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The stage's state (plain tensors and Python values)."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict`'s output."""
        ...


class StatelessStage:
    """Base of a stage with no state and nothing to do after the update (subclasses write
    ``fresh_samples`` and ``after_rollout``)."""

    def after_update(self, batch: RolloutBatch, ctx: StepContext) -> None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        return None
