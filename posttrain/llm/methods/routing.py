r"""Self-Routing in the LLM trainer (docs: methods/self_routing.md): one recipe per prompt per step.

``algorithm.method: self_routing``. Every step the G prompts' K rollouts are routed to one of four
recipes from their own behaviour state, then one loss sums the per-queue losses:

- **routing** (`RoutingStage`, a rollout stage, the last one of the step): one no-grad forward of
  the policy gives the full-vocabulary entropy of every response token at the sampling temperature
  (at rollout time the policy is the behaviour policy; the engines do not return entropies); each
  rollout's masked mean entropy and its binary reward feed
  `self_routing_probabilities` (accuracy memberships, batch-calibrated confidences, the
  *reconstructed* features, the four scores, $p = s/\sum s$), and `sample_routes` draws one recipe
  per prompt from uniforms of a seed stream of its own (`route_seed` of the step's rollout seed).
  The batch gets ``route`` (the recipe of each row), ``kept`` (False on SKIP rows: `loss_mask`
  drops them) and ``route_weight`` (`queue_token_weights`), and the step logs the route counts
  ``routing/n_grpo`` ... ``routing/n_skip`` and the mean probabilities ``routing/p_grpo`` ...;
- **GRPO** rows: group-normalised advantages and PPO-clip (clip 0.2);
- **OPSD** rows: on-policy self-distillation with the sampled-token signal of OPD: PPO-clip on the
  advantage $\ell^T_t - \ell^{old}_t$ (`opd_token_advantages`), where $\ell^T$ is the self-teacher's
  log-prob of the student's own response ids scored after a *privileged* prompt
  (``context_template`` with the problem's ``{prompt}``, its gold ``{answer}`` and/or the task's
  ``{solution}``), re-encoded with the run's chat template; the response ids are never re-tokenised.
  The self-teacher is ``model.teacher`` if set, else the frozen reference (``model.reference``, by
  default the initial weights);
- **REG** rows: $\beta_{REG}\,\mathrm{k3}(\ell, \ell_{ref})$ to the frozen reference;
- **SKIP** rows: no loss, no gradient, counted nowhere.

The per-token loss of row $i$ is $w_i\,\ell^{q(i)}_{it}$ and the trainer's token-mean
aggregation over the kept rows then equals `routed_loss`: per-queue token means weighted by the
queue sizes (in prompts), so a queue of long responses does not dominate by its token count. The
teacher-context and reference forwards run only on the OPSD and REG rows (`queue_filler`).

Simplifications: the routing batch is the rank's share of the prompts (data-parallel ranks route
and normalise their queues separately); groups with an unjudged reward are routed to SKIP and left
out of the calibration; a KL term or entropy bonus set in the config is added unweighted to every
kept row; the trainer's FLOPs estimate counts a reference forward of every row. OPSD is the
sampled-token form (reading A of the paper with the OPD estimator), not a full-vocabulary KL.

Reference: Li, Zhang, Huang, Ma, Liu, Liu 2026, From Rollouts to Recipes (arXiv:2609.01422).
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import (
    AggregationMode,
    broadcast_sequence_advantages,
    clipped_ratio_loss,
    group_normalized_advantages,
    k3_kl,
    masked_mean,
    opd_token_advantages,
    self_routing_probabilities,
    zero_off_mask,
)
from posttrain.estimators.losses import queue_token_weights
from posttrain.estimators.selection import RECIPES, DeltaMode, Recipe, sample_routes
from posttrain.llm.methods.algorithm import Algorithm, ClipOptions, EdgeContext
from posttrain.llm.methods.needs import Filler, Need
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.engine import left_pad
from posttrain.llm.rollout.stages import StatelessStage, StepContext
from posttrain.llm.rollout.tasks import Problem
from posttrain.llm.typed import OneOf, Range

__all__ = [
    "RoutingOptions",
    "RoutingStage",
    "queue_filler",
    "route_batch",
    "route_seed",
    "routing_edge",
    "self_routing_algorithm",
    "teacher_contexts",
]

ROUTE_STREAM = 0x2047E
"""Tag of the router's seed stream (distinct from the engine's and the ``before_update`` hooks')."""

CONTEXT_FIELDS = ("prompt", "answer", "solution")
"""The fields a ``context_template`` may use."""


_POSITIVE = Range(0.0, None, low_open=True)


@dataclass(frozen=True)
class RoutingOptions(ClipOptions):
    """Self-Routing's options (``algorithm.options``).

    Attributes:
        clip_low, clip_high: PPO-clip range of the GRPO and OPSD queues.
        beta_reg: weight of the REG queue's k3 KL to the reference.
        delta_mode: how the confidence deviation is mapped to [0, 1] (`DeltaMode`).
        sigma_l, sigma_m, sigma_h: widths of the accuracy memberships (the paper's 0.18, 0.16, 0.18).
        context_template: the self-teacher's prompt, a format string over ``{prompt}`` (required),
            ``{answer}`` (the problem's gold answer) and ``{solution}`` (the task's written solution).
    """

    beta_reg: Annotated[float, Range(0.0)] = 0.1
    delta_mode: Annotated[str, OneOf(tuple(m.value for m in DeltaMode))] = DeltaMode.MINMAX.value
    sigma_l: Annotated[float, _POSITIVE] = 0.18
    sigma_m: Annotated[float, _POSITIVE] = 0.16
    sigma_h: Annotated[float, _POSITIVE] = 0.18
    context_template: str = "The correct final answer is {answer}.\n\n{prompt}"

    def check(self) -> None:
        want = f"a format string with {{prompt}} and fields among {list(CONTEXT_FIELDS)}"
        try:
            names = {f[1] for f in string.Formatter().parse(self.context_template) if f[1] is not None}
        except ValueError as exc:
            raise DomainError(f"context_template: expected {want} ({exc}), got {self.context_template!r}") from None
        if "prompt" not in names or not names <= set(CONTEXT_FIELDS):
            raise DomainError(f"context_template: expected {want}, got {self.context_template!r}")


_DEFAULT = RoutingOptions()


def route_seed(step_seed: int) -> int:
    """The router's seed of a step: a 63-bit hash of the step's rollout seed tagged as the router's stream.

    Examples:
        >>> route_seed(7) == route_seed(7) != route_seed(8)
        True
    """
    state = np.random.SeedSequence([int(step_seed), ROUTE_STREAM]).generate_state(1, np.uint64)[0]
    return int(state >> np.uint64(1))


def route_batch(
    batch: RolloutBatch, mean_entropy: Tensor, uniforms: Tensor, options: RoutingOptions = _DEFAULT
) -> tuple[RolloutBatch, dict[str, float]]:
    """The batch with ``route``, ``kept`` and ``route_weight`` set, and the route counts and mean probabilities.

    Args:
        batch: the step's rollout batch (rewards binary: 1 = correct).
        mean_entropy: ``[B]`` each rollout's mean token entropy.
        uniforms: ``[G]`` uniforms in [0, 1), one per prompt (from a seeded generator).

    Groups with an unjudged reward are routed to SKIP and left out of the calibration batch.
    """
    g, k = batch.num_groups, batch.group_size
    if tuple(mean_entropy.shape) != (batch.batch_size,) or tuple(uniforms.shape) != (g,):
        raise DomainError(
            f"mean_entropy, uniforms: expected shapes [{batch.batch_size}] and [{g}], "
            f"got {list(mean_entropy.shape)} and {list(uniforms.shape)}"
        )
    judged = batch.judged_groups().cpu()
    rewards = batch.grouped_rewards().detach().cpu().double()[judged]
    entropy = mean_entropy.detach().cpu().double().reshape(g, k)[judged]
    probs = torch.zeros(g, len(RECIPES), dtype=torch.float64)
    routes = torch.full((g,), int(Recipe.SKIP), dtype=torch.long)
    if bool(judged.any()):
        sigmas = {"sigma_l": options.sigma_l, "sigma_m": options.sigma_m, "sigma_h": options.sigma_h}
        probs[judged] = self_routing_probabilities(rewards, entropy, delta_mode=options.delta_mode, **sigmas)
        routes[judged] = sample_routes(probs[judged], uniforms.detach().cpu().double()[judged])
    device = batch.mask.device
    row_routes = routes.repeat_interleave(k).to(device)
    kept = row_routes != int(Recipe.SKIP)
    if batch.kept is not None:
        kept = kept & batch.kept
    loss_mask = batch.loss_mask() & kept.unsqueeze(-1)
    weights = queue_token_weights(routes.to(device), loss_mask)
    metrics: dict[str, float] = {}
    for recipe in RECIPES:
        name = recipe.name.lower()
        metrics[f"routing/n_{name}"] = float((routes[judged] == recipe).sum())
        metrics[f"routing/p_{name}"] = float(probs[judged, recipe].mean()) if bool(judged.any()) else 0.0
    return batch.replace(route=row_routes, kept=kept, route_weight=weights), metrics


class RoutingStage(StatelessStage):
    """The rollout stage that routes each prompt (`route_batch`) from the policy's entropies at rollout time.

    With ``contexts`` (the encoded self-teacher prompt of each problem, `teacher_contexts`) it also sets
    the batch's ``context_ids``/``context_mask`` from the step's problems (`StepContext.problems`),
    which the OPSD queue's forward scores the responses under (`queue_filler` with ``in_context``).
    """

    def __init__(
        self,
        options: RoutingOptions = _DEFAULT,
        contexts: Callable[[Sequence[Problem]], list[list[int]]] | None = None,
        *,
        pad_id: int = 0,
    ) -> None:
        self.options, self.contexts, self.pad_id = options, contexts, int(pad_id)

    def fresh_samples(self, group_size: int) -> int:
        return group_size

    def after_rollout(self, batch: RolloutBatch, ctx: StepContext) -> tuple[RolloutBatch, dict[str, float]]:
        mean_entropy = masked_mean(ctx.token_entropy(batch).double(), batch.mask, dim=-1)
        gen = torch.Generator().manual_seed(route_seed(ctx.seed))
        uniforms = torch.rand(batch.num_groups, generator=gen, dtype=torch.float64)
        if self.contexts is not None:
            batch = self._with_contexts(batch, ctx.problems)
        return route_batch(batch, mean_entropy, uniforms, self.options)

    def _with_contexts(self, batch: RolloutBatch, problems: Sequence[Problem]) -> RolloutBatch:
        """``batch`` with each group's encoded self-teacher context on its rows."""
        assert self.contexts is not None
        if len(problems) != batch.num_groups:
            raise DomainError(
                f"problems: the self-teacher context needs the problem of each of the {batch.num_groups} groups, "
                f"got {len(problems)}"
            )
        ids, mask = left_pad(self.contexts(problems), self.pad_id)
        k, device = batch.group_size, batch.prompt_ids.device
        return batch.replace(
            context_ids=ids.repeat_interleave(k, dim=0).to(device),
            context_mask=mask.repeat_interleave(k, dim=0).to(device),
        )


def teacher_contexts(
    encode: Callable[[list[str]], list[list[int]]], template: str, solution: Callable[[Problem], str]
) -> Callable[[Sequence[Problem]], list[list[int]]]:
    """The encoder of the self-teacher's prompts: ``template`` formatted with each problem's prompt,
    gold answer and (only when the template asks for it) the task's solution, encoded by ``encode``
    exactly as the trainer encodes prompts (chat template, system turn)."""

    def contexts(problems: Sequence[Problem]) -> list[list[int]]:
        texts = [
            template.format(prompt=p.prompt, answer=p.answer, solution=solution(p) if "{solution}" in template else "")
            for p in problems
        ]
        return encode(texts)

    return contexts


def queue_filler(
    fill: Callable[[RolloutBatch], Tensor], recipe: Recipe, *, in_context: bool = False
) -> Callable[[RolloutBatch], Tensor]:
    """``fill`` (a ``[B, T]`` log-prob filler) run on the kept rows routed to ``recipe`` only; 0 elsewhere.

    ``in_context``: those rows are scored under the batch's ``context_ids``/``context_mask`` (the
    self-teacher's privileged prompts, set by `RoutingStage`) instead of their own prompts; the
    response ids are used as sampled.
    """

    def filler(batch: RolloutBatch) -> Tensor:
        if batch.route is None:
            raise DomainError("route: expected the router's recipes before a queue's forward (RoutingStage)")
        rows = (batch.route == int(recipe)) & batch.loss_mask().any(-1)
        dtype = batch.logp_old.dtype if batch.logp_old is not None else torch.float32
        if not bool(rows.any()):
            return torch.zeros(batch.mask.shape, dtype=dtype, device=batch.mask.device)
        idx = rows.nonzero().squeeze(-1)
        p_ids, p_mask = batch.prompt_ids[idx], batch.prompt_mask[idx]
        if in_context:
            if batch.context_ids is None or batch.context_mask is None:
                raise DomainError("context_ids: expected the self-teacher contexts (RoutingStage) before its forward")
            p_ids, p_mask = batch.context_ids[idx], batch.context_mask[idx]
        k = batch.group_size  # whole groups (a prompt's route is its rows'): each prompt computed once
        whole = idx.numel() % k == 0 and bool((idx.reshape(-1, k) // k == idx[::k, None] // k).all())
        sub = RolloutBatch(
            prompt_ids=p_ids, prompt_mask=p_mask, response_ids=batch.response_ids[idx], mask=batch.mask[idx],
            rewards=batch.rewards[idx], group_size=k if whole else 1,
        )  # fmt: skip
        values = fill(sub)
        out = torch.zeros(batch.mask.shape, dtype=values.dtype, device=values.device)
        out[idx] = values
        return out

    return filler


def routing_edge(options: RoutingOptions) -> Callable[[EdgeContext], tuple[tuple[Any, ...], dict[Need, Filler]]]:
    """The run pieces of the routed method (``Algorithm.edge``): ``((router stage,), queue-only fillers)``.

    The plain fillers of the run are ``logp_ref`` (the frozen reference) and, with ``model.teacher``,
    ``logp_teacher``; the self-teacher is the teacher if set, else the reference. The REG queue's reference
    forward and the OPSD queue's self-teacher forward (under each group's privileged context) run on their
    queue's rows only (`queue_filler`).
    """

    def edge(ctx: EdgeContext) -> tuple[tuple[Any, ...], dict[Need, Filler]]:
        rng = random.Random(ctx.seed)

        def solution(problem: Problem) -> str:
            return str(ctx.task.solution(problem, rng))

        contexts = teacher_contexts(ctx.encode, options.context_template, solution)
        reference = ctx.fill(Need.LOGP_REF)
        teacher = ctx.fill(Need.LOGP_TEACHER) if ctx.has_teacher else reference
        fillers = {
            Need.LOGP_REF: queue_filler(reference, Recipe.REG),
            Need.LOGP_TEACHER: queue_filler(teacher, Recipe.OPSD, in_context=True),
        }
        return (RoutingStage(options, contexts, pad_id=int(ctx.tokenizer.pad_token_id)),), fillers

    return edge


def self_routing_algorithm(horizon: int, options: RoutingOptions = _DEFAULT) -> Algorithm:
    """The Self-Routing bundle (``algorithm.method: self_routing``; options: `RoutingOptions`).

    Examples:
        >>> sorted(map(str, self_routing_algorithm(8).needs))
        ['logp_old', 'logp_ref', 'logp_teacher', 'route']
    """

    def advantage(batch: RolloutBatch) -> Tensor:
        assert batch.route is not None and batch.logp_teacher is not None and batch.logp_old is not None
        grpo = broadcast_sequence_advantages(group_normalized_advantages(batch.grouped_rewards()), batch.mask)
        opsd = opd_token_advantages(batch.logp_teacher, batch.logp_old, batch.mask)
        route = batch.route.unsqueeze(-1)
        adv = torch.where(route == int(Recipe.GRPO), grpo, torch.where(route == int(Recipe.OPSD), opsd, 0.0))
        return zero_off_mask(adv.to(batch.logp_old.dtype), batch.mask)

    def policy_loss(
        logp: Tensor,
        logp_old: Tensor,
        advantages: Tensor,
        mask: Tensor,
        *,
        logp_ref: Tensor | None,
        route: Tensor | None,
        route_weight: Tensor | None,
    ) -> tuple[Tensor, Any]:
        if logp_ref is None or route is None or route_weight is None:
            raise DomainError("batch: logp_ref, route and route_weight must be filled before the routed loss")
        pg, diag = clipped_ratio_loss(
            logp, logp_old, advantages, mask, clip_low=options.clip_low, clip_high=options.clip_high
        )
        reg_rows = (route == int(Recipe.REG)).unsqueeze(-1)
        ref = torch.where(reg_rows, logp_ref.to(logp.dtype), logp.detach())  # k3 = 0 off the REG rows
        loss = torch.where(reg_rows, options.beta_reg * k3_kl(logp, ref), pg)
        return zero_off_mask(loss * route_weight.to(loss.dtype).unsqueeze(-1), mask), diag

    return Algorithm(
        advantage=advantage,
        policy_loss=policy_loss,
        aggregation=AggregationMode.TOKEN_MEAN,
        horizon=int(horizon),
        needs=frozenset({Need.LOGP_OLD, Need.LOGP_REF, Need.LOGP_TEACHER, Need.ROUTE}),
        loss_needs=(Need.LOGP_REF, Need.ROUTE, Need.ROUTE_WEIGHT),
        edge=routing_edge(options),
        provides=frozenset({Need.LOGP_REF, Need.LOGP_TEACHER, Need.ROUTE}),
    )
