r"""Unbiased pass@k and mean@k from n samples with c correct (Chen et al. 2021)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError

__all__ = ["mean_at_k", "pass_at_k"]

ArrayLike = int | np.ndarray | Tensor | list[int]


def _as_int_array(name: str, x: ArrayLike) -> np.ndarray:
    arr = x.detach().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ShapeError(f"{name}: expected integer counts, got non-integer values")
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise ShapeError(f"{name}: expected integer counts, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def _like_input(out: np.ndarray, *inputs: ArrayLike) -> np.ndarray | Tensor:
    """``out`` as a float64 tensor on the first tensor input's device when any input is a tensor, else as is."""
    tensor = next((x for x in inputs if isinstance(x, Tensor)), None)
    return out if tensor is None else torch.as_tensor(out, dtype=torch.float64, device=tensor.device)


def _check_counts(n: ArrayLike, c: ArrayLike, k: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n_, c_, k_ = _as_int_array("n", n), _as_int_array("c", c), _as_int_array("k", k)
    try:
        n_, c_, k_ = np.broadcast_arrays(n_, c_, k_)
    except ValueError:
        raise ShapeError(f"n, c, k: shapes {n_.shape}, {c_.shape}, {k_.shape} do not broadcast") from None
    if np.any(n_ < 1):
        raise DomainError(f"n: expected n >= 1, got min {int(n_.min())}")
    if np.any((c_ < 0) | (c_ > n_)):
        i = int(np.argmax((c_ < 0) | (c_ > n_)))
        raise DomainError(f"c: expected 0 <= c <= n for every entry, got c={int(c_.flat[i])} with n={int(n_.flat[i])}")
    if np.any((k_ < 1) | (k_ > n_)):
        raise DomainError(f"k: expected 1 <= k <= n for every entry, got k in [{int(k_.min())}, {int(k_.max())}]")
    return n_, c_, k_


def pass_at_k(n: ArrayLike, c: ArrayLike, k: ArrayLike) -> np.ndarray | Tensor:
    r"""Unbiased pass@k, vectorised over broadcastable arrays of n, c, k.

    $$
    \mathrm{pass@}k = 1 - \binom{n-c}{k}\Big/\binom{n}{k}
                  = 1 - \prod_{i=n-c+1}^{n}\Big(1 - \frac{k}{i}\Big)
    $$

    evaluated in log space, $-\mathrm{expm1}(\sum \log1p(-k/i))$, as a sum over
    $i \in (n-c, n]$ (masked cumulative sums, no Python loop). It is 1 exactly when
    $n - c < k$ and 0 exactly when $c = 0$.

    Args:
        n: samples per problem (>= 1). c: correct samples (0 <= c <= n). k: 1 <= k <= n.

    Returns:
        float64 array of the broadcast shape (0-d for scalar input); a float64 tensor (on the input's
        device) when any input is a tensor.

    Raises:
        ShapeError: non-integer or non-broadcastable input.
        DomainError: counts out of range.

    References:
        Chen et al. 2021, Evaluating LLMs trained on code (arXiv:2107.03374).

    Examples:
        >>> float(pass_at_k(4, 1, 2)), round(float(pass_at_k(16, 3, 8)), 6), round(float(pass_at_k(200, 10, 100)), 8)
        (0.5, 0.9, 0.99922897)
    """
    n_, c_, k_ = _check_counts(n, c, k)
    out = np.empty(n_.shape, dtype=np.float64)
    certain = (n_ - c_) < k_
    flat_n, flat_c, flat_k = n_.ravel(), c_.ravel(), k_.ravel()
    width = int(flat_c.max()) if flat_c.size else 0
    if width == 0:
        out[...] = np.where(certain, 1.0, 0.0)
        return _like_input(out, n, c, k)
    j = np.arange(width)[None, :]
    i = (flat_n - flat_c)[:, None] + 1 + j  # i in (n - c, n]
    valid = j < flat_c[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(valid & ~certain.ravel()[:, None], np.log1p(-flat_k[:, None] / i), 0.0)
    val = -np.expm1(terms.sum(axis=1))
    out = np.where(certain.ravel(), 1.0, val).reshape(n_.shape)
    return _like_input(out, n, c, k)


def mean_at_k(n: ArrayLike, c: ArrayLike, k: ArrayLike) -> np.ndarray | Tensor:
    r"""Unbiased mean@k: the expected fraction correct among k of the n samples drawn without replacement.

    $$
    \mathrm{mean@}k = c / n
    $$

    It does not depend on k (linearity of expectation: each of the k drawn samples is correct with
    probability c/n) but k is validated (``1 <= k <= n``) so that a table of pass@k and mean@k is
    computed from the same, checked counts. It is the average over all size-k subsets of the
    subset's fraction correct ("avg@k"), not a majority vote (maj@k) and not pass@k.

    Args:
        n: samples per problem (>= 1). c: correct samples (0 <= c <= n). k: 1 <= k <= n.

    Returns:
        float64 array of the broadcast shape; a float64 tensor when any input is a tensor.

    Raises:
        ShapeError: non-integer or non-broadcastable input.
        DomainError: counts out of range.

    Examples:
        >>> float(mean_at_k(4, 1, 2)), mean_at_k([8, 8], [0, 6], 4).tolist()
        (0.25, [0.0, 0.75])
    """
    n_, c_, _ = _check_counts(n, c, k)
    return _like_input((c_ / n_).astype(np.float64), n, c, k)
