"""The few input checks every public function uses.

Shape and dtype checks always run: they are cheap and catch most misuse. Value checks (finite
entries, a non-empty mask, probabilities in range) need a pass over the data and a host sync, so
one library-wide switch turns them off in hot loops:

    with posttrain.validate.value_checks(False):
        loss = clipped_ratio_loss(...)

Every error names the argument, what was received and what was expected.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from enum import Enum
from typing import TypeVar

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError

__all__ = [
    "broadcast_to_tokens",
    "check_choice",
    "check_finite",
    "check_float",
    "check_in_range",
    "check_mask",
    "check_nonempty_mask",
    "check_positive",
    "check_same_shape",
    "check_tensor",
    "value_checks",
    "value_checks_enabled",
]

_STATE = threading.local()
E = TypeVar("E", bound=Enum)


def value_checks_enabled() -> bool:
    """Whether value checks (finite, non-empty mask, ranges on tensors) run in this thread."""
    return getattr(_STATE, "enabled", True)


@contextlib.contextmanager
def value_checks(enabled: bool) -> Iterator[None]:
    """Context manager that turns tensor value checks on or off in this thread."""
    previous = value_checks_enabled()
    _STATE.enabled = bool(enabled)
    try:
        yield
    finally:
        _STATE.enabled = previous


def _shape_str(shape: Sequence[int | str | None]) -> str:
    return "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"


def check_tensor(name: str, x: object, *, ndim: int | Sequence[int] | None = None) -> Tensor:
    """Check that ``x`` is a tensor with the given rank(s); return it."""
    if not isinstance(x, Tensor):
        raise ShapeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.ndim not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise ShapeError(f"{name}: expected rank {want}, got shape {_shape_str(list(x.shape))}")
    return x


def check_float(name: str, x: object, *, ndim: int | Sequence[int] | None = None) -> Tensor:
    """Check that ``x`` is a floating-point tensor (float16/bfloat16/float32/float64)."""
    t = check_tensor(name, x, ndim=ndim)
    if not t.is_floating_point():
        raise ShapeError(f"{name}: expected a floating-point dtype, got {t.dtype}")
    return t


def check_mask(name: str, mask: object, shape: torch.Size | Sequence[int]) -> Tensor:
    """Check that ``mask`` is a boolean tensor of exactly ``shape``."""
    m = check_tensor(name, mask)
    if m.dtype != torch.bool:
        raise ShapeError(f"{name}: expected dtype torch.bool (use mask.bool()), got {m.dtype}")
    if tuple(m.shape) != tuple(shape):
        raise ShapeError(f"{name}: expected shape {_shape_str(list(shape))}, got {_shape_str(list(m.shape))}")
    return m


def check_same_shape(reference_name: str, reference: Tensor, **others: Tensor) -> None:
    """Check that every tensor in ``others`` has the shape of ``reference``."""
    for name, t in others.items():
        check_tensor(name, t)
        if t.shape != reference.shape:
            raise ShapeError(
                f"{name}: expected shape {_shape_str(list(reference.shape))} "
                f"(the shape of {reference_name}), got {_shape_str(list(t.shape))}"
            )


def check_positive(name: str, value: float, *, strict: bool = True) -> float:
    """Check a scalar hyperparameter is > 0 (or >= 0 with ``strict=False``)."""
    v = float(value)
    if v != v or (v <= 0 if strict else v < 0):
        op = "> 0" if strict else ">= 0"
        raise DomainError(f"{name}: expected a number {op}, got {value!r}")
    return v


def check_in_range(name: str, value: float, low: float, high: float, *, closed: bool = True) -> float:
    """Check a scalar lies in [low, high] (or (low, high) with ``closed=False``)."""
    v = float(value)
    ok = (low <= v <= high) if closed else (low < v < high)
    if not ok:
        br = "[]" if closed else "()"
        raise DomainError(f"{name}: expected a value in {br[0]}{low}, {high}{br[1]}, got {value!r}")
    return v


def check_choice(name: str, value: object, choices: type[E]) -> E:
    """The member of the Enum ``choices`` that ``value`` is (or has as its value); DomainError naming ``name``.

    Examples:
        >>> from posttrain.estimators import AggregationMode
        >>> check_choice("mode", "token-mean", AggregationMode)
        <AggregationMode.TOKEN_MEAN: 'token-mean'>
    """
    try:
        return choices(value)
    except ValueError:
        valid = ", ".join(repr(m.value) for m in choices)
        raise DomainError(f"{name}: expected one of {valid}, got {value!r}") from None


def check_finite(name: str, x: Tensor, mask: Tensor | None = None) -> Tensor:
    """Check every entry (every entry where ``mask`` is True) is finite; skipped when value checks are off.

    The fast path is one reduction (a sum is finite when every term is); only when it is not is
    the exact elementwise test run, so a finite tensor whose sum overflows is not rejected.
    """
    if not value_checks_enabled() or not x.numel() or not x.is_floating_point():
        return x
    xd = x.detach()
    if mask is not None:
        xd = torch.where(mask, xd, torch.zeros((), dtype=xd.dtype, device=xd.device))
    if bool(torch.isfinite(xd.sum())):
        return x
    bad = int((~torch.isfinite(xd)).sum())
    if bad:
        where = " on valid (mask=True) positions" if mask is not None else ""
        raise DomainError(f"{name}: expected finite values, found {bad} non-finite entries{where}")
    return x


def check_nonempty_mask(name: str, mask: Tensor) -> Tensor:
    """Check the mask selects at least one position (skipped when value checks are off)."""
    if value_checks_enabled() and not bool(mask.any()):
        raise DomainError(f"{name}: the mask selects no position; at least one token is required")
    return mask


def broadcast_to_tokens(name: str, x: Tensor, shape: torch.Size) -> Tensor:
    """Broadcast a per-sequence ``[B]`` tensor (or pass a ``[B, T]`` one) to ``shape = [B, T]``."""
    check_float(name, x, ndim=(1, 2))
    if x.ndim == 1:
        if x.shape[0] != shape[0]:
            raise ShapeError(
                f"{name}: expected shape [{shape[0]}] or {_shape_str(list(shape))}, got {_shape_str(list(x.shape))}"
            )
        return x.unsqueeze(-1).expand(shape)
    if x.shape != shape:
        raise ShapeError(
            f"{name}: expected shape [{shape[0]}] or {_shape_str(list(shape))}, got {_shape_str(list(x.shape))}"
        )
    return x
