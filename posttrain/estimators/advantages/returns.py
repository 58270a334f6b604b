"""REINFORCE++: token-level discounted returns whitened over the batch, without a critic.

Token rewards and the returns are ``[B, T]`` with a boolean response ``mask``; conventions follow
verl's ``core_algos`` (cross-checked against verl 0.9.1's recorded outputs), see ``docs/anchors.md``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.estimators._numerics import computes_in_float32, zero_off_mask
from posttrain.estimators._registry import register_advantage
from posttrain.estimators.advantages.group import _centre, _check_grouped, broadcast_sequence_advantages
from posttrain.estimators.aggregation import masked_whiten
from posttrain.shapes import Bool, Float
from posttrain.validate import (
    check_finite,
    check_float,
    check_in_range,
    check_mask,
    check_nonempty_mask,
    check_positive,
    check_tensor,
)

__all__ = ["reinforce_pp_advantages", "reinforce_pp_baseline_advantages"]


@register_advantage("reinforce_pp", paper="Hu 2025, REINFORCE++, arXiv:2501.03262")
@computes_in_float32
def reinforce_pp_advantages(
    token_rewards: Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    gamma: float = 1.0,
    eps: float = 1e-8,
) -> Float[Tensor, "B T"]:
    r"""REINFORCE++ advantages: discounted returns whitened over the batch's valid tokens.

    $$
    G_{it} = \sum_{t' \ge t} \gamma^{t'-t} m_{it'} r_{it'},\qquad
                  A = \frac{G - \mu}{\sqrt{\sigma^2 + \epsilon}} \cdot m
    $$

    with $\mu, \sigma^2$ the mean and Bessel variance over all masked tokens of the batch
    (verl's ``compute_reinforce_plus_plus_outcome_advantage``). Outcome rewards are usually placed
    on the last valid token.

    Args:
        token_rewards: ``[B, T]`` per-token rewards.
        mask: ``[B, T]`` boolean response mask.
        gamma: discount in ``[0, 1]``.
        eps: positive constant added to the variance.

    Returns:
        ``[B, T]`` advantages, zero on masked positions.

    Raises:
        ShapeError: wrong rank, dtype or mismatched shapes.
        DomainError: empty mask, non-finite
            rewards on valid tokens, ``gamma`` outside ``[0, 1]``, ``eps <= 0``.

    Masked positions contribute nothing; unlike verl, a *hole* in the mask (a masked span between
    valid tokens) does not reset the return (see ``docs/anchors.md``); for right-padded masks the
    two agree.

    References:
        Hu 2025, REINFORCE++ (arXiv:2501.03262).

    Examples:
        >>> r = torch.tensor([[0., 0., 1.], [0., 0., 0.]])
        >>> m = torch.tensor([[True, True, True], [True, True, False]])
        >>> # returns 1, 1, 1 and 0, 0: mean 0.6, Bessel variance 0.3, (1 - 0.6) / sqrt(0.3) = 0.730
        >>> [round(x, 3) for x in reinforce_pp_advantages(r, m)[0].tolist()]
        [0.73, 0.73, 0.73]
    """
    check_float("token_rewards", token_rewards, ndim=2)
    check_mask("mask", mask, token_rewards.shape)
    check_nonempty_mask("mask", mask)
    check_finite("token_rewards", token_rewards, mask)
    gamma = check_in_range("gamma", gamma, 0.0, 1.0)
    eps = check_positive("eps", eps)
    r = zero_off_mask(token_rewards, mask)
    t = r.shape[-1]
    if gamma == 1.0:
        returns = r.flip(-1).cumsum(-1).flip(-1)
    else:
        # G_t = sum_{t'>=t} gamma^{t'-t} r_t' as one triangular matmul: W[t', t] = gamma^{t'-t} for t' >= t.
        idx = torch.arange(t, device=r.device)
        lag = (idx.unsqueeze(1) - idx.unsqueeze(0)).to(r.dtype)
        w = torch.where(
            lag >= 0, torch.as_tensor(gamma, dtype=r.dtype) ** lag.clamp(min=0), torch.zeros((), dtype=r.dtype)
        )
        returns = r @ w
    return masked_whiten(returns, mask, eps=eps)


@register_advantage("reinforce_pp_baseline", paper="Hu 2025, REINFORCE++, arXiv:2501.03262")
@computes_in_float32
def reinforce_pp_baseline_advantages(
    rewards: Float[Tensor, "G K"], mask: Bool[Tensor, "B T"], *, eps: float = 1e-8
) -> Float[Tensor, "B T"]:
    r"""REINFORCE++-baseline: group-mean-centred outcome, broadcast to tokens, whitened over the batch.

    $$
    s_{gk} = R_{gk} - \mu_g,\qquad A_{it} = \frac{s_i - \mu_s}{\sqrt{\sigma_s^2 + \epsilon}}\, m_{it}
    $$

    where $\mu_s, \sigma_s^2$ are the mean and Bessel variance of the broadcast score over
    all valid tokens of the batch (so long responses weigh more, as in verl).

    Args:
        rewards: ``[G, K]`` outcome rewards.
        mask: ``[G*K, T]`` boolean response mask (row-major over groups).
        eps: positive constant added to the variance.

    Returns:
        ``[B, T]`` advantages, zero on masked positions.

    Raises:
        ShapeError: wrong ranks or dtypes, mask rows not ``G*K``.
        DomainError: empty mask,
            non-finite rewards, ``eps <= 0``.

    A singleton group (``K == 1``) gets score 0 here; verl uses the reward itself (``docs/anchors.md``).

    References:
        Hu 2025, REINFORCE++ (arXiv:2501.03262).

    Examples:
        >>> # scores 0.5, -0.5, 0, 0 on 2 tokens each: mean 0, Bessel variance 1/7, 0.5 * sqrt(7) = 1.323
        >>> m, r = torch.ones(4, 2, dtype=torch.bool), torch.tensor([[1., 0.], [1., 1.]])
        >>> [round(x, 3) for x in reinforce_pp_baseline_advantages(r, m)[:, 0].tolist()]
        [1.323, -1.323, 0.0, 0.0]
    """
    _check_grouped("rewards", rewards)
    eps = check_positive("eps", eps)
    check_tensor("mask", mask, ndim=2)
    check_mask("mask", mask, (rewards.numel(), mask.shape[-1]))
    check_nonempty_mask("mask", mask)
    scores = _centre(rewards)[0]
    return masked_whiten(broadcast_sequence_advantages(scores, mask), mask, eps=eps)
