"""The ``Algorithm`` bundle: the callables a method is made of, resolved by name once at the config edge.

A method preset (`MethodPreset`) names an advantage estimator, a per-token policy loss, an
aggregation mode and their options. `preset_algorithm` resolves the names in the estimator
registries and returns an `Algorithm` whose fields are plain callables; the trainer calls
them and never looks at a name. The methods by name (presets and bundles) are the registry of
`posttrain.llm.methods.catalog`. What a method needs beyond the
rollout (``logp_ref`` for a KL term, ``logp_teacher`` for a loss whose signature asks for it) is
declared in ``Algorithm.needs`` and filled by the trainer. A method whose parts do not fit the
``(logp, logp_old, advantages, mask)`` loss signature (GFlowRL's whole-group flow gaps) is registered
as a `MethodBundle`: a factory ``(horizon, **options) -> Algorithm``; ``algorithm.options``
are its keyword options, and a KL term or entropy
bonus set in the config is added to its bundle like to any other.

Per token, the minimised quantity is

$$
L_{it} = \\ell^{pg}_{it} + \\beta\\,\\mathrm{KL}_{it} - c_H H_{it}
$$

aggregated once with the chosen mode (aggregation is linear, so this equals verl's separate
aggregation of each term with the same mode).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import (
    AggregationMode,
    broadcast_sequence_advantages,
    get_advantage,
    get_policy_loss,
    masked_mean,
    zero_off_mask,
)
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.logprobs import token_logprobs

__all__ = [
    "GRPO",
    "Algorithm",
    "MethodBundle",
    "MethodPreset",
    "UpdateContext",
    "check_options",
    "preset_algorithm",
    "update_seed",
    "with_penalties",
]


@dataclass(frozen=True)
class MethodPreset:
    """Registry names and options that make up a method."""

    advantage: str
    loss: str
    aggregation: str
    loss_options: Mapping[str, Any] = field(default_factory=dict)
    advantage_options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MethodBundle:
    """A method built by a factory ``(horizon, **options) -> Algorithm`` (its keyword options: ``algorithm.options``)."""

    factory: Callable[..., Algorithm]


GRPO = MethodPreset("grpo", "ppo_clip", "seq-mean-token-mean")
"""The GRPO preset: group-normalised advantages, PPO-clip, sequence mean of token means."""


NEEDS_FROM_SIGNATURE = ("logp_ref", "logp_teacher")
"""Batch fields a policy loss may ask for by naming them as keyword parameters."""


def update_seed(run_seed: int, step: int, update: int, rank: int) -> int:
    """The seed of a ``before_update`` hook's random draws (e.g. SIS's uniforms): a 63-bit hash of
    ``(run_seed, step, update, rank)`` tagged as a hook stream, so it never shares a stream with the
    engine's sampling seed of any step or rank.

    Examples:
        >>> update_seed(0, 0, 0, 0) == update_seed(0, 0, 0, 0) != update_seed(0, 0, 1, 0)
        True
    """
    import numpy as np

    keys = [int(run_seed), int(step), int(update), int(rank), 0x5EED]
    if min(keys) < 0:
        raise DomainError(f"update_seed: expected non-negative integers, got {keys[:4]}")
    return int(np.random.SeedSequence(keys).generate_state(1, np.uint64)[0] >> np.uint64(1))


@dataclass(frozen=True)
class UpdateContext:
    """What a bundle's ``before_update`` hook may use: the policy (no grad), the update index, a seed.

    ``seed`` is `update_seed` of the run seed, completed steps, update and rank: a stream of its
    own, distinct from the rollout engine's sampling seeds (fresh per step, update and rank).
    """

    model: Any
    update: int
    seed: int
    temperature: float


@dataclass(frozen=True)
class Algorithm:
    """The callables of one method; built by `build_algorithm`, used by the trainer.

    Attributes:
        advantage: the batch -> ``[B, T]`` per-token advantages, 0 off the mask (e.g. from its ``[G, K]`` rewards).
        policy_loss: ``(logp, logp_old, advantages, mask, **needs) -> (loss [B, T], diagnostics)``.
        aggregation: how the ``[B, T]`` loss becomes a scalar.
        horizon: the constant length of ``seq-mean-token-sum-norm`` (``rollout.max_new_tokens``).
        kl: ``(logp, logp_ref) -> [B, T]`` or None; ``kl_coef`` its weight.
        entropy_coef: weight of the entropy bonus (subtracted from the loss).
        needs: batch fields the trainer must fill before the loss (e.g. ``{"logp_ref"}``); for a
            scheduled bundle, the union over its phases (the trainer checks it can fill them all).
        schedule: ``(step, scores) -> Algorithm``, the bundle used at a step counted from 1, a pure
            function of the step and of ``scores``, the validation scores logged so far (one per
            evaluation, oldest first; e.g. OPD-then-RL's switch at a fixed step or at a plateau of the
            validation score), or None for a bundle that never changes.
        before_update: ``(batch, state, ctx) -> (batch, state, metrics)`` run before every optimizer
            step of a rollout batch; it may replace batch fields (SIS's effective ``logp_old``). Its
            ``state`` is explicit: None at a batch's first update, then what the previous call returned.
            ``metrics`` (0-d tensors) are averaged over the step's updates and logged.
        modules: trainable modules the method owns besides the policy (e.g. FlowRL's
            learned log-partition log Z(x)): the trainer adds their parameters to the optimizer (one extra
            parameter group), averages their gradients over data-parallel ranks and checkpoints them.
        forward: ``(model, batch, temperature, entropy_grad) -> (logp [B, T], entropy [B, T], live)``, the
            training forward of a method whose loss needs more than the sampled-token log-probs (``live``:
            differentiable tensors passed to ``policy_loss`` by name, e.g. Open-MOPD's top-K log-probs), or
            None (`token_logprobs`, no live tensors).
    """

    advantage: Callable[[RolloutBatch], Float[Tensor, "B T"]]
    policy_loss: Callable[..., tuple[Tensor, Any]]
    aggregation: AggregationMode
    horizon: int
    kl: Callable[[Tensor, Tensor], Tensor] | None = None
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    needs: frozenset[str] = frozenset()
    loss_needs: tuple[str, ...] = ()
    schedule: Callable[[int, tuple[float, ...]], Algorithm] | None = None
    before_update: Callable[[RolloutBatch, Any, UpdateContext], tuple[RolloutBatch, Any, dict[str, Tensor]]] | None = (
        None
    )
    modules: tuple[torch.nn.Module, ...] = ()
    forward: Callable[[Any, RolloutBatch, float, bool], tuple[Tensor, Tensor, dict[str, Tensor]]] | None = None

    def at(self, step: int, scores: tuple[float, ...] = ()) -> Algorithm:
        """The bundle used at ``step`` (counted from 1) given the validation ``scores`` so far:
        ``schedule(step, scores)``, or this bundle when unscheduled."""
        return self if self.schedule is None else self.schedule(step, tuple(scores))

    @property
    def wants_entropy(self) -> bool:
        """Whether the loss uses the token entropy (otherwise it is computed for logging only)."""
        return self.entropy_coef != 0.0

    def log_probs(
        self, model: Any, batch: RolloutBatch, *, temperature: float
    ) -> tuple[Float[Tensor, "B T"], Float[Tensor, "B T"], dict[str, Tensor]]:
        """The training forward: ``(logp, entropy, live)`` (entropy differentiable only when in the loss)."""
        if self.forward is not None:
            return self.forward(model, batch, temperature, self.wants_entropy)
        logp, entropy = token_logprobs(
            model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask,
            temperature=temperature, with_entropy=True, entropy_grad=self.wants_entropy,
        )  # fmt: skip
        assert entropy is not None
        return logp, entropy, {}

    def token_loss(
        self,
        logp: Float[Tensor, "B T"],
        entropy: Float[Tensor, "B T"] | None,
        batch: RolloutBatch,
        live: dict[str, Tensor] | None = None,
    ) -> tuple[Float[Tensor, "B T"], dict[str, Tensor]]:
        """The per-token loss $\\ell^{pg} + \\beta\\,KL - c_H H$ and 0-d diagnostics (token means); ``live``
        are the training forward's extra tensors (`log_probs`), passed to the policy loss by name."""
        if batch.logp_old is None or batch.advantages is None:
            raise DomainError("batch: logp_old and advantages must be filled before the loss")
        extra = {**{name: getattr(batch, name) for name in self.loss_needs}, **(live or {})}
        loss, diag = self.policy_loss(logp, batch.logp_old, batch.advantages, batch.mask, **extra)
        metrics = {f"pg/{k}": v for k, v in diag._asdict().items()} if hasattr(diag, "_asdict") else {}
        if self.kl is not None:
            assert batch.logp_ref is not None  # guaranteed by `needs`
            kl = self.kl(logp, batch.logp_ref)
            loss = loss + self.kl_coef * kl
            metrics["kl"] = masked_mean(kl.detach(), batch.mask)
        if entropy is not None and self.entropy_coef:
            loss = loss - self.entropy_coef * entropy
        return zero_off_mask(loss, batch.mask), metrics


def _sequence_advantage(fn: Callable[..., Tensor], options: Mapping[str, Any]) -> Callable[[RolloutBatch], Tensor]:
    """Adapt ``fn([G, K], **options) -> [G, K]`` (or ``fn([G, K], mask) -> [B, T]``) to a batch."""
    params = inspect.signature(fn).parameters
    if "token_rewards" in params:  # outcome reward on the last valid token (REINFORCE++)

        def from_tokens(batch: RolloutBatch) -> Tensor:
            last = batch.mask.long().cumsum(-1).argmax(-1)
            token_rewards = torch.zeros(batch.mask.shape, dtype=batch.rewards.dtype, device=batch.rewards.device)
            token_rewards[torch.arange(batch.batch_size), last] = batch.rewards
            return fn(token_rewards, batch.mask, **options)

        return from_tokens

    def grouped(batch: RolloutBatch) -> Tensor:
        if "mask" in params:
            return fn(batch.grouped_rewards(), batch.mask, **options)
        return broadcast_sequence_advantages(fn(batch.grouped_rewards(), **options), batch.mask)

    return grouped


def check_options(where: str, fn: Callable[..., Any], opts: Mapping[str, Any]) -> None:
    """Every option must be a keyword-only parameter of ``fn`` (DomainError listing the valid ones)."""
    params = inspect.signature(fn).parameters
    bad = sorted(k for k in opts if k not in params or params[k].kind is not inspect.Parameter.KEYWORD_ONLY)
    if bad:
        valid = [k for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
        raise DomainError(
            f"algorithm.{where}: unknown option(s) {', '.join(bad)}; valid: {', '.join(valid) or '(none)'}"
        )


def with_penalties(
    alg: Algorithm, kl: Callable[[Tensor, Tensor], Tensor] | None, kl_coef: float, entropy_coef: float
) -> Algorithm:
    """``alg`` (and every phase of its schedule) with the config's KL term and entropy bonus."""
    inner = alg.schedule
    return dataclasses.replace(
        alg,
        kl=kl,
        kl_coef=kl_coef,
        entropy_coef=entropy_coef,
        needs=alg.needs | ({"logp_ref"} if kl is not None else set()),
        schedule=None
        if inner is None
        else lambda step, scores: with_penalties(inner(step, scores), kl, kl_coef, entropy_coef),
    )


def preset_algorithm(
    preset: MethodPreset,
    *,
    horizon: int,
    advantage: str | None = None,
    loss: str | None = None,
    aggregation: str | None = None,
    advantage_options: Mapping[str, Any] | None = None,
    loss_options: Mapping[str, Any] | None = None,
) -> Algorithm:
    """The `Algorithm` of a preset, its names overridden by ``advantage``/``loss``/``aggregation``
    and its options merged with the given ones (an override drops the preset's options of that part).

    Examples:
        >>> alg = preset_algorithm(GRPO, horizon=16, aggregation="token-mean")
        >>> alg.aggregation.value, sorted(alg.needs)
        ('token-mean', ['logp_old'])
    """
    adv_fn = get_advantage(advantage or preset.advantage)
    loss_fn = get_policy_loss(loss or preset.loss)
    l_opts = {**(preset.loss_options if loss is None else {}), **(loss_options or {})}
    a_opts = {**(preset.advantage_options if advantage is None else {}), **(advantage_options or {})}
    check_options("loss_options", loss_fn, l_opts)
    check_options("advantage_options", adv_fn, a_opts)
    loss_needs = tuple(n for n in NEEDS_FROM_SIGNATURE if n in inspect.signature(loss_fn).parameters)
    return Algorithm(
        advantage=_sequence_advantage(adv_fn, a_opts),
        policy_loss=functools.partial(loss_fn, **l_opts),
        aggregation=AggregationMode.parse(aggregation or preset.aggregation),
        horizon=int(horizon),
        needs=frozenset({"logp_old", *loss_needs}),
        loss_needs=loss_needs,
    )
