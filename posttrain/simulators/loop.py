"""A generic toy training loop: sample, score, advantages, log-probs, loss, step, exact metrics.

The loop calls the same estimator functions as the LLM trainer. It never looks at a method's
name: a method is an `EstimatorBundle` of three callables:

- ``advantage(rewards [G, K], uniforms [G, K]) -> [G, K]`` (or ``[G, K, T]`` per token); the
  uniforms come from a stream of their own, for estimators that resample (PAFT), so methods
  that ignore them still see the same rollouts for the same seed;
- ``policy_loss(logp [B, T], logp_old [B, T], advantages [B] | [B, T], mask [B, T]) -> (loss [B, T], diagnostics)``;
- ``aggregation``: a mode of `posttrain.estimators.aggregate`, applied per seed.

Seeds run side by side: parameters carry a leading seed axis ``[S, ...]``; sampling and
advantages are batched over seeds by flattening (seed, prompt) into the group axis; the reduction
to one scalar per seed is `aggregate_per_seed`. Since the per-seed losses are
summed, each seed's parameters get exactly their own gradient; with an elementwise optimiser
(SGD, Adam) the seeds stay independent, and seed ``s`` gives identical numbers alone or in a batch.

Simplifications: one on-policy update per batch (``logp_old = logp.detach()``, so ratios are 1),
every prompt is used at every step, no KL term.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import (
    AggregationMode,
    clipped_ratio_loss,
    get_advantage,
    get_policy_loss,
    group_normalized_advantages,
    zero_off_mask,
)
from posttrain.simulators._base import SeedRNG, ToyEnv

__all__ = ["EstimatorBundle", "TrainLog", "aggregate_per_seed", "bundle", "grpo_surrogate", "train", "train_step"]

AdvantageFn = Callable[[Tensor, Tensor], Tensor]
PolicyLossFn = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Any]]
OptimizerFactory = Callable[[list[Tensor]], torch.optim.Optimizer]


@dataclass(frozen=True)
class EstimatorBundle:
    """A method for the toy loop: advantage function, per-token policy loss, aggregation mode."""

    advantage: AdvantageFn
    policy_loss: PolicyLossFn
    aggregation: AggregationMode | str = AggregationMode.TOKEN_MEAN


def bundle(
    advantage: str | AdvantageFn,
    policy_loss: str | PolicyLossFn = "ppo_clip",
    aggregation: AggregationMode | str = AggregationMode.TOKEN_MEAN,
    **advantage_kwargs: Any,
) -> EstimatorBundle:
    """Build a bundle from registered names (resolved here, at the edge) or callables.

    A registered advantage ``f(rewards, **kw)`` is wrapped to ignore the uniforms.

    Examples:
        >>> b = bundle("grpo")
        >>> b.advantage(torch.tensor([[1.0, 0.0]]), torch.zeros(1, 2)).shape
        torch.Size([1, 2])
    """
    if isinstance(advantage, str):
        fn = get_advantage(advantage)

        def adv(rewards: Tensor, uniforms: Tensor) -> Tensor:
            return fn(rewards, **advantage_kwargs)  # type: ignore[no-any-return]

        advantage_fn: AdvantageFn = adv
    else:
        advantage_fn = advantage
    loss_fn = get_policy_loss(policy_loss) if isinstance(policy_loss, str) else policy_loss
    return EstimatorBundle(advantage_fn, loss_fn, aggregation)


def aggregate_per_seed(
    values: Float[Tensor, "S B T"], mask: Bool[Tensor, "S B T"], mode: AggregationMode | str
) -> Float[Tensor, " S"]:
    """`aggregate` applied to each seed's ``[B, T]`` slice, batched (tested equal).

    Examples:
        >>> v = torch.tensor([[[1.0, 3.0]], [[2.0, 0.0]]])
        >>> aggregate_per_seed(v, torch.tensor([[[True, True]], [[True, False]]]), "token-mean").tolist()
        [2.0, 2.0]
    """
    m = AggregationMode.parse(mode)
    masked = zero_off_mask(values, mask)
    if m is AggregationMode.TOKEN_MEAN:
        return masked.sum((1, 2)) / mask.count_nonzero((1, 2)).clamp(min=1).to(values.dtype)
    if m is AggregationMode.TOKEN_SUM:
        return masked.sum((1, 2))
    row_sum, counts = masked.sum(-1), mask.count_nonzero(-1)
    n_rows = counts.count_nonzero(-1).clamp(min=1).to(values.dtype)
    if m is AggregationMode.SEQ_MEAN_TOKEN_MEAN:
        return (row_sum / counts.clamp(min=1).to(values.dtype)).sum(-1) / n_rows
    if m is AggregationMode.SEQ_MEAN_TOKEN_SUM:
        return row_sum.sum(-1) / n_rows
    return row_sum.sum(-1) / (n_rows * values.shape[-1])


def grpo_surrogate(
    logp: Float[Tensor, "R N"],
    rewards: Float[Tensor, "R N"] | None = None,
    *,
    group: int,
    advantages: Float[Tensor, "R N"] | None = None,
    mask: Bool[Tensor, "R N"] | None = None,
) -> Float[Tensor, "R N"]:
    r"""The on-policy GRPO loss of one toy step, per sampled action: $-\hat A_i \log\pi(a_i)$ in value.

    ``logp[r, i]`` is the log-probability (with gradient) of action ``i`` of run ``r``; the ``N``
    samples of a run are consecutive groups of ``group`` responses to one prompt. The advantages are
    `group_normalized_advantages` of each group's rewards (or the given
    ``advantages``), and the loss is `clipped_ratio_loss` at
    ``logp_old = logp.detach()`` (ratio 1: the vanilla policy gradient). Reduce it per run with
    ``.mean(-1)`` (token mean of one-action responses) and sum over runs, so each run gets exactly
    its own gradient.

    Args:
        logp: ``[R, N]`` log-probabilities of the sampled actions, ``N`` a multiple of ``group``.
        rewards: ``[R, N]`` rewards (ignored when ``advantages`` is given).
        group: responses per prompt.
        advantages: ``[R, N]`` precomputed advantages (e.g. with extra zero-advantage samples).
        mask: ``[R, N]`` boolean, default all true.

    Returns:
        ``[R, N]`` per-action losses.

    Examples:
        >>> logp = torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
        >>> grpo_surrogate(logp, torch.tensor([[1.0, 0.0]]), group=2).round(decimals=3).tolist()
        [[-0.707, 0.707]]
    """
    r, n = logp.shape
    if advantages is None:
        if rewards is None or rewards.shape != logp.shape or n % group:
            got = None if rewards is None else list(rewards.shape)
            raise DomainError(f"rewards: expected shape {[r, n]} with N a multiple of group={group}, got {got}")
        with torch.no_grad():
            advantages = group_normalized_advantages(rewards.to(logp.dtype).reshape(-1, group))
    m = torch.ones_like(logp, dtype=torch.bool) if mask is None else mask
    loss, _ = clipped_ratio_loss(
        logp.reshape(-1, 1), logp.detach().reshape(-1, 1), advantages.reshape(-1), m.reshape(-1, 1)
    )
    return loss.reshape(r, n)


@dataclass(frozen=True, eq=False)
class TrainLog:
    """Per-step exact metrics and first-hitting steps.

    Attributes:
        metrics: name -> ``[steps_run + 1, S]`` (row 0 is before the first update).
        first_hit: ``[S]`` first step at which ``stop_when`` held (``-1`` if never; only with ``stop_when``).
        steps_run: number of updates performed.
        params: final parameters ``[S, ...]`` (detached).
    """

    metrics: dict[str, Tensor]
    first_hit: Tensor
    steps_run: int
    params: Tensor


def train_step(
    env: ToyEnv,
    theta: Tensor,
    opt: torch.optim.Optimizer,
    method: EstimatorBundle,
    *,
    k: int,
    sample_rng: SeedRNG,
    est_rng: SeedRNG,
) -> Tensor:
    """One on-policy update of ``theta [S, G, ...]`` (a leaf with ``requires_grad``); returns the per-seed losses ``[S]``."""
    s = theta.shape[0]
    with torch.no_grad():  # generate + score
        roll = env.sample(theta.detach(), k, sample_rng)
    g, t = roll.rewards.shape[-2], roll.tokens.shape[-1]
    uniforms = est_rng.rand(g, k, dtype=roll.rewards.dtype)
    with torch.no_grad():  # advantages, batched over (seed, prompt) groups
        adv = method.advantage(roll.rewards.reshape(s * g, k), uniforms.reshape(s * g, k))
    adv = adv.reshape(s * g * k, *adv.shape[2:])
    logp = env.token_logp(theta, roll.tokens).reshape(s * g * k, t)  # log-probs with gradient
    mask = roll.mask.reshape(s * g * k, t)
    loss_tok, _ = method.policy_loss(logp, logp.detach(), adv, mask)
    per_seed = aggregate_per_seed(loss_tok.reshape(s, g * k, t), mask.reshape(s, g * k, t), method.aggregation)
    opt.zero_grad(set_to_none=True)
    per_seed.sum().backward()
    opt.step()
    return per_seed.detach()


def train(
    env: ToyEnv,
    params: Tensor,
    method: EstimatorBundle,
    optimizer: OptimizerFactory,
    *,
    steps: int,
    k: int,
    seeds: Sequence[int] | int,
    stop_when: Callable[[dict[str, Tensor]], Tensor] | None = None,
) -> TrainLog:
    """Run ``steps`` on-policy updates of ``params [S, G, ...]`` with ``k`` samples per prompt.

    Args:
        env: a `ToyEnv` (bandit, tabular, ...).
        params: initial parameters with a leading seed axis ``[S, G, ...]`` (copied, not mutated).
        method: the `EstimatorBundle`.
        optimizer: ``lambda ps: torch.optim.SGD(ps, lr=...)``; must act elementwise to keep seeds independent.
        steps: maximum number of updates.
        k: samples per prompt (the group size K).
        seeds: the seeds (or their count), one per row of ``params``; sampling uses stream 0,
            the estimator uniforms stream 1.
        stop_when: ``metrics -> Bool [S]``; a seed's first step where it holds is recorded and
            the loop stops when it has held for every seed (its later updates are not needed).

    Returns:
        A `TrainLog`.
    """
    sample_rng = SeedRNG.from_seeds(seeds, stream=0)
    est_rng = SeedRNG.from_seeds(seeds, stream=1)
    s = len(sample_rng)
    if params.shape[0] != s:
        raise DomainError(f"params: expected a leading seed axis of {s}, got shape {list(params.shape)}")
    if steps < 0 or k < 1:
        raise DomainError(f"steps, k: expected steps >= 0 and k >= 1, got {steps}, {k}")
    theta = params.detach().clone().requires_grad_(True)
    opt = optimizer([theta])
    history: dict[str, list[Tensor]] = {}
    first_hit = torch.full((s,), -1, dtype=torch.long)

    def log(step: int) -> bool:
        m = env.exact_metrics(theta.detach())
        for name, v in m.items():
            history.setdefault(name, []).append(v)
        if stop_when is None:
            return False
        hit = stop_when(m) & (first_hit < 0)
        first_hit[hit] = step
        return bool((first_hit >= 0).all())

    done = log(0)
    step = 0
    while not done and step < steps:
        step += 1
        train_step(env, theta, opt, method, k=k, sample_rng=sample_rng, est_rng=est_rng)
        done = log(step)
    metrics = {name: torch.stack(vals) for name, vals in history.items()}
    return TrainLog(metrics, first_hit, step, theta.detach())
