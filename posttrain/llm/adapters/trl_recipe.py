r"""What a TRL ``GRPOConfig`` means in our estimators, and the loss the adapted trainer returns (no TRL import).

`trl_recipe` reads TRL's fields (``loss_type``, ``scale_rewards``, ``epsilon``/``epsilon_high``, ``delta``,
``importance_sampling_level``) and our options (``advantage``, ``policy_loss``, ``aggregation`` of
``PosttrainGRPOConfig``; None means "TRL's") and returns a `TrlRecipe`: the advantage on grouped rewards,
the per-token policy loss and the reduction. TRL 1.16's ``GRPOTrainer`` computes, per micro-batch,

$$
\mathcal L = \frac{1}{Z}\sum_{i,t} m_{it}\big(w_{it}\,L_{it} + \beta\,k_3(\ell_{it}, \ell^{ref}_{it})\,c_{it}\big)
$$

with $L$ the clipped-ratio (or CISPO) loss, $w$ the sampler-mismatch weights of vLLM, $c$ TRL's importance
weight $\pi/\pi_{old}$ when ``use_bias_correction_kl`` (per token, or the sequence ratio with
``importance_sampling_level="sequence"``; gradient included) and $Z$ the normaliser of ``loss_type``:

| ``loss_type`` | per-row weight | $Z$ |
| --- | --- | --- |
| ``grpo`` | $1/n_i$ | $B \cdot n_{acc}$ (every row, empty ones too) |
| ``bnpo`` | 1 | $\max(\sum m, 1) \cdot n_{acc}$ |
| ``dr_grpo`` | 1 | $B \cdot H \cdot n_{acc}$, $H$ = ``max_completion_length`` |
| ``dapo``, ``cispo`` | 1 | $N$: the generation batch's tokens per process and accumulation window |
| ``luspo`` | 1 | $B \cdot n_{acc}$ |

(`TrlAggregation`, `trl_reduce`). An explicit ``aggregation`` uses our `aggregate` instead (rows
without a token are left out of sequence means; ``token-mean`` takes TRL's $N$ as ``dapo``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import (
    ADVANTAGES,
    POLICY_LOSSES,
    AggregationMode,
    aggregate,
    cispo_loss,
    clipped_ratio_loss,
    group_normalized_advantages,
    gspo_loss,
    k3_kl,
    log_ratio,
    masked_sum,
    sequence_log_ratio,
)
from posttrain.llm.adapters.convert import global_aggregate

__all__ = [
    "LOSS_TYPES",
    "SCALE_REWARDS",
    "TRL_STD_EPS",
    "TrlAggregation",
    "TrlRecipe",
    "batch_scaled_advantages",
    "kl_term",
    "resolve_advantage",
    "resolve_policy_loss",
    "trl_advantages",
    "trl_policy_loss",
    "trl_recipe",
    "trl_reduce",
]

TRL_STD_EPS = 1e-4
"""TRL's constant added to the reward std (``scale_rewards`` "group" and "batch")."""


class TrlAggregation(NamedTuple):
    """How a ``[B, T]`` loss becomes the micro-batch's scalar.

    ``mode``: the per-row weights and the kind of normaliser (our `AggregationMode`); ``all_rows``: sequence
    means divide by every row of the micro-batch, empty ones included (TRL) instead of the rows with a token
    (ours); ``batch_tokens``: ``token-mean`` divides by TRL's generation-batch token count $N$.
    """

    mode: AggregationMode
    all_rows: bool = False
    batch_tokens: bool = False


LOSS_TYPES: dict[str, TrlAggregation] = {
    "grpo": TrlAggregation(AggregationMode.SEQ_MEAN_TOKEN_MEAN, all_rows=True),
    "bnpo": TrlAggregation(AggregationMode.TOKEN_MEAN),
    "dr_grpo": TrlAggregation(AggregationMode.SEQ_MEAN_TOKEN_SUM_NORM, all_rows=True),
    "dapo": TrlAggregation(AggregationMode.TOKEN_MEAN, batch_tokens=True),
    "luspo": TrlAggregation(AggregationMode.SEQ_MEAN_TOKEN_SUM, all_rows=True),
    "cispo": TrlAggregation(AggregationMode.TOKEN_MEAN, batch_tokens=True),
}
"""TRL 1.16's ``loss_type`` values the adapter reproduces, with their reduction (``sapo`` and ``vespo`` are refused)."""

SCALE_REWARDS = ("group", "none", "batch")
"""TRL 1.16's ``scale_rewards`` values (all reproduced)."""


def batch_scaled_advantages(rewards: Tensor, *, eps: float = TRL_STD_EPS) -> Tensor:
    r"""Group-centred rewards divided by the std of the whole batch: TRL's ``scale_rewards="batch"``.

    $$
    A_{gk} = \frac{R_{gk} - \mu_g}{\sigma + \epsilon}
    $$

    with $\mu_g$ the group mean and $\sigma$ the Bessel std of every reward of ``rewards [G, K]`` (a single
    reward has $\sigma$ taken as 0). Returns ``[G, K]``.

    Examples:
        >>> [round(a, 4) for a in batch_scaled_advantages(torch.tensor([[1.0, 0.0], [2.0, 2.0]]), eps=0.0)[0].tolist()]
        [0.5222, -0.5222]
    """
    centred = group_normalized_advantages(rewards, scale_by_std=False)
    std = rewards.std() if rewards.numel() > 1 else torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    return centred / (std + eps)


def _required_positional(fn: Callable[..., Any]) -> int:
    params = inspect.signature(fn).parameters.values()
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in kinds and p.default is inspect.Parameter.empty)


def _resolve(
    kind: str, registry: Any, spec: str | Callable[..., Any], options: dict[str, Any], n_inputs: int, shape: str
) -> Callable[..., Any]:
    fn = registry.get(spec) if isinstance(spec, str) else spec
    if _required_positional(fn) != n_inputs:
        valid = [e.name for e in registry if _required_positional(e.obj) == n_inputs]
        raise DomainError(f"{kind}: {spec!r} does not take {shape}; usable here: {', '.join(valid)}")
    return functools.partial(fn, **options) if options else fn


def resolve_advantage(
    spec: str | Callable[..., Any], options: dict[str, Any] | None = None
) -> Callable[[Tensor], Tensor]:
    """Our advantage named ``spec`` (or a callable) with ``options`` bound; it must take only ``rewards [G, K]``.

    Examples:
        >>> resolve_advantage("drgrpo")(torch.tensor([[1.0, 0.0]])).tolist()
        [[0.5, -0.5]]
    """
    return _resolve("advantage", ADVANTAGES, spec, options or {}, 1, "only grouped rewards [G, K]")


def resolve_policy_loss(spec: str | Callable[..., Any], options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """Our policy loss named ``spec`` (or a callable) with ``options`` bound; signature ``(logp, logp_old, advantages, mask)``."""
    return _resolve("policy_loss", POLICY_LOSSES, spec, options or {}, 4, "(logp, logp_old, advantages, mask)")


class TrlRecipe(NamedTuple):
    """The adapted trainer's maths: ``advantage [G, K] -> [G, K]``, the per-token ``loss``, the ``aggregation``,
    and whether TRL's importance weight of the KL correction is the sequence ratio (``sequence_ratio``)."""

    advantage: Callable[[Tensor], Tensor]
    loss: Callable[..., Any]
    aggregation: TrlAggregation
    sequence_ratio: bool


def _trl_advantage(scale_rewards: str) -> Callable[[Tensor], Tensor]:
    if scale_rewards == "group":
        return functools.partial(group_normalized_advantages, eps=TRL_STD_EPS)
    if scale_rewards == "none":
        return functools.partial(group_normalized_advantages, scale_by_std=False)
    return batch_scaled_advantages


def _trl_loss(args: Any) -> Callable[..., Any]:
    """Our loss for TRL's ``loss_type``, ``epsilon``/``epsilon_high``, ``delta`` and ``importance_sampling_level``."""
    eps_high = args.epsilon if args.epsilon_high is None else args.epsilon_high
    if args.loss_type == "cispo":  # TRL: -sg(min(r, epsilon_high)) A logp; delta is not read
        return functools.partial(cispo_loss, clip_mode="minimax", clip_high=float(eps_high))
    low, high = float(args.epsilon), float(eps_high)
    if args.importance_sampling_level == "sequence":
        return functools.partial(gspo_loss, clip_low=low, clip_high=high)
    # TRL's two-sided clip min(r, delta) in the unclipped term equals the dual clip c = delta for delta > 1 + eps_high
    dual = None if args.delta is None else float(args.delta)
    return functools.partial(clipped_ratio_loss, clip_low=low, clip_high=high, dual_clip=dual)


def trl_recipe(args: Any) -> TrlRecipe:
    """The recipe of ``args`` (a ``GRPOConfig``; with ``PosttrainGRPOConfig``'s options where set).

    Assumes `refused_settings` returned nothing for ``args`` (unknown values raise here).

    Raises:
        DomainError: an unknown ``loss_type`` / ``scale_rewards`` or a bad option of ours.
    """
    if args.loss_type not in LOSS_TYPES:
        raise DomainError(f"loss_type: {args.loss_type!r} is not reproduced; reproduced: {', '.join(LOSS_TYPES)}")
    if args.scale_rewards not in SCALE_REWARDS:
        raise DomainError(f"scale_rewards: expected one of {', '.join(SCALE_REWARDS)}, got {args.scale_rewards!r}")
    advantage_spec = getattr(args, "advantage", None)
    loss_spec = getattr(args, "policy_loss", None)
    mode = getattr(args, "aggregation", None)
    advantage = (
        _trl_advantage(args.scale_rewards)
        if advantage_spec is None
        else resolve_advantage(advantage_spec, getattr(args, "advantage_options", None))
    )
    loss = _trl_loss(args) if loss_spec is None else resolve_policy_loss(loss_spec, getattr(args, "loss_options", None))
    if mode is None:
        aggregation = LOSS_TYPES[args.loss_type]
    else:
        parsed = AggregationMode.parse(mode)
        aggregation = TrlAggregation(parsed, batch_tokens=parsed is AggregationMode.TOKEN_MEAN)
    sequence = loss_spec is None and args.importance_sampling_level == "sequence"
    return TrlRecipe(advantage, loss, aggregation, sequence)


def trl_advantages(
    rewards_per_func: Tensor, weights: Tensor, num_generations: int, advantage: Callable[[Tensor], Tensor]
) -> Tensor:
    r"""Our advantage on TRL's rewards: $R_i = \sum_f w_f r_{if}$ (None entries skipped), grouped ``[G, K]``.

    Args:
        rewards_per_func: ``[B, F]`` rewards of the generation batch (NaN where a function returned None),
            rows ordered prompt by prompt with ``num_generations`` consecutive rows each (TRL's order).
        weights: ``[F]`` ``reward_weights``. num_generations: K. advantage: ``[G, K] -> [G, K]``.

    Returns:
        ``[B]`` advantages in TRL's row order.

    Raises:
        DomainError: a completion that no reward function scored (our estimators need every reward).

    Examples:
        >>> from posttrain.estimators import rloo_advantages
        >>> trl_advantages(torch.tensor([[1.0, 0.0], [0.0, float("nan")]]), torch.ones(2), 2, rloo_advantages).tolist()
        [1.0, -1.0]
    """
    unscored = torch.isnan(rewards_per_func).all(dim=1)
    if bool(unscored.any()):
        raise DomainError(
            f"reward_funcs: every reward function returned None for {int(unscored.sum())} completion(s); "
            "posttrain advantages need a reward for each completion"
        )
    rewards = (rewards_per_func * weights.to(rewards_per_func)).nansum(dim=1)
    if rewards.shape[0] % num_generations:
        raise DomainError(f"num_generations: {rewards.shape[0]} rewards do not split into groups of {num_generations}")
    return advantage(rewards.view(-1, num_generations)).reshape(-1)


def kl_term(
    logp: Tensor, logp_old: Tensor, logp_ref: Tensor, mask: Tensor, *, bias_correction: bool, sequence: bool
) -> Tensor:
    r"""TRL's per-token KL term $k_3(\ell, \ell_{ref})\,c$: unclamped k3, times $c = \pi/\pi_{old}$ when
    ``bias_correction`` (``use_bias_correction_kl``; $c = \exp(\ell - \ell_{old})$ per token, or the sequence
    ratio $\exp(\frac{1}{n_i}\sum_t m(\ell - \ell_{old}))$ with ``sequence``; not detached, as in TRL).

    Args:
        logp, logp_old, logp_ref: ``[B, T]``. mask: ``[B, T]`` boolean (the sequence ratio's tokens).

    Returns:
        ``[B, T]``.

    Examples:
        >>> lp = torch.tensor([[-1.0]], requires_grad=True)
        >>> kl = kl_term(lp, lp.detach(), torch.tensor([[-2.0]]), torch.ones(1, 1, dtype=torch.bool),
        ...              bias_correction=True, sequence=False)
        >>> (g,) = torch.autograd.grad(kl.sum(), lp); round(float(kl.detach()), 6), round(float(g), 6)  # k3 + k3' at r = 1
        (0.367879, 1.0)
    """
    kl = k3_kl(logp, logp_ref, log_ratio_clamp=None)
    if not bias_correction:
        return kl
    if sequence:
        return kl * torch.exp(sequence_log_ratio(logp, logp_old, mask)).unsqueeze(-1)
    return kl * torch.exp(log_ratio(logp, logp_old, clamp=None))


def trl_reduce(
    values: Tensor,
    mask: Tensor,
    aggregation: TrlAggregation,
    *,
    horizon: int | None = None,
    grad_accum_steps: int = 1,
    token_normalizer: Tensor | float | None = None,
) -> Tensor:
    r"""The micro-batch's scalar from a ``[B, T]`` loss (module docstring's table).

    ``token-mean`` with ``aggregation.batch_tokens`` and ``token_normalizer`` $N$ given:
    $\sum m X / N$ ($N$ already spans the accumulation window). Otherwise our weights and normaliser
    (`global_aggregate` with $B$ rows when ``all_rows``, else `aggregate`) divided by ``grad_accum_steps``.
    A mask with no token gives 0 (with a zero gradient).

    Examples:
        >>> v, m = torch.tensor([[-1.0], [5.0]]), torch.tensor([[True], [False]])
        >>> float(trl_reduce(v, m, LOSS_TYPES["grpo"])), float(trl_reduce(v, m, TrlAggregation(AggregationMode.SEQ_MEAN_TOKEN_MEAN)))
        (-0.5, -1.0)
    """
    mode = aggregation.mode
    if aggregation.batch_tokens and token_normalizer is not None and mode is AggregationMode.TOKEN_MEAN:
        return masked_sum(values, mask) / token_normalizer
    if aggregation.all_rows:
        rows = values.shape[0]
        return (
            global_aggregate(values, mask, mode, global_batch_size=rows, loss_scale_factor=horizon) / grad_accum_steps
        )
    if not bool(mask.any()):
        return masked_sum(values, mask)
    return aggregate(values, mask, mode, horizon=horizon) / grad_accum_steps


def trl_policy_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss: Callable[..., Any],
    aggregation: TrlAggregation,
    horizon: int | None = None,
    beta: float = 0.0,
    kl: Tensor | None = None,
    is_ratio: Tensor | None = None,
    grad_accum_steps: int = 1,
    token_normalizer: Tensor | float | None = None,
) -> tuple[Tensor, Any]:
    r"""The scalar loss the adapted trainer returns for one micro-batch, and the loss's diagnostics.

    $$
    \mathcal L = \mathrm{reduce}\big(w \odot L(\ell, \ell_{old}, A) + \beta\,\mathrm{KL}\big)
    $$

    with $L$ our per-token ``loss``, $w$ TRL's sampler-mismatch weights (``is_ratio``, when vLLM
    importance-sampling correction is on; no gradient), KL the per-token `kl_term` and reduce `trl_reduce`.
    A micro-batch with no valid token gives 0 (TRL's value) without calling ``loss``.

    Args:
        logp, logp_old: ``[B, T]``. advantages: ``[B]`` or ``[B, T]``. mask: ``[B, T]`` boolean.
        loss: per-token loss (see `resolve_policy_loss`). aggregation, horizon, grad_accum_steps,
            token_normalizer: see `trl_reduce`. beta, kl: the KL coefficient and ``[B, T]`` term.
        is_ratio: ``[B, T]`` or ``[B, 1]`` weights.

    Raises:
        DomainError: ``beta != 0`` without ``kl``.

    Examples:
        >>> from posttrain.estimators import no_correction_loss
        >>> lp, m = torch.zeros(1, 3), torch.tensor([[True, True, False]])
        >>> mean = TrlAggregation(AggregationMode.TOKEN_MEAN, batch_tokens=True)
        >>> float(trl_policy_loss(lp, lp, torch.ones(1), m, loss=no_correction_loss, aggregation=mean)[0])
        -1.0
        >>> float(trl_policy_loss(lp, lp, torch.ones(1), m, loss=no_correction_loss, aggregation=mean, token_normalizer=4.0)[0])
        -0.5
    """
    if beta != 0.0 and kl is None:
        raise DomainError(
            "kl: required when beta != 0 (the reference log-probs TRL computes when its beta is non-zero)"
        )
    if not bool(mask.any()):  # every token masked (e.g. truncated completions): TRL's loss is 0
        return masked_sum(logp, mask), None
    out = loss(logp, logp_old, advantages, mask)
    per_token, diag = out if isinstance(out, tuple) else (out, None)
    if is_ratio is not None:
        per_token = per_token * is_ratio.detach()
    if beta != 0.0 and kl is not None:
        per_token = per_token + beta * kl
    value = trl_reduce(
        per_token,
        mask,
        aggregation,
        horizon=horizon,
        grad_accum_steps=grad_accum_steps,
        token_normalizer=token_normalizer,
    )
    return value, diag
