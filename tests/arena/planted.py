"""Estimators planted for the arena's tests: one correct, one biased, one broken on masks, one wrong loss.

Each is written the way a researcher might write it (no input validation), so the arena's
validation findings are expected for all of them; what the tests look at is named in each docstring.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def rloo_by_matrix(rewards: Tensor) -> Tensor:
    """RLOO written differently: the leave-one-out mean as a product with the off-diagonal ones matrix.

    Equal to ``rloo`` up to rounding; unbiased.
    """
    k = rewards.shape[-1]
    off_diagonal = torch.ones(k, k, dtype=rewards.dtype) - torch.eye(k, dtype=rewards.dtype)
    return rewards - rewards @ off_diagonal / (k - 1)


def loo_with_self(rewards: Tensor) -> Tensor:
    """A leave-one-out baseline that forgets to leave the sample out: ``R - sum_j R_j / (K - 1)``.

    Biased: its expected gradient is ``(K - 2) / (K - 1)`` times the policy gradient.
    """
    k = rewards.shape[-1]
    return rewards - rewards.sum(-1, keepdim=True) / (k - 1)


def whitened_over_padding(rewards: Tensor, mask: Tensor) -> Tensor:
    """RLOO advantages on the tokens, whitened with statistics over every position, padding included.

    Breaks on masked rows and padding: the mean and std count masked positions.
    """
    k = rewards.shape[-1]
    rloo = (rewards - (rewards.sum(-1, keepdim=True) - rewards) / (k - 1)).reshape(-1, 1)
    tokens = rloo.expand(mask.shape) * mask
    return (tokens - tokens.mean()) / (tokens.std() + 1e-8) * mask


def ppo_clip_wrong_side(logp: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor) -> tuple[Tensor, Any]:
    """PPO's clipped loss with ``max`` where PPO takes ``min`` (the clip acts on the wrong side).

    For A > 0 the gradient stops once the ratio falls below 0.8 and never stops above 1.2.
    """
    ratio = torch.exp(logp - logp_old)
    a = advantages.unsqueeze(-1) if advantages.ndim == 1 else advantages
    loss = -torch.maximum(ratio * a, ratio.clamp(0.8, 1.2) * a)
    return torch.where(mask, loss, torch.zeros((), dtype=loss.dtype)), {}
