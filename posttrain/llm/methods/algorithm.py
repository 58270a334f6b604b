"""The ``Algorithm`` bundle: the callables a method is made of, resolved by name once at the config edge.

A method preset (`MethodPreset`) names an advantage estimator, a per-token policy loss, an
aggregation mode and their options. `preset_algorithm` resolves the names in the estimator
registries and returns an `Algorithm` whose fields are plain callables; the trainer calls
them and never looks at a name. The methods by name (presets and bundles) are the registry of
`posttrain.llm.methods.catalog`. What a method reads beyond the rollout is declared as
`posttrain.llm.methods.needs.Need` members (``Algorithm.needs``, ``Algorithm.loss_needs``); the table
`posttrain.llm.methods.needs.NEEDS` says who provides each. An estimator's batch inputs are declared where
it is made usable in a preset: `ADVANTAGE_INPUTS` (positional inputs of an advantage; by default the
``[G, K]`` rewards) and `LOSS_INPUTS` (batch fields a loss takes by keyword). A method whose parts do not
fit the ``(logp, logp_old, advantages, mask)`` loss signature (GFlowRL's whole-group flow gaps) is
registered as a `MethodBundle`: a factory ``(horizon, options) -> Algorithm`` with a typed options class
(``algorithm.options``); a KL term or entropy bonus set in the config is added to its bundle like to any other.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

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
from posttrain.llm.methods.needs import Filler, Need, read
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.typed import Checked, Range

__all__ = [
    "ADVANTAGE_INPUTS",
    "GRPO",
    "LOSS_INPUTS",
    "Algorithm",
    "ClipOptions",
    "EdgeContext",
    "Inputs",
    "MethodBundle",
    "MethodPreset",
    "UpdateContext",
    "batch_advantage",
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
    """A method built by ``factory(horizon, options)`` (``options``: an instance of the typed class ``options``,
    from ``algorithm.options``); ``group_size``: the factory also takes ``group_size=`` (``rollout.group_size``)."""

    factory: Callable[..., Algorithm]
    options: type
    group_size: bool = False


GRPO = MethodPreset("grpo", "ppo_clip", "seq-mean-token-mean")
"""The GRPO preset: group-normalised advantages, PPO-clip, sequence mean of token means."""


@dataclass(frozen=True)
class ClipOptions(Checked):
    """Options of a bundle with a PPO-clip loss: ratios outside ``[1 - clip_low, 1 + clip_high]`` are clipped."""

    clip_low: Annotated[float, Range(0.0, 1.0, low_open=True, high_open=True)] = 0.2
    clip_high: Annotated[float, Range(0.0, None, low_open=True)] = 0.2


@dataclass(frozen=True)
class Inputs:
    """The batch inputs an estimator takes positionally (`Need` members, in order) and whether it returns
    per-token ``[B, T]`` values (else one value per sample, ``[G, K]``, broadcast over the response)."""

    inputs: tuple[Need, ...] = (Need.REWARDS,)
    per_token: bool = False


ADVANTAGE_INPUTS: dict[str, Inputs] = {
    "reinforce_pp": Inputs((Need.TOKEN_REWARDS, Need.MASK), per_token=True),
    "reinforce_pp_baseline": Inputs((Need.REWARDS, Need.MASK), per_token=True),
    "opd": Inputs((Need.LOGP_TEACHER, Need.LOGP_OLD, Need.MASK), per_token=True),
    "exopd": Inputs((Need.LOGP_OLD, Need.LOGP_TEACHER, Need.LOGP_REF, Need.MASK), per_token=True),
}
"""Registered advantages usable in a preset (``algorithm.advantage``) whose inputs are not just the ``[G, K]``
rewards; any other registered advantage is ``Inputs()``."""

LOSS_INPUTS: dict[str, tuple[Need, ...]] = {"opd": (Need.LOGP_TEACHER,), "trrd": (Need.LOGP_TEACHER,)}
"""Batch fields a registered policy loss takes by keyword besides ``(logp, logp_old, advantages, mask)``."""


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
    """What a bundle's ``before_update`` hook may use: the policy (no grad), the update index, a seed, and
    the sampling temperature of the run.

    ``seed`` is `update_seed` of the run seed, completed steps, update and rank: a stream of its
    own, distinct from the rollout engine's sampling seeds (fresh per step, update and rank).
    """

    model: Any
    update: int
    seed: int
    temperature: float


@dataclass(frozen=True)
class EdgeContext:
    """What a method's own run pieces (``Algorithm.edge``) are built from, by `posttrain.llm.run.build_trainer`.

    Attributes:
        seed: the run seed. tokenizer: the policy's. task: the run's task.
        encode: prompt texts -> token id lists, exactly as the trainer encodes its prompts.
        fill: the run's filler of a need (`posttrain.llm.methods.needs.NEEDS`), built on request.
        has_teacher: whether the config names a teacher (``model.teacher`` / ``model.teachers``).
        policy: the bare policy (a method's own fillers run no-grad forwards of it). temperature: the sampling
            temperature of the run.
    """

    seed: int
    tokenizer: Any
    task: Any
    encode: Callable[[list[str]], list[list[int]]]
    fill: Callable[[Need], Filler]
    has_teacher: bool
    policy: Any = None
    temperature: float = 1.0


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
        needs: the `Need` members that must be in the batch before the advantage (the trainer fills the ones
            a filler provides); for a scheduled bundle, the union over its phases.
        loss_needs: batch fields passed to ``policy_loss`` by keyword (their `Need` value is the keyword).
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
        edge: ``EdgeContext -> (stages, fillers)``: rollout stages and fillers of its own that the method brings
            to the run (Self-Routing's router and queue-only forwards), or None.
        provides: the needs ``edge`` provides (their `NEEDS` row's filler and config precondition do not apply).
    """

    advantage: Callable[[RolloutBatch], Float[Tensor, "B T"]]
    policy_loss: Callable[..., tuple[Tensor, Any]]
    aggregation: AggregationMode
    horizon: int
    kl: Callable[[Tensor, Tensor], Tensor] | None = None
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    needs: frozenset[Need] = frozenset()
    loss_needs: tuple[Need, ...] = ()
    schedule: Callable[[int, tuple[float, ...]], Algorithm] | None = None
    before_update: Callable[[RolloutBatch, Any, UpdateContext], tuple[RolloutBatch, Any, dict[str, Tensor]]] | None = (
        None
    )
    modules: tuple[torch.nn.Module, ...] = ()
    forward: Callable[[Any, RolloutBatch, float, bool], tuple[Tensor, Tensor, dict[str, Tensor]]] | None = None
    edge: Callable[[EdgeContext], tuple[tuple[Any, ...], dict[Need, Filler]]] | None = None
    provides: frozenset[Need] = frozenset()

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
            temperature=temperature, with_entropy=True, entropy_grad=self.wants_entropy, group_size=batch.group_size,
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
        extra = {**{need.value: read(batch, need) for need in self.loss_needs}, **(live or {})}
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


def batch_advantage(
    fn: Callable[..., Tensor], spec: Inputs, options: Mapping[str, Any]
) -> Callable[[RolloutBatch], Tensor]:
    """An advantage estimator as a function of the batch: ``fn(*inputs, **options)`` with its declared inputs
    read from the batch (`posttrain.llm.methods.needs.read`), broadcast over the response unless per token."""

    def advantage(batch: RolloutBatch) -> Tensor:
        values = []
        for need in spec.inputs:
            value = read(batch, need)
            if value is None:
                raise DomainError(f"{need}: the advantage's input is missing from the batch")
            values.append(value)
        out = fn(*values, **options)
        return out if spec.per_token else broadcast_sequence_advantages(out, batch.mask)

    return advantage


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
        needs=alg.needs | ({Need.LOGP_REF} if kl is not None else set()),
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
    Options are not checked here: `build_algorithm` checks them (the config edge).

    Examples:
        >>> alg = preset_algorithm(GRPO, horizon=16, aggregation="token-mean")
        >>> alg.aggregation.value, sorted(map(str, alg.needs))
        ('token-mean', ['logp_old'])
    """
    adv_name, loss_name = advantage or preset.advantage, loss or preset.loss
    l_opts = {**(preset.loss_options if loss is None else {}), **(loss_options or {})}
    a_opts = {**(preset.advantage_options if advantage is None else {}), **(advantage_options or {})}
    spec = ADVANTAGE_INPUTS.get(adv_name, Inputs())
    loss_needs = LOSS_INPUTS.get(loss_name, ())
    batch_fields = {n for n in spec.inputs if n not in (Need.REWARDS, Need.MASK, Need.TOKEN_REWARDS)}
    return Algorithm(
        advantage=batch_advantage(get_advantage(adv_name), spec, a_opts),
        policy_loss=functools.partial(get_policy_loss(loss_name), **l_opts),
        aggregation=AggregationMode.parse(aggregation or preset.aggregation),
        horizon=int(horizon),
        needs=frozenset({Need.LOGP_OLD, *loss_needs, *batch_fields}),
        loss_needs=loss_needs,
    )
