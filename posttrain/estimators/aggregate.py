"""Reduction of a per-token ``[B, T]`` matrix to a scalar, and masked statistics.

The aggregation modes follow verl's ``agg_loss`` (names kept), see ``docs/anchors.md``.
"""

from __future__ import annotations

from enum import Enum

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.validate import check_float, check_mask, check_nonempty_mask, check_positive

__all__ = ["AggregationMode", "aggregate", "masked_mean", "masked_sum", "masked_whiten"]


class AggregationMode(str, Enum):
    """How a ``[B, T]`` loss matrix becomes a scalar (string values are accepted everywhere)."""

    TOKEN_MEAN = "token-mean"
    TOKEN_SUM = "token-sum"
    SEQ_MEAN_TOKEN_MEAN = "seq-mean-token-mean"
    SEQ_MEAN_TOKEN_SUM = "seq-mean-token-sum"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq-mean-token-sum-norm"

    @classmethod
    def parse(cls, mode: AggregationMode | str) -> AggregationMode:
        try:
            return cls(mode)
        except ValueError:
            valid = ", ".join(m.value for m in cls)
            raise DomainError(f"mode: unknown aggregation mode {mode!r}; valid: {valid}") from None


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """:math:`\\sum m \\cdot x` with masked entries replaced by zero (so NaN/inf there never leak)."""
    zeros = torch.zeros((), dtype=values.dtype, device=values.device)
    masked = torch.where(mask, values, zeros)
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """:math:`\\sum m x / \\max(\\sum m, 1)`; rows with no valid entry give 0."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1).to(values.dtype)


def masked_whiten(
    values: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"], *, eps: float = 1e-8
) -> Float[Tensor, "B T"]:
    r"""Whiten over all masked entries: :math:`(x - \mu) / \sqrt{\sigma^2 + \epsilon}`, times the mask.

    :math:`\mu` and the Bessel-corrected :math:`\sigma^2` are taken over the valid entries (verl's
    ``masked_whiten``; a single valid entry has variance 0). Masked positions are 0 in the output.
    """
    n = mask.sum().to(values.dtype)
    mean = masked_sum(values, mask) / n.clamp(min=1)
    centred = torch.where(mask, values - mean, torch.zeros((), dtype=values.dtype, device=values.device))
    var = (centred**2).sum() / (n - 1).clamp(min=1)
    return centred * torch.rsqrt(var + eps)


def aggregate(
    values: Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    mode: AggregationMode | str = AggregationMode.TOKEN_MEAN,
    *,
    horizon: int | None = None,
) -> Float[Tensor, ""]:
    r"""Reduce a per-token matrix to a scalar.

    With :math:`m` the mask, :math:`n_i = \sum_t m_{it}` and :math:`\mathcal{B}` the rows with
    :math:`n_i > 0` (fully masked rows are excluded from sequence means):

    - ``token-mean``: :math:`\sum m L / \sum m`
    - ``token-sum``: :math:`\sum m L`
    - ``seq-mean-token-mean``: :math:`\frac{1}{|\mathcal{B}|}\sum_{i\in\mathcal{B}} \frac{1}{n_i}\sum_t m L`
    - ``seq-mean-token-sum``: :math:`\frac{1}{|\mathcal{B}|}\sum_{i\in\mathcal{B}} \sum_t m L`
    - ``seq-mean-token-sum-norm``: :math:`\frac{1}{|\mathcal{B}| H}\sum_{i} \sum_t m L` with
      :math:`H` = ``horizon`` (default ``T``); Dr.GRPO's constant normaliser. verl >= 0.7.1 divides
      by :math:`B H`; verl <= 0.7.0 divided by :math:`H` only (multiply by :math:`|\mathcal{B}|`).

    Args:
        values: ``[B, T]`` per-token values (masked entries may hold anything, even NaN).
        mask: ``[B, T]`` boolean, at least one True.
        mode: an :class:`AggregationMode` or its string value.
        horizon: the constant ``H`` of ``seq-mean-token-sum-norm``; positive.

    Returns:
        A 0-d tensor.

    Raises:
        ShapeError: wrong rank, dtype or mismatched shapes.
        DomainError: unknown mode, empty mask, ``horizon <= 0``.

    Example:
        >>> v = torch.tensor([[1., 1., 0., 0.], [2., 2., 2., 2.]])
        >>> m = torch.tensor([[True, True, False, False], [True] * 4])
        >>> round(float(aggregate(v, m, "token-mean")), 4), float(aggregate(v, m, "seq-mean-token-mean"))
        (1.6667, 1.5)
        >>> float(aggregate(v, m, "seq-mean-token-sum")), float(aggregate(v, m, "seq-mean-token-sum-norm"))
        (5.0, 1.25)
    """
    check_float("values", values, ndim=2)
    check_mask("mask", mask, values.shape)
    check_nonempty_mask("mask", mask)
    m = AggregationMode.parse(mode)
    if m is AggregationMode.TOKEN_MEAN:
        return masked_mean(values, mask)
    if m is AggregationMode.TOKEN_SUM:
        return masked_sum(values, mask)
    row_sum = masked_sum(values, mask, dim=-1)
    counts = mask.sum(dim=-1)
    valid_rows = counts > 0
    n_rows = valid_rows.sum().clamp(min=1).to(values.dtype)
    if m is AggregationMode.SEQ_MEAN_TOKEN_MEAN:
        return (row_sum / counts.clamp(min=1).to(values.dtype)).sum() / n_rows
    if m is AggregationMode.SEQ_MEAN_TOKEN_SUM:
        return row_sum.sum() / n_rows
    h = values.shape[-1] if horizon is None else int(check_positive("horizon", horizon))
    return row_sum.sum() / (n_rows * h)
