r"""Weighted log-likelihood losses: the REINFORCE / weighted-SFT surrogate $-W\log\pi$, and GARL / PAFT.

The weights of GARL and PAFT (and their formulas) are in
`posttrain.estimators.advantages.trace_weights`; the losses here spread them over the trace and
answer tokens and return ``(loss [B, T], TsallisWeights)``. Reference: Lin & Ie 2026, Tsallis loss
continuum (arXiv:2604.25907).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from posttrain.errors import ShapeError
from posttrain.estimators._numerics import computes_in_float32
from posttrain.estimators._registry import register_policy_loss
from posttrain.estimators.advantages.trace_weights import (
    TsallisWeights,
    garl_weights,
    paft_weights,
    tsallis_token_weights,
)
from posttrain.shapes import Bool, Float
from posttrain.validate import check_finite, check_float, check_mask, check_nonempty_mask

__all__ = ["garl_loss", "paft_loss", "weighted_logp_loss"]


_PAPER = "Lin & Ie 2026, Tsallis loss continuum, arXiv:2604.25907"


def weighted_logp_loss(
    logp: Float[Tensor, "B T"], token_weights: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"]
) -> Float[Tensor, "B T"]:
    r"""The REINFORCE / weighted-SFT surrogate $-W_{bt}\log\pi_{bt}$ on ``mask``, exactly 0 where $W = 0$ or off it.

    The weights are detached (a stop-gradient): the gradient is $-W\nabla\log\pi$. A zero weight
    never multiplies ``logp`` (so a masked or ignored ``-inf`` log-prob gives 0, not NaN).

    Examples:
        >>> weighted_logp_loss(torch.log(torch.tensor([[0.5, 0.25]])), torch.tensor([[2.0, 0.0]]),
        ...                    torch.ones(1, 2, dtype=torch.bool)).tolist()
        [[1.3862943649291992, 0.0]]
    """
    check_float("logp", logp, ndim=2)
    check_mask("mask", mask, tuple(logp.shape))
    if tuple(token_weights.shape) != tuple(logp.shape):
        raise ShapeError(f"token_weights: expected shape {list(logp.shape)}, got {list(token_weights.shape)}")
    w = token_weights.detach().to(logp.dtype)
    keep = mask & (w != 0)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    return torch.where(keep, -w * torch.where(keep, logp, zero), zero)


def _check_layout(logp: Tensor, mask: Tensor, log_w: Tensor, answer_mask: Tensor | None) -> None:
    """``logp``/``mask`` ``[B, T]`` with ``B = G*M`` rows for ``log_w [G, M]``, and a token to train on."""
    check_float("logp", logp, ndim=2)
    check_mask("mask", mask, logp.shape)
    check_float("log_w", log_w, ndim=2)
    if log_w.numel() != logp.shape[0]:
        raise ShapeError(
            f"log_w: expected G*M = {logp.shape[0]} entries (one per row of logp), got shape {list(log_w.shape)}"
        )
    if answer_mask is not None:
        check_mask("answer_mask", answer_mask, logp.shape)
    active = mask if answer_mask is None else mask | answer_mask
    check_nonempty_mask("mask", active)
    check_finite("logp", logp, active)


def _weighted_token_loss(logp: Tensor, mask: Tensor, weights: TsallisWeights, answer_mask: Tensor | None) -> Tensor:
    token_w = tsallis_token_weights(weights, mask, answer_mask).to(logp.dtype)
    active = mask if answer_mask is None else mask | answer_mask
    return weighted_logp_loss(logp, token_w, active)


@register_policy_loss("garl", paper=_PAPER)
@computes_in_float32
def garl_loss(
    logp: Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    log_w: Float[Tensor, "G M"],
    *,
    q: float,
    answer_mask: Bool[Tensor, "B T"] | None = None,
    baseline: Literal["rloo", "none"] = "rloo",
    log_w_min: float | None = None,
) -> tuple[Float[Tensor, "B T"], TsallisWeights]:
    r"""GARL per-token loss $-A_m\log\pi$ on trace tokens and $-\bar w^{-q}w_m\log\pi$ on answer tokens.

    Args:
        logp: ``[B, T]`` token log-probs with gradient, ``B = G*M`` rows in row-major (prompt, trace) order.
        mask: ``[B, T]`` trace tokens.
        log_w: ``[G, M]`` detached log-weights.
        q, baseline, log_w_min: see `garl_weights`.
        answer_mask: ``[B, T]`` answer tokens (likelihood setting), or None (verifier setting).

    Returns:
        ``(loss [B, T], TsallisWeights)``; reduce with ``loss.sum() / B``. Exactly 0 where a weight is 0.

    Examples:
        >>> lp = torch.log(torch.tensor([[0.5], [0.25]]))
        >>> loss, _ = garl_loss(lp, torch.ones(2, 1, dtype=torch.bool), torch.log(torch.tensor([[1.0, 0.0]])), q=0.0)
        >>> [round(x, 4) for x in loss[:, 0].tolist()]  # -(w_m - b_m) log pi
        [0.6931, -1.3863]
    """
    _check_layout(logp, mask, log_w, answer_mask)
    weights = garl_weights(log_w, q=q, baseline=baseline, log_w_min=log_w_min)
    return _weighted_token_loss(logp, mask, weights, answer_mask), weights


@register_policy_loss("paft", paper=_PAPER)
@computes_in_float32
def paft_loss(
    logp: Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    log_w: Float[Tensor, "G M"],
    uniforms: Float[Tensor, "G S"],
    *,
    q: float,
    answer_mask: Bool[Tensor, "B T"] | None = None,
    log_w_min: float | None = None,
) -> tuple[Float[Tensor, "B T"], TsallisWeights]:
    r"""PAFT per-token loss $-M\bar w^{1-q}\frac{c_m}{S}\log\pi$ on trace and answer tokens (SFT on resamples).

    Same layout and reduction as `garl_loss`; ``uniforms [G, S]`` drive the resampling.
    """
    _check_layout(logp, mask, log_w, answer_mask)
    weights = paft_weights(log_w, uniforms, q=q, log_w_min=log_w_min)
    return _weighted_token_loss(logp, mask, weights, answer_mask), weights
