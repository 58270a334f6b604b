r"""One-sided confidence bounds behind the paper-check verdicts, and the power tools that size seed counts.

Pure numpy/scipy. ``x`` is ``[..., N]`` (``N`` seeds, one independent value per seed); bounds come back
as ``[...]`` arrays, floats for 1-d input. Every bound is one-sided at level ``alpha``: a lower bound
``L`` satisfies ``P(L > target) <= alpha`` and an upper bound ``P(U < target) <= alpha``.

**Bounded means** (accuracies, pass rates, probabilities and their differences, range declared):

- `mean_lower_bound` / `mean_upper_bound` ``(x, *, lo, hi, alpha)``: valid in finite samples for every
  distribution on ``[lo, hi]`` (betting bound, below).
- `mean_log_evalue` ``(x, null, *, lo, hi, alpha, alternative)``: log of the betting capital against
  ``mean <= null`` (or ``>= null``); the lower bound is the largest ``null`` it rejects at
  ``log(1/alpha)``, so ``mean_lower_bound(x) > m`` exactly when ``mean_log_evalue(x, m) >= log(1/alpha)``
  (up to the root finder's ``2^-40 (hi - lo)``, on the conservative side).

**Shares and quantiles** (exact binomial, any distribution):

- `proportion_bounds` ``(k, n, *, alpha)``: Clopper-Pearson bounds on a success probability.
- `share_bounds` ``(x, *, margin, alpha)``: bounds on ``P(d > margin)``; the quantile criterion
  "``P(d > margin) > f``" holds when the lower one exceeds ``f``.
- `quantile_lower_bound` / `quantile_upper_bound` ``(x, *, share, alpha)``: order-statistic bounds on
  the value that ``d`` exceeds with probability ``share``.

**Unbounded quantities** (times, log-growths, losses): `location_lower_bound` /
`location_upper_bound` ``(x, *, alpha)`` bound the median (the quantile bounds at share 1/2);
`LOCATION_ASSUMPTION` is the sentence to print beside them.

**Power** (seed plans): `power`, `seeds_for_power`, `min_detectable_effect`, for the bounded-mean
bound against the alternative of `beta_sampler` (or any sampler).

The betting bound (Waudby-Smith & Ramdas 2024, "Estimating means of bounded random variables by
betting", JRSS-B, arXiv:2010.09686; predictable plug-in bets tuned for a fixed sample size). Rescale
$y = (x - lo)/(hi - lo) \in [0, 1]$. For a candidate mean $m$ and one order of the seeds,

$$K(m) = \prod_{t=1}^{N} \bigl(1 + \lambda_t(m)\,(y_t - m)\bigr),\quad
\lambda_t(m) = \min\Bigl(\sqrt{\tfrac{2\log(1/\alpha)}{N\,\hat\sigma^2_{t-1}}},\ \tfrac{c}{m}\Bigr),$$

$\hat\mu_t = \frac{1/2 + \sum_{i \le t} y_i}{t+1}$, $\hat\sigma^2_t = \frac{1/4 + \sum_{i\le t}(y_i -
\hat\mu_{i-1})^2}{t+1}$, cap $c$ = `BET_CAP` = 0.9. Each factor is at least $1 - c > 0$ and, for
a true mean $\mu \le m$, has conditional mean $1 + \lambda_t(\mu - m) \le 1$: $K(m)$ is a non-negative
supermartingale and $P(K(m) \ge 1/\alpha) \le \alpha$ (Markov). The bound averages $K$ over
`ORDERS` = 16 fixed orders of the seeds, $\bar K(m) = \frac1B \sum_b K^{\pi_b}(m)$ (all orders when
$N! \le 16$): the seeds are independent with a common mean, so each fixed reordering is too and
$E \bar K(m) \le 1$. Both branches of $\lambda_t(m)(y_t - m)$ fall as $m$ grows, so $\bar K$ is
non-increasing in $m$ and $L = \inf\{m : \bar K(m) < 1/\alpha\}$ (a safeguarded false-position
root) is a lower bound: $P(L > \mu) \le \alpha$.
``mean_upper_bound`` applies the same to $1 - y$. Choices, measured in `benchmarks/bench_bounds.py`:
$c = 0.9$ instead of the 1/2 or 3/4 the paper uses for confidence sequences (at 10-100 seeds it
detects effects up to 44% smaller, most where the spread is small); the order average instead of
the running maximum of one order. Power table: ``docs/concepts/statistics.md``.

What the bound is and is not. Exact: valid for every distribution on ``[lo, hi]`` at every ``N``
(independent seeds);
equivariant under affine maps of the range; monotone in the candidate mean. Approximate: the
order average makes the bound nearly, not exactly, invariant to relabelling the seeds (its spread
over relabellings is about 1% of ``mean - L``); the plug-in bets depend on the past spread, so
raising one value can (rarely, by ~1e-4 of the range) lower the bound. The price of validity for
every distribution is a floor: when every value sits at ``hi``, no valid bound clears ``margin``
before ``N >= log(1/alpha) / log((hi - lo) / (margin - lo))`` (the null that puts mass on ``lo`` and
``hi`` makes that sample likely), e.g. 6 seeds for a difference in [-1, 1] at margin 0, which this
bound reaches. Declare the narrowest range the quantity can take.

Power and seed plans. `power` draws ``reps`` data sets of ``n`` seeds from the alternative and counts
how often the lower bound clears ``margin``. The default alternative is a Beta law on ``[lo, hi]``
with mean ``margin + effect`` and standard deviation ``sd`` (`beta_sampler`: exact mean and SD,
bounded, close to normal for small ``sd``); pass ``sampler`` for another law. The ``sd`` of a seed
plan comes from a pilot whose seeds are separate from the evaluation seeds (the evaluation then
runs on fresh seeds); the minimum detectable effect printed beside an inconclusive verdict uses the
observed SD at the observed seed count and says what the data could have shown.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from scipy import special, stats

from posttrain.errors import DomainError, ShapeError

__all__ = [
    "BET_CAP",
    "LOCATION_ASSUMPTION",
    "ORDERS",
    "Sampler",
    "beta_sampler",
    "location_lower_bound",
    "location_upper_bound",
    "mean_log_evalue",
    "mean_lower_bound",
    "mean_upper_bound",
    "min_detectable_effect",
    "power",
    "proportion_bounds",
    "quantile_lower_bound",
    "quantile_upper_bound",
    "seeds_for_power",
    "share_bounds",
]

BET_CAP = 0.9
"""The cap ``c`` on a bet as a share of its largest safe size ``1/m``."""
ORDERS = 16
"""Fixed orders of the seeds whose capitals the bounded-mean bound averages."""
LOCATION_ASSUMPTION = (
    "judged on the median: exact binomial order-statistic bound, valid for any distribution of "
    "independent seeds; it speaks for the mean only when the differences are symmetric"
)
"""What `location_lower_bound` / `location_upper_bound` assume, as the harness prints it."""

Sampler = Callable[[np.random.Generator, tuple[int, ...], float], np.ndarray]
"""``sampler(rng, shape, mean)``: draws of shape ``shape`` in ``[lo, hi]`` from a law with mean ``mean``."""

_ORDER_SEED = 2010_09686
_BISECTIONS = 40
_CHUNK = 1 << 21  # elements of one [rows, ORDERS, N] block


def _out(a: np.ndarray) -> Any:
    return float(a) if np.ndim(a) == 0 else a


def _alpha(alpha: float) -> float:
    if not 0.0 < alpha < 1.0:
        raise DomainError(f"alpha: expected a level in (0, 1), got {alpha!r}")
    return float(alpha)


def _values(x: Any, *, name: str = "x") -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim < 1 or a.shape[-1] == 0:
        raise ShapeError(f"{name}: expected a non-empty [..., N] array, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise DomainError(f"{name}: expected finite values, got {int((~np.isfinite(a)).sum())} NaN or infinite")
    return a


def _unit(x: Any, lo: float, hi: float) -> np.ndarray:
    """``x`` rescaled to ``[0, 1]`` after checking it lies in ``[lo, hi]``."""
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise DomainError(f"lo/hi: expected finite lo < hi, got lo={lo!r}, hi={hi!r}")
    a = _values(x)
    if a.min() < lo or a.max() > hi:
        raise DomainError(f"x: values must lie in [lo, hi] = [{lo!r}, {hi!r}], got [{a.min()!r}, {a.max()!r}]")
    return (a - lo) / (hi - lo)


@functools.lru_cache(maxsize=128)
def _orders(n: int) -> np.ndarray:
    """``[B, N]`` fixed orders: all of them when ``N! <= ORDERS``, else the identity and ``ORDERS - 1`` draws."""
    if math.factorial(n) <= ORDERS:
        return np.array(list(itertools.permutations(range(n))), dtype=np.intp).reshape(-1, n)
    rng = np.random.default_rng(_ORDER_SEED + n)
    return np.stack([np.arange(n)] + [rng.permutation(n) for _ in range(ORDERS - 1)])


def _plug_in_bets(y: np.ndarray, alpha: float) -> np.ndarray:
    """``[..., N]`` uncapped bets ``sqrt(2 log(1/alpha) / (N sigma2_{t-1}))`` from the running mean and variance."""
    n = y.shape[-1]
    t = np.arange(1.0, n + 1.0)
    work = np.zeros_like(y)
    np.cumsum(y[..., :-1], axis=-1, out=work[..., 1:])
    work += 0.5
    work /= t  # mu_{t-1} = (1/2 + sum_{i<t} y_i) / t
    np.subtract(y, work, out=work)
    np.square(work, out=work)  # (y_t - mu_{t-1})^2
    bets = np.zeros_like(y)
    np.cumsum(work[..., :-1], axis=-1, out=bets[..., 1:])
    bets += 0.25  # t sigma2_{t-1} = 1/4 + sum_{i<t} (y_i - mu_{i-1})^2
    np.divide(t * (2.0 * math.log(1.0 / alpha) / n), bets, out=bets)
    return np.sqrt(bets, out=bets)


def _log_capital(yp: np.ndarray, bets: np.ndarray, m: np.ndarray, cap: float) -> np.ndarray:
    """``log mean_b K^{pi_b}(m)`` for ordered data and bets ``[R, B, N]`` and candidates ``m`` ``[R]``."""
    mm = m[:, None, None]
    work = np.minimum(bets, cap / np.maximum(mm, 1e-300))
    work *= yp - mm
    np.log1p(work, out=work)
    return special.logsumexp(work.sum(axis=-1), axis=-1) - math.log(yp.shape[1])


def _chunks(y: np.ndarray) -> list[slice]:
    rows = max(1, _CHUNK // (ORDERS * y.shape[-1]))
    return [slice(i, i + rows) for i in range(0, y.shape[0], rows)]


def _evalue_unit(y: np.ndarray, m: np.ndarray, alpha: float, cap: float = BET_CAP) -> np.ndarray:
    """Log capital against ``mean <= m`` for ``y`` ``[R, N]`` in [0, 1] and ``m`` ``[R]``."""
    orders, out = _orders(y.shape[-1]), np.empty(y.shape[0])
    for s in _chunks(y):
        yp = y[s][:, orders]
        out[s] = _log_capital(yp, _plug_in_bets(yp, alpha), m[s], cap)
    return out


def _lower_unit(y: np.ndarray, alpha: float, cap: float = BET_CAP) -> np.ndarray:
    """Lower bound ``[R]`` on the mean of ``y`` ``[R, N]`` in [0, 1]: the largest rejected ``m`` found.

    Root of ``g(m) = log K(m) - log(1/alpha)`` (non-increasing) by false position with the Illinois
    step, safeguarded by a bisection step every third iteration, on the bracket ``[0, max y]``
    (``K(max y) <= 1``: never rejected); stops at width ``2^-40``. Returns the rejected end.
    """
    orders, threshold, out = _orders(y.shape[-1]), math.log(1.0 / alpha), np.zeros(y.shape[0])
    for s in _chunks(y):
        yp = y[s][:, orders]
        bets = _plug_in_bets(yp, alpha)

        def g(m: np.ndarray) -> np.ndarray:
            return _log_capital(yp, bets, m, cap) - threshold  # noqa: B023 (called within this iteration)

        low, high = np.zeros(yp.shape[0]), yp.max(axis=(1, 2))
        g_low, g_high = g(low), g(high)
        active = g_low >= 0.0  # else nothing above 0 is rejected: the bound is 0
        moved = np.zeros(yp.shape[0], dtype=np.int8)  # +1: low moved last, -1: high moved last
        for it in range(4 * _BISECTIONS):
            if not np.any(active & (high - low > 2.0**-_BISECTIONS)):
                break
            with np.errstate(divide="ignore", invalid="ignore"):
                m = (low * g_high - high * g_low) / (g_high - g_low)
            m = np.where((it % 3 == 2) | ~((m > low) & (m < high)), 0.5 * (low + high), m)
            gm = g(m)
            rejected = gm >= 0.0
            g_high = np.where(rejected & (moved == 1), 0.5 * g_high, g_high)  # Illinois: halve the stale end
            g_low = np.where(~rejected & (moved == -1), 0.5 * g_low, g_low)
            low, g_low = np.where(rejected, m, low), np.where(rejected, gm, g_low)
            high, g_high = np.where(rejected, high, m), np.where(rejected, g_high, gm)
            moved = np.where(rejected, 1, -1).astype(np.int8)
        out[s] = np.where(active, low, 0.0)
    return out


def _rows(y: np.ndarray) -> np.ndarray:
    return y.reshape(-1, y.shape[-1])


def mean_lower_bound(x: Any, *, lo: float, hi: float, alpha: float) -> Any:
    """Lower confidence bound on the mean, valid for every distribution on ``[lo, hi]`` (betting; module docstring).

    Args:
        x: ``[..., N]`` independent values in ``[lo, hi]``.
        lo, hi: the range every value can take.
        alpha: one-sided level, ``P(bound > mean) <= alpha``.

    Returns:
        ``[...]`` bounds (a float for 1-d ``x``), in ``[lo, max(x)]``.

    Raises:
        ShapeError: ``x`` is 0-d or has no values.
        DomainError: a value is NaN, infinite or outside the range; ``lo >= hi``; ``alpha`` outside (0, 1).

    Examples:
        >>> round(mean_lower_bound([1.0] * 10, lo=-1.0, hi=1.0, alpha=0.025), 4)  # -1 + 2 c / (40**0.1 - 1 + c)
        0.3372
        >>> mean_lower_bound([0.2, 0.2, 0.2], lo=-1.0, hi=1.0, alpha=0.025) < 0.0  # 3 seeds never clear 0 on [-1, 1]
        True
    """
    a = _alpha(alpha)
    y = _unit(x, lo, hi)
    return _out(lo + (hi - lo) * _lower_unit(_rows(y), a).reshape(y.shape[:-1]))


def mean_upper_bound(x: Any, *, lo: float, hi: float, alpha: float) -> Any:
    """Upper confidence bound on the mean: `mean_lower_bound` of ``1 - y`` reflected (``P(bound < mean) <= alpha``).

    Examples:
        >>> mean_upper_bound([-1.0] * 10, lo=-1.0, hi=1.0, alpha=0.025) == -mean_lower_bound([1.0] * 10, lo=-1.0, hi=1.0, alpha=0.025)
        True
    """
    a = _alpha(alpha)
    y = _unit(x, lo, hi)
    return _out(hi - (hi - lo) * _lower_unit(_rows(1.0 - y), a).reshape(y.shape[:-1]))


def mean_log_evalue(
    x: Any, null: Any, *, lo: float, hi: float, alpha: float, alternative: Literal["greater", "less"] = "greater"
) -> Any:
    """Log of the averaged betting capital against ``mean <= null`` (``alternative="greater"``) or ``mean >= null``.

    An e-value: its exponential has expectation at most 1 under the null. ``null`` broadcasts to
    ``x.shape[:-1]`` and lies in ``[lo, hi]``; ``alpha`` tunes the bets. Returns ``[...]``.
    """
    a = _alpha(alpha)
    y = _unit(x, lo, hi)
    m = (np.broadcast_to(np.asarray(null, dtype=np.float64), y.shape[:-1]) - lo) / (hi - lo)
    if not np.all((m >= 0.0) & (m <= 1.0)):
        raise DomainError(f"null: expected values in [lo, hi] = [{lo!r}, {hi!r}], got {null!r}")
    if alternative == "less":
        y, m = 1.0 - y, 1.0 - m
    elif alternative != "greater":
        raise DomainError(f"alternative: expected 'greater' or 'less', got {alternative!r}")
    return _out(_evalue_unit(_rows(y), m.reshape(-1), a).reshape(y.shape[:-1]))


# --- exact binomial bounds: shares, quantiles, the median ------------------------------------------------


def proportion_bounds(k: Any, n: Any, *, alpha: float) -> tuple[Any, Any]:
    """Clopper-Pearson one-sided bounds on a success probability from ``k`` successes in ``n`` trials.

    ``lower = Beta^{-1}(alpha; k, n - k + 1)`` (0 when ``k = 0``), ``upper = Beta^{-1}(1 - alpha; k + 1, n - k)``
    (1 when ``k = n``); each is exact: ``P(lower > p) <= alpha`` and ``P(upper < p) <= alpha`` for every ``p``.
    ``k`` and ``n`` broadcast. Raises `DomainError` unless ``0 <= k <= n`` are integers and ``n >= 1``.

    Examples:
        >>> [round(float(b), 4) for b in proportion_bounds(10, 10, alpha=0.025)]  # 0.025 ** (1 / 10)
        [0.6915, 1.0]
    """
    a = _alpha(alpha)
    kk, nn = np.broadcast_arrays(np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64))
    if not (np.all(kk == np.round(kk)) and np.all(nn >= 1) and np.all((kk >= 0) & (kk <= nn))):
        raise DomainError(f"k/n: expected integers 0 <= k <= n with n >= 1, got k={k!r}, n={n!r}")
    lower = np.where(kk > 0, stats.beta.ppf(a, np.maximum(kk, 1.0), nn - kk + 1.0), 0.0)
    upper = np.where(kk < nn, stats.beta.ppf(1.0 - a, kk + 1.0, np.maximum(nn - kk, 1.0)), 1.0)
    return _out(lower), _out(upper)


def share_bounds(x: Any, *, margin: float, alpha: float) -> tuple[Any, Any]:
    """Clopper-Pearson bounds on ``P(d > margin)`` from the seeds whose value clears ``margin``; ``x`` is ``[..., N]``.

    The quantile criterion "``P(d > margin) > f``" holds at level ``alpha`` when the lower bound exceeds ``f``.
    """
    a = _values(x)
    return proportion_bounds((a > margin).sum(axis=-1), a.shape[-1], alpha=alpha)


def _clearing_count(n: int, p: float, alpha: float) -> int:
    """Smallest ``r`` with ``P(Binomial(n, p) >= r) <= alpha`` (``n + 1`` when none)."""
    tail = stats.binom.sf(np.arange(n + 1) - 1, n, p)  # P(X >= r), r = 0..n
    ok = np.flatnonzero(tail <= alpha)
    return int(ok[0]) if ok.size else n + 1


def _share(share: float) -> float:
    if not 0.0 < share < 1.0:
        raise DomainError(f"share: expected a probability in (0, 1), got {share!r}")
    return float(share)


def quantile_lower_bound(x: Any, *, share: float, alpha: float) -> Any:
    """Lower bound ``L`` on the value exceeded with probability ``share``: ``P(L > q) <= alpha`` whenever ``P(d > q) <= share``.

    ``L`` is the ``r``-th largest value, ``r`` the smallest count with ``P(Binomial(N, share) >= r) <= alpha``
    (``-inf`` when no ``r <= N`` qualifies). Exact for any distribution of independent values.

    Examples:
        >>> quantile_lower_bound([3.0, 1.0, 2.0, 5.0, 4.0, 6.0], share=0.5, alpha=0.025)  # 6 seeds: the minimum
        1.0
    """
    a, s = _values(x), _share(share)
    n = a.shape[-1]
    r = _clearing_count(n, s, _alpha(alpha))
    if r > n:
        return _out(np.full(a.shape[:-1], -np.inf))
    return _out(np.sort(a, axis=-1)[..., n - r])


def quantile_upper_bound(x: Any, *, share: float, alpha: float) -> Any:
    """Upper bound ``U`` on the value exceeded with probability ``share``: ``P(U <= q) <= alpha`` whenever ``P(d <= q) <= 1 - share``.

    ``U`` is the ``r``-th smallest value, ``r`` the smallest count with ``P(Binomial(N, 1 - share) >= r) <= alpha``
    (``+inf`` when none qualifies).
    """
    a, s = _values(x), _share(share)
    n = a.shape[-1]
    r = _clearing_count(n, 1.0 - s, _alpha(alpha))
    if r > n:
        return _out(np.full(a.shape[:-1], np.inf))
    return _out(np.sort(a, axis=-1)[..., r - 1])


def location_lower_bound(x: Any, *, alpha: float) -> Any:
    """Lower bound on the median of unbounded values (`quantile_lower_bound` at share 1/2; `LOCATION_ASSUMPTION`).

    Examples:
        >>> location_lower_bound([0.3, -0.1, 0.2, 0.4, 0.1], alpha=0.025)  # 5 seeds: 1/32 > alpha
        -inf
    """
    return quantile_lower_bound(x, share=0.5, alpha=alpha)


def location_upper_bound(x: Any, *, alpha: float) -> Any:
    """Upper bound on the median of unbounded values (`quantile_upper_bound` at share 1/2)."""
    return quantile_upper_bound(x, share=0.5, alpha=alpha)


# --- power of the bounded-mean bound ------------------------------------------------------------------


def beta_sampler(*, lo: float, hi: float, sd: float) -> Sampler:
    """The default alternative: a Beta law on ``[lo, hi]`` with the requested mean and standard deviation ``sd``.

    With ``y`` the mean rescaled to [0, 1] and ``s = sd / (hi - lo)``: ``Beta(y k, (1 - y) k)``,
    ``k = y (1 - y) / s^2 - 1``; ``sd = 0`` is a point mass. Raises `DomainError` (naming ``sd``) when
    ``sd^2 >= (mean - lo)(hi - mean)``, the largest variance a law on the range with that mean can have.
    """
    if not sd >= 0.0:
        raise DomainError(f"sd: expected a standard deviation >= 0, got {sd!r}")

    def draw(rng: np.random.Generator, shape: tuple[int, ...], mean: float) -> np.ndarray:
        if sd == 0.0:
            return np.full(shape, float(mean))
        if not sd**2 < (mean - lo) * (hi - mean):
            raise DomainError(f"sd: {sd!r} is too large for a mean of {mean!r} on [{lo!r}, {hi!r}]")
        my, s = (mean - lo) / (hi - lo), sd / (hi - lo)
        k = my * (1.0 - my) / s**2 - 1.0
        return lo + (hi - lo) * rng.beta(my * k, (1.0 - my) * k, size=shape)

    return draw


def _sampler(lo: float, hi: float, sd: float | None, sampler: Sampler | None) -> Sampler:
    if sampler is not None and sd is None:
        return sampler
    if sampler is None and sd is not None:
        return beta_sampler(lo=lo, hi=hi, sd=float(sd))
    raise DomainError("sd/sampler: give exactly one of sd (Beta alternative) and sampler")


def _power_at(
    effect: float, n: int, lo: float, hi: float, margin: float, draw: Sampler, alpha: float, reps: int, seed: int
) -> float:
    mean = margin + effect
    if not lo <= mean <= hi:
        raise DomainError(f"effect: margin + effect = {mean!r} lies outside [lo, hi] = [{lo!r}, {hi!r}]")
    y = (np.asarray(draw(np.random.default_rng(seed), (reps, n), mean), dtype=np.float64) - lo) / (hi - lo)
    if not (y.shape == (reps, n) and y.min() >= -1e-12 and y.max() <= 1.0 + 1e-12):
        raise DomainError(f"sampler: expected draws of shape {(reps, n)} in [lo, hi] = [{lo!r}, {hi!r}]")
    y = np.clip(y, 0.0, 1.0)  # rounding at the ends of the range
    m = np.full(reps, (margin - lo) / (hi - lo))
    return float((_evalue_unit(y, m, alpha) >= math.log(1.0 / alpha)).mean())


def _check_plan(lo: float, hi: float, margin: float, alpha: float) -> float:
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise DomainError(f"lo/hi: expected finite lo < hi, got lo={lo!r}, hi={hi!r}")
    if not lo <= margin < hi:
        raise DomainError(f"margin: expected a value in [lo, hi), got {margin!r}")
    return _alpha(alpha)


def power(
    effect: float,
    n: int,
    *,
    lo: float,
    hi: float,
    margin: float,
    alpha: float,
    sd: float | None = None,
    sampler: Sampler | None = None,
    reps: int = 2000,
    seed: int = 0,
) -> float:
    """Probability that `mean_lower_bound` of ``n`` seeds clears ``margin`` when the true mean is ``margin + effect``.

    Monte Carlo over ``reps`` data sets (vectorised), drawn from `beta_sampler` with standard deviation
    ``sd`` or from ``sampler``; the Monte Carlo standard error is ``sqrt(p (1 - p) / reps)``.
    """
    a = _check_plan(lo, hi, margin, alpha)
    if n < 1:
        raise DomainError(f"n: expected at least one seed, got {n!r}")
    return _power_at(effect, int(n), lo, hi, margin, _sampler(lo, hi, sd, sampler), a, reps, seed)


def seeds_for_power(
    effect: float,
    *,
    lo: float,
    hi: float,
    margin: float,
    alpha: float,
    sd: float | None = None,
    sampler: Sampler | None = None,
    power: float = 0.8,
    reps: int = 2000,
    seed: int = 0,
    max_seeds: int = 10_000,
) -> int:
    """Smallest seed count at which `power` reaches ``power`` (doubling, then bisection on ``n``).

    ``sd`` (or ``sampler``) describes a pilot run on seeds separate from the evaluation seeds.
    Raises `DomainError` when even ``max_seeds`` falls short.
    """
    a, draw = _check_plan(lo, hi, margin, alpha), _sampler(lo, hi, sd, sampler)

    def enough(n: int) -> bool:
        return _power_at(effect, n, lo, hi, margin, draw, a, reps, seed) >= power

    low, high = 0, 1  # low: a count known to fall short (0 seeds always do)
    while not enough(high):
        if high >= max_seeds:
            raise DomainError(f"max_seeds: power {power} at effect {effect!r} needs more than {max_seeds} seeds")
        low, high = high, min(2 * high, max_seeds)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def min_detectable_effect(
    n: int,
    *,
    lo: float,
    hi: float,
    margin: float,
    alpha: float,
    sd: float | None = None,
    sampler: Sampler | None = None,
    power: float = 0.8,
    reps: int = 1000,
    seed: int = 0,
    rtol: float = 0.01,
) -> float:
    """Smallest effect over ``margin`` that ``n`` seeds detect with probability ``power``.

    A bracket around the normal approximation ``(z_{1-alpha} + z_{power}) sd / sqrt(n)``, widened until it
    holds, then bisection on the log of the effect to relative resolution ``rtol``. Returns ``inf`` when
    no effect the range allows (with the Beta alternative: that a law with standard deviation ``sd`` allows)
    reaches ``power``. With ``sd = 0`` it is the bound's floor at ``n``: the smallest noise-free effect
    that passes at all. Cost: ``reps * ORDERS * n`` capital factors per step, about ten steps.
    """
    a, draw = _check_plan(lo, hi, margin, alpha), _sampler(lo, hi, sd, sampler)
    top = hi - margin
    if sd is not None and sd > 0:  # the Beta law needs sd^2 < (mean - lo)(hi - mean)
        half = math.sqrt(max(0.0, 0.25 * (hi - lo) ** 2 - sd**2))
        top = min(top, (0.5 * (lo + hi) + half - margin) * (1.0 - 1e-9))
    reps = 1 if sd == 0 else reps  # a point mass: every draw is the same

    def enough(e: float) -> bool:
        try:
            return _power_at(e, int(n), lo, hi, margin, draw, a, reps, seed) >= power
        except DomainError:  # the alternative cannot have this mean with this spread
            return False

    if not (top > 0 and enough(top)):
        return math.inf
    z = stats.norm.ppf(1.0 - a) + stats.norm.ppf(power)
    guess = z * (sd if sd else 0.1 * (hi - lo)) / math.sqrt(n)
    high = min(top, guess)
    while not enough(high):
        high = min(top, 2.0 * high)
    low = 0.5 * high
    while enough(low):
        if low < 1e-9 * (hi - lo):
            return low
        low, high = 0.5 * low, low
    while high > low * (1.0 + rtol):
        mid = math.sqrt(low * high)
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high
