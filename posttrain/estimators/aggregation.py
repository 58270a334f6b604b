"""Reduction of a per-token ``[B, T]`` matrix to a scalar, and masked statistics.

The aggregation modes follow verl's ``agg_loss`` (names kept), see ``docs/anchors.md``.
"""

from __future__ import annotations

from enum import Enum

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators._numerics import (
    computes_in_float32,
    is_marked_zero_off_mask,
    row_any,
    row_blocks,
    zero_off_mask,
)
from posttrain.shapes import Bool, Float
from posttrain.validate import (
    check_finite,
    check_float,
    check_mask,
    check_nonempty_mask,
    check_positive,
    check_tensor,
    value_checks_enabled,
)

__all__ = [
    "AggregationMode",
    "aggregate",
    "global_aggregate",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "normaliser",
    "weighted_sum",
]


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


def _count(mask: Tensor, dim: int | None, dtype: torch.dtype) -> Tensor:
    """Number of True entries (over ``dim``) as ``dtype``, by the fastest route on CPU.

    ``mask.sum()`` first copies a boolean mask to int64; ``count_nonzero`` does not (over all
    entries) but is slow along a dimension, where a float sum is used (exact below 2**24 per row).
    """
    return mask.count_nonzero().to(dtype) if dim is None else mask.to(dtype).sum(dim=dim)


def _check_broadcast_mask(mask: Tensor, values: Tensor) -> None:
    check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise ShapeError(f"mask: expected dtype torch.bool (use mask.bool()), got {mask.dtype}")
    try:  # equal shapes first: torch.broadcast_shapes is a slow Python path (~50 us a call in hot loops)
        ok = mask.shape == values.shape or torch.broadcast_shapes(mask.shape, values.shape) == values.shape
    except RuntimeError:
        ok = False
    if not ok:
        raise ShapeError(
            f"mask: expected the shape of values {list(values.shape)} (or one broadcastable to it), "
            f"got {list(mask.shape)}"
        )


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """$\\sum m \\cdot x$ with masked entries replaced by zero (so NaN/inf there never leak).

    ``mask`` is boolean, of the shape of ``values`` or broadcastable to it.
    """
    check_float("values", values)
    _check_broadcast_mask(mask, values)
    if values.device.type == "cpu":
        # A multiply by the mask viewed as uint8 and a sum; a NaN or infinity in the product always
        # reaches the sum, so testing the (small) result for finiteness replaces a full pass over
        # the product (the fallback below is exact whatever the masked entries hold).
        m8 = mask.view(torch.uint8)
        if _blockable(values, mask, dim):
            total = values.new_empty(values.shape[0])
            blocks = row_blocks(values.shape[0], values.shape[1] * values.element_size())
            step = blocks[0].stop if blocks else 0
            scratch = values.new_empty(min(values.shape[0], step), values.shape[1])  # reused by every block
            for rows in blocks:
                block = values[rows]
                maskf = scratch[: block.shape[0]].copy_(m8[rows])  # one conversion; a float multiply
                torch.sum(maskf.mul_(block), dim=-1, out=total[rows])
            if bool(torch.isfinite(total).all()):
                return total
        product = values * m8
        total = product.sum() if dim is None else product.sum(dim=dim)
        if bool(torch.isfinite(total.detach()).all()):
            return total
    masked = zero_off_mask(values, mask)
    return masked.sum() if dim is None else masked.sum(dim=dim)


def _blockable(values: Tensor, mask: Tensor, dim: int | None) -> bool:
    """Whether `masked_sum` may take its row-blocked path: a 2-d row sum without autograd."""
    return (
        values.ndim == 2
        and dim in (1, -1)
        and mask.shape == values.shape
        and not (values.requires_grad and torch.is_grad_enabled())
    )


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """$\\sum m x / \\max(\\sum m, 1)$; rows with no valid entry give 0."""
    total = masked_sum(values, mask, dim)
    return total / _count(mask.expand(values.shape), dim, values.dtype).clamp(min=1)


def masked_whiten(
    values: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"], *, eps: float = 1e-8
) -> Float[Tensor, "B T"]:
    r"""Whiten over all masked entries: $(x - \mu) / \sqrt{\sigma^2 + \epsilon}$, times the mask.

    $\mu$ and the Bessel-corrected $\sigma^2$ are taken over the valid entries (verl's
    ``masked_whiten``; a single valid entry has variance 0, where verl raises). Masked positions are
    0 in the output and never influence it.

    Args:
        values: ``[B, T]`` float values.
        mask: ``[B, T]`` boolean, at least one True.
        eps: positive constant added to the variance.

    Raises:
        ShapeError: non-float values, non-boolean or mismatched mask.
        DomainError: empty mask, ``eps <= 0``.

    Examples:
        >>> x = torch.tensor([[1., 2., 3., float("nan")]])
        >>> masked_whiten(x, torch.tensor([[True, True, True, False]])).tolist()
        [[-1.0, 0.0, 1.0, 0.0]]
    """
    check_float("values", values, ndim=2)
    check_mask("mask", mask, values.shape)
    check_nonempty_mask("mask", mask)
    eps = check_positive("eps", eps)
    n = _count(mask, None, values.dtype)
    mean = masked_sum(values, mask) / n.clamp(min=1)
    centred = zero_off_mask(values - mean, mask)
    var = (centred**2).sum() / (n - 1).clamp(min=1)
    return centred * torch.rsqrt(var + eps)


def normaliser(
    mask: Bool[Tensor, "B T"],
    mode: AggregationMode | str,
    *,
    horizon: float | None = None,
    tokens: int | Tensor | None = None,
    rows: int | Tensor | None = None,
) -> Float[Tensor, ""]:
    r"""The denominator $Z$ of `aggregate` as a 0-d float64 tensor.

    Every mode is $\mathrm{agg} = \sum_i w_i \sum_t m_{it} L_{it} / Z$ with per-row weights
    $w_i$ that depend on the row alone ($1/n_i$ for ``seq-mean-token-mean``, else 1,
    see `weighted_sum`) and, with $N$ valid tokens and $S$ non-empty rows:

    - ``token-mean``: $Z = N$; ``token-sum``: $Z = 1$;
    - ``seq-mean-token-mean``, ``seq-mean-token-sum``: $Z = S$; ``seq-mean-token-sum-norm``: $Z = S H$.

    So for rows split into micro-batches or data-parallel ranks $b$,
    $\mathrm{agg}(\text{all}) = \sum_b \mathrm{agg}(b)\,Z_b / Z$. ``tokens`` ($N$) and
    ``rows`` ($S$) replace the local counts by those of a global batch; ``horizon``
    ($H$) defaults to the padded length ``T``. Counts are clamped to at least 1.

    Examples:
        >>> m = torch.tensor([[True, True, False], [True, True, True]])
        >>> [float(normaliser(m, x, horizon=4)) for x in ("token-mean", "seq-mean-token-sum-norm", "token-sum")]
        [5.0, 8.0, 1.0]
    """
    m = AggregationMode.parse(mode)
    if m is AggregationMode.TOKEN_SUM:
        return torch.ones((), dtype=torch.float64, device=mask.device)
    if m is AggregationMode.TOKEN_MEAN:
        n = mask.count_nonzero() if tokens is None else torch.as_tensor(tokens, device=mask.device)
        return n.double().clamp(min=1)
    s = row_any(mask).count_nonzero() if rows is None else torch.as_tensor(rows, device=mask.device)
    s = s.double().clamp(min=1)
    if m is AggregationMode.SEQ_MEAN_TOKEN_SUM_NORM:
        return s * float(mask.shape[-1] if horizon is None else horizon)
    return s


def weighted_sum(
    values: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"], mode: AggregationMode | str, *, premasked: bool = False
) -> Float[Tensor, ""]:
    r"""The numerator of `aggregate`: $\sum_i w_i \sum_t m_{it} L_{it}$, $w_i = 1/n_i$
    for ``seq-mean-token-mean`` (fully masked rows contribute 0), else 1.

    ``premasked``: ``values`` is already exactly 0 off the mask, so plain sums replace the masked
    ones (no multiply by the mask forward, no masked copy of the gradient backward)."""
    seq_mean = AggregationMode.parse(mode) is AggregationMode.SEQ_MEAN_TOKEN_MEAN
    if premasked:
        return (values.sum(dim=-1) / _count(mask, -1, values.dtype).clamp(min=1)).sum() if seq_mean else values.sum()
    if seq_mean:
        return (masked_sum(values, mask, dim=-1) / _count(mask, -1, values.dtype).clamp(min=1)).sum()
    return masked_sum(values, mask)


@computes_in_float32
def aggregate(
    values: Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    mode: AggregationMode | str = AggregationMode.TOKEN_MEAN,
    *,
    horizon: int | None = None,
    premasked: bool = False,
) -> Float[Tensor, ""]:
    r"""Reduce a per-token matrix to a scalar.

    With $m$ the mask, $n_i = \sum_t m_{it}$ and $\mathcal{B}$ the rows with
    $n_i > 0$ (fully masked rows are excluded from sequence means):

    - ``token-mean``: $\sum m L / \sum m$
    - ``token-sum``: $\sum m L$
    - ``seq-mean-token-mean``: $\frac{1}{|\mathcal{B}|}\sum_{i\in\mathcal{B}} \frac{1}{n_i}\sum_t m L$
    - ``seq-mean-token-sum``: $\frac{1}{|\mathcal{B}|}\sum_{i\in\mathcal{B}} \sum_t m L$
    - ``seq-mean-token-sum-norm``: $\frac{1}{|\mathcal{B}| H}\sum_{i} \sum_t m L$ with
      $H$ = ``horizon`` (default ``T``); Dr.GRPO's constant normaliser. verl >= 0.7.1 divides
      by $B H$; verl <= 0.7.0 divided by $H$ only (multiply by $|\mathcal{B}|$).

    Args:
        values: ``[B, T]`` per-token values (masked entries may hold anything, even NaN).
        mask: ``[B, T]`` boolean, at least one True.
        mode: an `AggregationMode` or its string value.
        horizon: the constant ``H`` of ``seq-mean-token-sum-norm``; positive.
        premasked: the caller guarantees ``values`` is exactly 0 wherever ``mask`` is False (every
            policy loss in `posttrain.estimators` returns its loss so): the sums then skip the
            multiply by the mask and, backward, the masked copy of the gradient (about a third of
            a clipped loss's forward + backward at B=4096, T=1024 on CPU). With anything
            else off the mask (NaN included) the result is wrong; the default masks, except for
            values marked by `posttrain.estimators._numerics.mark_zero_off_mask` with this very
            ``mask`` (every ratio-based policy loss here marks its loss so): those are summed as
            premasked.

    Returns:
        A 0-d tensor.

    Raises:
        ShapeError: wrong rank, dtype or mismatched shapes.
        DomainError: unknown mode, empty mask, ``horizon <= 0``, a non-finite value on the mask
            (value checks: read from the result, no extra pass over ``values``).

    Examples:
        >>> v = torch.tensor([[1., 1., 0., 0.], [2., 2., 2., 2.]])
        >>> m = torch.tensor([[True, True, False, False], [True] * 4])
        >>> round(float(aggregate(v, m, "token-mean")), 4), float(aggregate(v, m, "seq-mean-token-mean"))
        (1.6667, 1.5)
        >>> float(aggregate(v, m, "seq-mean-token-sum")), float(aggregate(v, m, "seq-mean-token-sum-norm"))
        (5.0, 1.25)
    """
    check_float("values", values, ndim=2)
    check_mask("mask", mask, values.shape)
    m = AggregationMode.parse(mode)
    h = values.shape[-1] if horizon is None else int(check_positive("horizon", horizon))
    n = mask.count_nonzero()  # counted once: the emptiness check and the token-mean normaliser
    z = normaliser(mask, m, horizon=h, tokens=n)
    premasked = premasked or is_marked_zero_off_mask(values, mask)
    out = weighted_sum(values, mask, m, premasked=premasked) / z.to(values.dtype)
    if value_checks_enabled() and bool((n == 0) | ~torch.isfinite(out.detach())):  # one read for both checks
        if int(n) == 0:
            raise DomainError("mask: the mask selects no position; at least one token is required")
        check_finite("values", values, mask)  # raises unless finite values overflowed the sum
    return out


def global_aggregate(
    values: Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    mode: AggregationMode | str,
    *,
    dp_size: int = 1,
    batch_num_tokens: int | Tensor | None = None,
    global_batch_size: int | Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> Float[Tensor, ""]:
    r"""One data-parallel rank's share of `aggregate` over the global batch.

    With $D$ = ``dp_size``, $N$ = ``batch_num_tokens`` (valid tokens of the global batch),
    $S$ = ``global_batch_size`` (its non-empty sequences), $H$ = ``loss_scale_factor``
    (default the padded length ``T``), $n_i$ the valid tokens of local row $i$:

    - ``token-mean``: $D\sum m L / N$;  ``token-sum``: $D\sum m L$
    - ``seq-mean-token-mean``: $\frac{D}{S}\sum_i \frac{1}{n_i}\sum_t m L$
    - ``seq-mean-token-sum``: $\frac{D}{S}\sum_i\sum_t m L$;  ``-norm``: that divided by $H$

    so the mean over ranks (what data-parallel gradient averaging computes) is the full-batch
    `aggregate`. Missing ``N`` / ``S`` default to the local counts, so with
    ``dp_size=1`` and no global facts this *is* ``aggregate`` (verl's ``agg_loss`` convention).

    Args:
        values: ``[B, T]`` per-token loss. mask: ``[B, T]`` boolean.
        mode: an `AggregationMode` or verl's ``loss_agg_mode`` string
            (the names are the same).
        dp_size, batch_num_tokens, global_batch_size, loss_scale_factor: verl's ``global_batch_info``.

    Raises:
        DomainError: unknown mode; ``dp_size > 1`` without the global count the mode needs.

    Examples:
        >>> v = torch.tensor([[1., 1., 0., 0.], [2., 2., 2., 2.]])
        >>> m = torch.tensor([[True, True, False, False], [True] * 4])
        >>> round(float(global_aggregate(v, m, "token-mean")), 4)  # one rank: aggregate
        1.6667
        >>> ranks = [global_aggregate(v[i : i + 1], m[i : i + 1], "token-mean", dp_size=2, batch_num_tokens=6) for i in (0, 1)]
        >>> round(float(sum(ranks) / 2), 4)  # two ranks, averaged as DDP averages gradients
        1.6667
    """
    check_float("values", values, ndim=2)
    check_mask("mask", mask, values.shape)
    m = AggregationMode.parse(mode)
    d = int(check_positive("dp_size", dp_size))
    needs = "batch_num_tokens" if m is AggregationMode.TOKEN_MEAN else "global_batch_size"
    given = batch_num_tokens if m is AggregationMode.TOKEN_MEAN else global_batch_size
    if d > 1 and given is None and m is not AggregationMode.TOKEN_SUM:
        raise DomainError(f"{needs}: required with dp_size = {d} > 1 for loss_agg_mode {m.value!r}")
    h = None if loss_scale_factor is None else check_positive("loss_scale_factor", loss_scale_factor)
    z = normaliser(mask, m, horizon=h, tokens=batch_num_tokens, rows=global_batch_size)
    return weighted_sum(values, mask, m) * d / z.to(values.dtype)
