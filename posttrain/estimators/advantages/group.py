"""Outcome-reward advantage estimators for groups of rollouts.

Rewards come as ``[G, K]`` (G prompts, K samples each); per-token advantages are ``[B, T]`` with
``B = G * K`` in row-major order (the K samples of prompt 0 first). Conventions follow verl's
``core_algos`` (cross-checked against verl 0.9.1's recorded outputs in ``tests/estimators/data/``), see ``docs/anchors.md``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.errors import ShapeError
from posttrain.estimators._numerics import computes_in_float32, row_blocks
from posttrain.estimators._registry import register_advantage
from posttrain.shapes import Bool, Float, Int
from posttrain.validate import (
    check_finite,
    check_float,
    check_mask,
    check_positive,
    check_tensor,
)

__all__ = [
    "broadcast_sequence_advantages",
    "drgrpo_advantages",
    "group_normalized_advantages",
    "group_rewards",
    "rloo_advantages",
]


def _check_grouped(name: str, rewards: Tensor, *, min_k: int = 1) -> Tensor:
    check_float(name, rewards, ndim=2)
    if rewards.shape[0] < 1 or rewards.shape[1] < min_k:
        raise ShapeError(f"{name}: expected shape [G, K] with G >= 1 and K >= {min_k}, got {list(rewards.shape)}")
    return check_finite(name, rewards)


def group_rewards(
    rewards: Float[Tensor, " B"], group_ids: Int[Tensor, " B"]
) -> tuple[Float[Tensor, "G K"], Int[Tensor, " B"]]:
    """Arrange flat rewards into ``[G, K]`` by group id, validating equal group sizes once.

    Groups are ordered by first appearance of their id; within a group the original order is kept.

    Args:
        rewards: ``[B]`` float rewards.
        group_ids: ``[B]`` integer group ids (any values; equal ids form a group).

    Returns:
        ``(grouped [G, K], order [B])`` where ``grouped.reshape(-1) == rewards[order]``; scatter a
        per-sample result back with ``out = torch.empty_like(flat); out[order] = result.reshape(-1)``.

    Raises:
        ShapeError: wrong ranks or lengths, non-integer ids, or groups of unequal size.

    Examples:
        >>> g, order = group_rewards(torch.tensor([1., 2., 3., 4.]), torch.tensor([7, 3, 7, 3]))
        >>> g.tolist(), order.tolist()
        ([[1.0, 3.0], [2.0, 4.0]], [0, 2, 1, 3])
    """
    check_float("rewards", rewards, ndim=1)
    check_tensor("group_ids", group_ids, ndim=1)
    if group_ids.is_floating_point() or group_ids.dtype == torch.bool:
        raise ShapeError(f"group_ids: expected an integer dtype, got {group_ids.dtype}")
    if group_ids.shape != rewards.shape:
        raise ShapeError(
            f"group_ids: expected shape {list(rewards.shape)} (the shape of rewards), got {list(group_ids.shape)}"
        )
    if rewards.numel() == 0:
        raise ShapeError("rewards: expected at least one reward, got shape [0]")
    uniq, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    if bool((counts != counts[0]).any()):
        raise ShapeError(f"group_ids: groups must have equal sizes, got sizes {sorted(set(counts.tolist()))}")
    b = rewards.shape[0]
    first = torch.full((uniq.shape[0],), b, dtype=torch.long, device=rewards.device)
    first = first.scatter_reduce(0, inverse, torch.arange(b, device=rewards.device), reduce="amin")
    rank_of_group = torch.empty_like(first)
    rank_of_group[torch.argsort(first)] = torch.arange(first.shape[0], device=rewards.device)
    key = rank_of_group[inverse] * b + torch.arange(b, device=rewards.device)
    order = torch.argsort(key)
    return rewards[order].reshape(uniq.shape[0], int(counts[0])), order


@register_advantage("grpo", paper="Shao et al. 2024, DeepSeekMath, arXiv:2402.03300")
@computes_in_float32
def group_normalized_advantages(
    rewards: Float[Tensor, "G K"], *, scale_by_std: bool = True, eps: float = 1e-6
) -> Float[Tensor, "G K"]:
    r"""Group-normalised advantages of GRPO (Dr.GRPO with ``scale_by_std=False``).

    $$
    A_{gk} = \frac{R_{gk} - \mu_g}{\sigma_g + \epsilon}\quad\text{or}\quad A_{gk} = R_{gk} - \mu_g
    $$

    with $\mu_g$ the group mean and $\sigma_g$ the Bessel-corrected group std. A
    constant group gives exact zeros (detected, not left to rounding), with finite gradients. Convention: verl (``eps=1e-6`` added to the std); TRL uses
    ``eps=1e-4``, OpenRLHF ``1e-9``. With ``K == 1`` the std is undefined: verl sets
    $\mu = 0, \sigma = 1$; here a singleton group gives advantage 0 under either setting
    (no baseline information), which differs from verl.

    Args:
        rewards: ``[G, K]`` rewards, K samples for each of G prompts.
        scale_by_std: divide by $\sigma_g + \epsilon$ (GRPO) or not (Dr.GRPO).
        eps: positive constant added to the std.

    Returns:
        ``[G, K]`` advantages; each row sums to zero.

    Raises:
        ShapeError: ``rewards`` not a 2-d float tensor.
        DomainError: non-finite rewards, ``eps <= 0``.

    References:
        Shao et al. 2024 (GRPO, arXiv:2402.03300); Liu et al. 2025 (Dr.GRPO, arXiv:2503.20783).

    Examples:
        >>> group_normalized_advantages(torch.tensor([[1., 0., 0., 0.]])).tolist()  # doctest: +ELLIPSIS
        [[1.49999..., -0.49999..., -0.49999..., -0.49999...]]
        >>> group_normalized_advantages(torch.tensor([[1., 0., 0., 0.]]), scale_by_std=False).tolist()
        [[0.75, -0.25, -0.25, -0.25]]
    """
    _check_grouped("rewards", rewards)
    eps = check_positive("eps", eps)
    centred, constant = _centre(rewards)
    k = rewards.shape[-1]
    if not scale_by_std or k == 1:
        return centred
    var = (centred * centred).sum(dim=-1, keepdim=True) / (k - 1)
    # sqrt has an infinite derivative at 0: take it on 1 for constant groups (whose centred
    # rewards are exactly 0), so the gradient stays finite there.
    std = torch.where(constant, torch.zeros_like(var), torch.sqrt(torch.where(constant, torch.ones_like(var), var)))
    return centred / (std + eps)


def _centre(rewards: Tensor) -> tuple[Tensor, Tensor]:
    """``(R - group mean, constant [G, 1])``; a constant group is centred to exact zeros.

    (The float mean of equal numbers can differ from them in the last bit; dividing that residue
    by a tiny std would give a non-zero advantage to a group that carries no signal.)
    """
    constant = (rewards == rewards[..., :1]).all(dim=-1, keepdim=True)
    centred = rewards - rewards.mean(dim=-1, keepdim=True)
    return torch.where(constant, torch.zeros_like(centred), centred), constant


@register_advantage("drgrpo", paper="Liu et al. 2025, Understanding R1-Zero-like training, arXiv:2503.20783")
@computes_in_float32
def drgrpo_advantages(rewards: Float[Tensor, "G K"]) -> Float[Tensor, "G K"]:
    r"""Dr.GRPO advantages $A_{gk} = R_{gk} - \mu_g$ (no std scaling).

    Equal to ``group_normalized_advantages(rewards, scale_by_std=False)``; pair it with the constant
    normaliser ``aggregate(..., "seq-mean-token-sum-norm")``.

    References:
        Liu et al. 2025, Understanding R1-Zero-like training (arXiv:2503.20783).

    Examples:
        >>> drgrpo_advantages(torch.tensor([[1., 0., 0., 0.]])).tolist()
        [[0.75, -0.25, -0.25, -0.25]]
    """
    return group_normalized_advantages(rewards, scale_by_std=False)


@register_advantage("rloo", paper="Ahmadian et al. 2024, Back to Basics, arXiv:2402.14740")
@computes_in_float32
def rloo_advantages(rewards: Float[Tensor, "G K"]) -> Float[Tensor, "G K"]:
    r"""REINFORCE leave-one-out advantages.

    $$
    A_{gk} = R_{gk} - \frac{1}{K-1}\sum_{j\neq k} R_{gj} = \frac{K}{K-1}(R_{gk} - \mu_g)
    $$

    Args:
        rewards: ``[G, K]`` with ``K >= 2``.

    Returns:
        ``[G, K]`` advantages; each row sums to zero.

    Raises:
        ShapeError: not 2-d float, or ``K < 2``.
        DomainError: non-finite rewards.

    References:
        Kool et al. 2019; Ahmadian et al. 2024 (arXiv:2402.14740).

    Examples:
        >>> [round(x, 4) for x in rloo_advantages(torch.tensor([[1., 0., 0., 0.]]))[0].tolist()]
        [1.0, -0.3333, -0.3333, -0.3333]
    """
    _check_grouped("rewards", rewards, min_k=2)
    k = rewards.shape[-1]
    return _centre(rewards)[0] * (k / (k - 1))


def broadcast_sequence_advantages(
    advantages: Float[Tensor, "G K"] | Float[Tensor, " B"], mask: Bool[Tensor, "B T"]
) -> Float[Tensor, "B T"]:
    """Spread per-sequence advantages (``[G, K]`` or ``[B]``) over the response tokens, times the mask.

    Masked positions are exactly 0 (even for a NaN advantage).

    Examples:
        >>> broadcast_sequence_advantages(torch.tensor([1.0, -2.0]), torch.tensor([[True, False], [True, True]]))
        tensor([[ 1.,  0.],
                [-2., -2.]])
    """
    check_float("advantages", advantages, ndim=(1, 2))
    check_tensor("mask", mask, ndim=2)
    flat = advantages.reshape(-1)
    if flat.shape[0] != mask.shape[0]:
        raise ShapeError(
            f"advantages: expected one value per row of mask ({mask.shape[0]}), got shape {list(advantages.shape)}"
        )
    check_mask("mask", mask, (flat.shape[0], mask.shape[-1]))
    if (
        flat.device.type == "cpu"
        and not (flat.requires_grad and torch.is_grad_enabled())
        and bool(torch.isfinite(flat).all())
    ):
        # On CPU the mask converted to floats and scaled in place, block by block of rows (a
        # quarter block: it stays in the core's cache between the two steps), beats one
        # broadcasting boolean ``where``; finite advantages times 0 are exactly 0.
        out = torch.empty(mask.shape, dtype=flat.dtype)
        column, m8 = flat.unsqueeze(-1), mask.view(torch.uint8)
        for rows in row_blocks(mask.shape[0], mask.shape[1] * out.element_size() * 4):
            out[rows].copy_(m8[rows]).mul_(column[rows])
        return out
    return torch.where(mask, flat.unsqueeze(-1), torch.zeros((), dtype=flat.dtype, device=flat.device))
