r"""Strategy selection vs strategy improvement (Krishnamurthy, Huang, Rajaraman 2026, arXiv:2606.13125).

Accuracy on a problem type is a routing-weighted average of strategy-conditional success,
$\mathrm{Acc} = \sum_s \pi_s R_s$. Between two checkpoints the change splits *exactly* into

$$
\Delta\mathrm{Acc} = \underbrace{\sum_s(\pi^1_s-\pi^0_s)\tfrac{R^0_s+R^1_s}2}_{\text{selection}}
                   + \underbrace{\sum_s\tfrac{\pi^0_s+\pi^1_s}2(R^1_s-R^0_s)}_{\text{improvement}}
$$

(the symmetric, Shapley-style split of a product's change; *our diagnostic, not from the paper*,
docs: methods/select_improve.md). `strategy_table` measures $\pi$ and $R$ from rollouts labelled by
type and strategy; `decompose_rollouts` compares two checkpoints' rollouts.

A strategy never used at one checkpoint has no measured success there: it takes the other
checkpoint's success (or 0 if unused in both), which keeps the identity exact because its
$\pi_s R_s$ term is zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.validate import check_float, check_tensor, value_checks_enabled

__all__ = ["Decomposition", "StrategyTable", "decompose", "decompose_rollouts", "forward_share", "strategy_table"]


@dataclass(frozen=True)
class Decomposition:
    """Selection and improvement terms ``[..., types]`` with ``total = selection + improvement``."""

    selection: Tensor
    improvement: Tensor
    total: Tensor


@dataclass(frozen=True)
class StrategyTable:
    """Measured routing ``[types, strategies]`` (rows sum to 1), success and counts per cell."""

    routing: Tensor
    success: Tensor
    counts: Tensor
    used: Tensor


def decompose(
    routing0: Float[Tensor, "... S"],
    success0: Float[Tensor, "... S"],
    routing1: Float[Tensor, "... S"],
    success1: Float[Tensor, "... S"],
) -> Decomposition:
    r"""Exact selection/improvement split of $\sum_s\pi^1_sR^1_s - \sum_s\pi^0_sR^0_s$.

    Args:
        routing0, routing1: ``[..., S]`` strategy distributions before/after (last axis strategies).
        success0, success1: ``[..., S]`` strategy-conditional success before/after.

    Returns:
        `Decomposition` with fields of shape ``[...]``.

    Examples:
        >>> pi0, pi1, r = torch.tensor([.5, .5]), torch.tensor([1., 0.]), torch.tensor([1., 0.])
        >>> d = decompose(pi0, r, pi1, r)
        >>> float(d.selection), float(d.improvement), float(d.total)
        (0.5, 0.0, 0.5)
    """
    check_float("routing0", routing0)
    for name, t in (("success0", success0), ("routing1", routing1), ("success1", success1)):
        check_float(name, t)
        if t.shape != routing0.shape:
            raise ShapeError(
                f"{name}: expected shape {list(routing0.shape)} (the shape of routing0), got {list(t.shape)}"
            )
    if routing0.ndim < 1:
        raise ShapeError("routing0: expected at least one (strategy) dimension")
    selection = ((routing1 - routing0) * (success0 + success1) / 2).sum(-1)
    improvement = ((routing0 + routing1) / 2 * (success1 - success0)).sum(-1)
    total = (routing1 * success1).sum(-1) - (routing0 * success0).sum(-1)
    return Decomposition(selection, improvement, total)


def strategy_table(
    types: Int[Tensor, " B"],
    strategies: Int[Tensor, " B"],
    correct: Bool[Tensor, " B"],
    *,
    n_types: int,
    n_strategies: int,
) -> StrategyTable:
    r"""Routing $\pi(s\mid\tau)$ and strategy-conditional success $R(s,\tau)$ from labelled rollouts.

    Args:
        types: ``[B]`` problem type of each rollout in ``[0, n_types)``.
        strategies: ``[B]`` strategy label in ``[0, n_strategies)`` (put "other" in its own label).
        correct: ``[B]`` boolean verifier outcome.

    Returns:
        `StrategyTable`; an unused cell has success 0 and ``used`` False. A type with no
        rollouts raises (its routing is undefined).

    Examples:
        >>> t = strategy_table(torch.tensor([0, 0, 0, 1]), torch.tensor([0, 0, 1, 1]),
        ...                    torch.tensor([True, False, True, True]), n_types=2, n_strategies=2)
        >>> t.routing.tolist(), t.success.tolist()  # doctest: +ELLIPSIS
        ([[0.66..., 0.33...], [0.0, 1.0]], [[0.5, 1.0], [0.0, 1.0]])
    """
    for name, t in (("types", types), ("strategies", strategies)):
        check_tensor(name, t, ndim=1)
        if t.is_floating_point() or t.dtype == torch.bool:
            raise ShapeError(f"{name}: expected an integer dtype, got {t.dtype}")
    check_tensor("correct", correct, ndim=1)
    if correct.dtype != torch.bool:
        raise ShapeError(f"correct: expected dtype torch.bool, got {correct.dtype}")
    if not (types.shape == strategies.shape == correct.shape) or types.numel() == 0:
        raise ShapeError("types, strategies, correct: expected equal non-empty shapes [B]")
    if value_checks_enabled():
        if bool(((types < 0) | (types >= n_types)).any()):
            raise DomainError(f"types: expected labels in [0, {n_types})")
        if bool(((strategies < 0) | (strategies >= n_strategies)).any()):
            raise DomainError(f"strategies: expected labels in [0, {n_strategies})")
    cell = types.long() * n_strategies + strategies.long()
    size = n_types * n_strategies
    counts = torch.bincount(cell, minlength=size).reshape(n_types, n_strategies).double()
    wins = torch.bincount(cell, weights=correct.double(), minlength=size).reshape(n_types, n_strategies)
    per_type = counts.sum(-1, keepdim=True)
    if bool((per_type == 0).any()):
        raise DomainError("types: every type needs at least one rollout (its routing is undefined otherwise)")
    used = counts > 0
    return StrategyTable(counts / per_type, wins / counts.clamp_min(1.0), counts, used)


def decompose_rollouts(before: StrategyTable, after: StrategyTable) -> Decomposition:
    """Per-type `decompose` of two checkpoints' `StrategyTable` (unused cells borrow the other side)."""
    if before.routing.shape != after.routing.shape:
        raise ShapeError(
            f"after: expected tables of shape {list(before.routing.shape)}, got {list(after.routing.shape)}"
        )
    r0 = torch.where(before.used, before.success, after.success)
    r1 = torch.where(after.used, after.success, before.success)
    return decompose(before.routing, r0, after.routing, r1)


def forward_share(
    type_weights: Float[Tensor, " types"], routing: Float[Tensor, "types S"], *, strategy: int = 0
) -> Tensor:
    r"""Share of responses using ``strategy`` under a type mix $w$: $f = \sum_\tau w_\tau\pi(s\mid\tau)$.

    Examples:
        >>> float(forward_share(torch.tensor([.75, .25]), torch.tensor([[1., 0.], [0., 1.]])))
        0.75
    """
    check_float("type_weights", type_weights, ndim=1)
    check_float("routing", routing, ndim=2)
    if routing.shape[0] != type_weights.shape[0]:
        raise ShapeError(f"routing: expected {type_weights.shape[0]} rows (one per type), got {list(routing.shape)}")
    return (type_weights * routing[:, strategy]).sum()
