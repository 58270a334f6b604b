"""The ``Algorithm`` bundle: the callables a method is made of, resolved by name once at the config edge.

A method preset (registered under ``registry("method")``) names an advantage estimator, a
per-token policy loss, an aggregation mode and their options. :func:`build_algorithm` resolves
the names in the estimator registries and returns an :class:`Algorithm` whose fields are plain
callables; the trainer calls them and never looks at a name. What a method needs beyond the
rollout (``logp_ref`` for a KL term, ``logp_teacher`` for a loss whose signature asks for it) is
declared in ``Algorithm.needs`` and filled by the trainer. A method whose parts do not fit the
``(logp, logp_old, advantages, mask)`` loss signature (GFlowRL's whole-group flow gaps) is registered
as a :class:`MethodBundle`: a factory ``(horizon, **options) -> Algorithm`` named by import path,
imported only when chosen; ``algorithm.options`` are its keyword options, and a KL term or entropy
bonus set in the config is added to its bundle like to any other.

Per token, the minimised quantity is

.. math:: L_{it} = \\ell^{pg}_{it} + \\beta\\,\\mathrm{KL}_{it} - c_H H_{it}

aggregated once with the chosen mode (aggregation is linear, so this equals verl's separate
aggregation of each term with the same mode).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import (
    AggregationMode,
    broadcast_sequence_advantages,
    get_advantage,
    get_kl,
    get_policy_loss,
    masked_mean,
)
from posttrain.llm.batch import RolloutBatch
from posttrain.registry import registry

__all__ = [
    "METHODS",
    "Algorithm",
    "MethodBundle",
    "MethodPreset",
    "UpdateContext",
    "build_algorithm",
    "normaliser",
    "update_seed",
]

METHODS = registry("method")


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
    """A method built by a factory ``module:function`` with signature ``(horizon, **options) -> Algorithm``."""

    factory: str

    def resolve(self) -> Callable[..., Algorithm]:
        """Import the factory (lazily: the bundle's module imports this one)."""
        module, _, name = self.factory.partition(":")
        return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


METHODS.add(
    "grpo",
    MethodPreset("grpo", "ppo_clip", "seq-mean-token-mean"),
    paper="Shao et al. 2024, DeepSeekMath, arXiv:2402.03300",
    summary="GRPO: group-normalised advantages, PPO-clip, sequence mean of token means.",
)
METHODS.add(
    "drgrpo",
    MethodPreset("drgrpo", "ppo_clip", "seq-mean-token-sum-norm"),
    paper="Liu et al. 2025, Understanding R1-Zero-like training, arXiv:2503.20783",
    summary="Dr.GRPO: mean-centred advantages, PPO-clip, constant normaliser B * max_new_tokens.",
)
METHODS.add(
    "rloo",
    MethodPreset("rloo", "ppo_clip", "seq-mean-token-sum"),
    paper="Ahmadian et al. 2024, Back to Basics, arXiv:2402.14740",
    summary="RLOO: leave-one-out baseline, sequence log-prob (token sum) per sample.",
)
METHODS.add(
    "gspo",
    MethodPreset("grpo", "gspo", "seq-mean-token-mean"),
    paper="Zheng et al. 2025, GSPO, arXiv:2507.18071",
    summary="GSPO: group-normalised advantages, sequence-level clipped ratio.",
)
METHODS.add(
    "ppo_clip",
    MethodPreset("grpo", "ppo_clip", "token-mean", loss_options={"dual_clip": 3.0}),
    paper="Schulman et al. 2017 arXiv:1707.06347; Ye et al. 2020 arXiv:1912.09729",
    summary="PPO-clip with dual clip c=3 on group-normalised advantages (no critic), token mean.",
)
METHODS.add(
    "cispo",
    MethodPreset("grpo", "cispo", "token-mean"),
    paper="MiniMax 2025, MiniMax-M1 (CISPO), arXiv:2506.13585",
    summary="CISPO: group-normalised advantages, REINFORCE weighted by the clipped stop-gradient ratio, token mean.",
)

METHODS.add(
    "gflowrl",
    MethodBundle("posttrain.llm.gflowrl_algorithm:gflowrl_algorithm"),
    paper="Liu et al. 2026, GFlowRL, arXiv:2607.13394",
    summary="GFlowRL: whole-group clipped flow gaps vs a reference, IS-corrected trajectory balance.",
)
METHODS.add(
    "flowrl",
    MethodBundle("posttrain.llm.gflowrl_algorithm:flowrl_algorithm"),
    paper="Zhu et al. 2025, FlowRL, arXiv:2509.15207 (spec 14 baseline)",
    summary="FlowRL: trajectory balance with a learned log Z(x), an MLP over the prompt's mean hidden state.",
)

METHODS.add(
    "sis",
    MethodBundle("posttrain.llm.sis_trainer:sis_algorithm"),
    paper="Li et al. 2026, Selective Importance Sampling, arXiv:2607.04728",
    summary="SIS: a token rejection test vs the behaviour top-K before every update, on any ratio-based preset.",
)
METHODS.add(
    "opd_then_rl",
    MethodBundle("posttrain.llm.distill_bundles:opd_then_rl_algorithm"),
    paper="Li et al. 2026, Sequential Beats Joint, arXiv:2609.04108",
    summary="OPD-then-RL: OPD advantages (teacher log-probs) up to switch_step or a validation plateau, then GRPO.",
)

METHODS.add(
    "exopd",
    MethodBundle("posttrain.llm.distill_bundles:exopd_algorithm"),
    paper="ExOPD / G-OPD reward extrapolation, arXiv:2602.12125 (spec 13 baseline)",
    summary="ExOPD: PPO-clip on lam*(teacher - reference) - (student - reference); reference = model.reference.",
)
METHODS.add(
    "opd2",
    MethodBundle("posttrain.llm.distill_bundles:opd2_algorithm"),
    paper="Heo et al. 2026, On-Policy Delta Distillation, arXiv:2607.15161",
    summary="OPD²: PPO-clip on the centred, sign-gated teacher-minus-teacher-base delta on the student's top-K.",
)

NEEDS_FROM_SIGNATURE = ("logp_ref", "logp_teacher")
"""Batch fields a policy loss may ask for by naming them as keyword parameters."""


def normaliser(mask: Bool[Tensor, "B T"], mode: AggregationMode, horizon: int) -> Tensor:  # float64, 0-d
    r"""The denominator :math:`Z` of ``aggregate(values, mask, mode, horizon=horizon)`` as a 0-d tensor.

    ``aggregate`` is :math:`\sum_i w_i \sum_t m_{it} L_{it} / Z` with per-row weights :math:`w_i`
    (1, or :math:`1/n_i` for seq-mean-token-mean) that depend on the row alone, so for rows split
    into micro-batches :math:`b`: :math:`\mathrm{agg}(\text{all}) = \sum_b \mathrm{agg}(b)\,Z_b / Z`.

    Example:
        >>> m = torch.tensor([[True, True, False], [True, True, True]])
        >>> [float(normaliser(m, AggregationMode(x), 4)) for x in ("token-mean", "seq-mean-token-sum-norm", "token-sum")]
        [5.0, 8.0, 1.0]
    """
    if mode is AggregationMode.TOKEN_MEAN:
        return mask.sum().clamp(min=1).double()
    if mode is AggregationMode.TOKEN_SUM:
        return torch.ones((), dtype=torch.float64, device=mask.device)
    rows = mask.any(dim=-1).sum().clamp(min=1).double()
    return rows * horizon if mode is AggregationMode.SEQ_MEAN_TOKEN_SUM_NORM else rows


def update_seed(run_seed: int, step: int, update: int, rank: int) -> int:
    """The seed of a ``before_update`` hook's random draws (e.g. SIS's uniforms): a 63-bit hash of
    ``(run_seed, step, update, rank)`` tagged as a hook stream, so it never shares a stream with the
    engine's sampling seed of any step or rank.

    Example:
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

    ``seed`` is :func:`update_seed` of the run seed, completed steps, update and rank: a stream of its
    own, distinct from the rollout engine's sampling seeds (fresh per step, update and rank).
    """

    model: Any
    update: int
    seed: int
    temperature: float


@dataclass(frozen=True)
class Algorithm:
    """The callables of one method; built by :func:`build_algorithm`, used by the trainer.

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

    def at(self, step: int, scores: tuple[float, ...] = ()) -> Algorithm:
        """The bundle used at ``step`` (counted from 1) given the validation ``scores`` so far:
        ``schedule(step, scores)``, or this bundle when unscheduled."""
        return self if self.schedule is None else self.schedule(step, tuple(scores))

    @property
    def wants_entropy(self) -> bool:
        """Whether the loss uses the token entropy (otherwise it is computed for logging only)."""
        return self.entropy_coef != 0.0

    def token_loss(
        self, logp: Float[Tensor, "B T"], entropy: Float[Tensor, "B T"] | None, batch: RolloutBatch
    ) -> tuple[Float[Tensor, "B T"], dict[str, Tensor]]:
        """The per-token loss :math:`\\ell^{pg} + \\beta\\,KL - c_H H` and 0-d diagnostics (token means)."""
        if batch.logp_old is None or batch.advantages is None:
            raise DomainError("batch: logp_old and advantages must be filled before the loss")
        extra = {name: getattr(batch, name) for name in self.loss_needs}
        loss, diag = self.policy_loss(logp, batch.logp_old, batch.advantages, batch.mask, **extra)
        metrics = {f"pg/{k}": v for k, v in diag._asdict().items()} if hasattr(diag, "_asdict") else {}
        if self.kl is not None:
            assert batch.logp_ref is not None  # guaranteed by `needs`
            kl = self.kl(logp, batch.logp_ref)
            loss = loss + self.kl_coef * kl
            metrics["kl"] = masked_mean(kl.detach(), batch.mask)
        if entropy is not None and self.entropy_coef:
            loss = loss - self.entropy_coef * entropy
        return torch.where(batch.mask, loss, torch.zeros((), dtype=loss.dtype, device=loss.device)), metrics


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


def _check_options(where: str, fn: Callable[..., Any], opts: Mapping[str, Any]) -> None:
    """Every option must be a keyword-only parameter of ``fn`` (DomainError listing the valid ones)."""
    params = inspect.signature(fn).parameters
    bad = sorted(k for k in opts if k not in params or params[k].kind is not inspect.Parameter.KEYWORD_ONLY)
    if bad:
        valid = [k for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
        raise DomainError(
            f"algorithm.{where}: unknown option(s) {', '.join(bad)}; valid: {', '.join(valid) or '(none)'}"
        )


def _from_bundle(
    method: str, entry: MethodBundle, horizon: int, options: Mapping[str, Any], overrides: Mapping[str, Any]
) -> Algorithm:
    """Call a :class:`MethodBundle`'s factory; advantage/loss/aggregation overrides do not apply to it."""
    given = sorted(k for k, v in overrides.items() if v)
    if given:
        raise DomainError(
            f"algorithm.{', algorithm.'.join(given)}: not used by method {method!r} (use algorithm.options)"
        )
    factory = entry.resolve()
    _check_options("options", factory, options)
    return factory(int(horizon), **options)


def _with_penalties(
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
        else lambda step, scores: _with_penalties(inner(step, scores), kl, kl_coef, entropy_coef),
    )


def build_algorithm(
    *,
    method: str,
    horizon: int,
    advantage: str | None = None,
    loss: str | None = None,
    aggregation: str | None = None,
    advantage_options: Mapping[str, Any] | None = None,
    loss_options: Mapping[str, Any] | None = None,
    kl: str | None = None,
    kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    options: Mapping[str, Any] | None = None,
) -> Algorithm:
    """Resolve a method preset plus overrides into an :class:`Algorithm` (the only place names are used).

    ``options`` are the keyword options of a :class:`MethodBundle` method (an error for a preset).

    Example:
        >>> alg = build_algorithm(method="drgrpo", horizon=16, kl="k3", kl_coef=0.01)
        >>> alg.aggregation.value, sorted(alg.needs)
        ('seq-mean-token-sum-norm', ['logp_old', 'logp_ref'])
    """
    entry = METHODS.get(method)
    kl_fn = get_kl(kl) if kl is not None and kl_coef > 0 else None
    if isinstance(entry, MethodBundle):
        overrides: dict[str, Any] = {"advantage": advantage, "loss": loss, "aggregation": aggregation}
        overrides |= {"advantage_options": advantage_options, "loss_options": loss_options}
        alg = _from_bundle(method, entry, horizon, options or {}, overrides)
        return _with_penalties(alg, kl_fn, float(kl_coef), float(entropy_coef))
    if options:
        raise DomainError(f"algorithm.options: method {method!r} is a preset; use loss_options / advantage_options")
    preset: MethodPreset = entry  # type: ignore[assignment]
    adv_fn = get_advantage(advantage or preset.advantage)
    loss_fn = get_policy_loss(loss or preset.loss)
    l_opts = {**(preset.loss_options if loss is None else {}), **(loss_options or {})}
    a_opts = {**(preset.advantage_options if advantage is None else {}), **(advantage_options or {})}
    _check_options("loss_options", loss_fn, l_opts)
    _check_options("advantage_options", adv_fn, a_opts)
    loss_needs = tuple(n for n in NEEDS_FROM_SIGNATURE if n in inspect.signature(loss_fn).parameters)
    alg = Algorithm(
        advantage=_sequence_advantage(adv_fn, a_opts),
        policy_loss=functools.partial(loss_fn, **l_opts),
        aggregation=AggregationMode.parse(aggregation or preset.aggregation),
        horizon=int(horizon),
        needs=frozenset({"logp_old", *loss_needs}),
        loss_needs=loss_needs,
    )
    return _with_penalties(alg, kl_fn, float(kl_coef), float(entropy_coef))
