r"""GARL and PAFT: Monte-Carlo gradient estimators of the Tsallis loss $\ell_q(P) = -\ln_q P$.

Per prompt, M traces $z_m$ are sampled from the policy; each carries a detached weight
$w_m = p(y^*\mid x, z_m)$ given in log space as ``log_w [G, M]`` (verifier setting:
$\log r\in\{0,-\infty\}$; likelihood setting: the summed answer-token log-probs). With
$\bar w = \frac1M\sum_m w_m = \exp(\mathrm{logsumexp}(\log w) - \log M)$ and
$\rho_m = w_m/\bar w$ (so $\sum_m\rho_m = M$), everything is computed in these
normalised units, so tiny weights never underflow before they are combined:

- **GARL** (*reconstructed*, docs: methods/tsallis.md): trace weight
  $A_m = \bar w^{-q}(w_m - b_m) = \bar w^{1-q}\,\frac{M(\rho_m-1)}{M-1}$ with the RLOO baseline
  $b_m = \frac1{M-1}\sum_{j\ne m}w_j$ (``baseline="none"``: $\bar w^{1-q}\rho_m$; M = 1 uses
  b = 0), and answer-token (pathwise) weight $\bar w^{-q}w_m = \bar w^{1-q}\rho_m$.
- **PAFT** (*reconstructed*): resample S indices $m^*_s\sim\mathrm{Cat}(\rho/M)$ by inverse CDF
  from the given uniforms; every token of trace m gets weight $M\,\bar w^{1-q}c_m/S$
  ($c_m$ = times m was drawn), whose expectation over the resampling is GARL's b = 0 weight.

The per-token loss is $-\mathrm{weight}\cdot\log\pi$, zero off the masks. Reduce it with
``loss.sum() / (G * M)`` (``seq-mean-token-sum`` when no trace is empty): the surrogate of the paper's §3.5, whose gradient is $-\hat g$. A prompt with $\bar w = 0$ (no success, or underflow)
gets weight exactly 0, hence loss and gradient exactly 0, for every q in [0, 1]
($0^{-q}$ is never evaluated). Limits: q = 0 GARL is REINFORCE-RLOO on w; q = 1 GARL with
b = 0 is the self-normalised (IWAE) gradient $\sum_m \frac{w_m}{\sum_j w_j}\nabla\log[\pi p]$;
q = 1 PAFT is SFT on a posterior sample.

References:
    Lin & Ie 2026, "How Fast Should a Model Commit to Supervision? Training Reasoning Models on
    the Tsallis Loss Continuum", arXiv:2604.25907 (Algorithms 1 and 2; formulas reconstructed).
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators._numerics import computes_in_float32
from posttrain.estimators._registry import register_advantage
from posttrain.shapes import Bool, Float
from posttrain.validate import check_finite, check_float, check_in_range, check_mask, check_tensor, value_checks_enabled

__all__ = [
    "TsallisWeights",
    "garl_advantages",
    "garl_weights",
    "log_mean_weight",
    "paft_advantages",
    "paft_weights",
    "tsallis_token_weights",
]


_PAPER = "Lin & Ie 2026, Tsallis loss continuum, arXiv:2604.25907"


class TsallisWeights(NamedTuple):
    """Detached per-trace weights of GARL / PAFT and their diagnostics."""

    trace: Tensor
    """``[G, M]`` weight on each trace's token log-probs."""
    answer: Tensor
    """``[G, M]`` weight on each trace's answer-token log-probs (the pathwise term)."""
    log_w_bar: Tensor
    """``[G]`` $\\log\\bar w$ (``-inf`` where every weight is 0), after the optional clamp."""
    amplification: Tensor
    """``[G]`` the per-prompt factor applied: $\\bar w^{-q}$ (GARL) or $\\bar w^{1-q}$ (PAFT); 0 where $\\bar w=0$."""
    clamped: Tensor
    """``[G]`` bool, where $\\log\\bar w$ was raised to ``log_w_min``."""


def _check_log_w(log_w: Tensor, q: float) -> None:
    check_float("log_w", log_w, ndim=2)
    check_in_range("q", q, 0.0, 1.0)
    if log_w.shape[0] < 1 or log_w.shape[1] < 1:
        raise ShapeError(f"log_w: expected shape [G, M] with G, M >= 1, got {list(log_w.shape)}")
    if value_checks_enabled() and bool((torch.isnan(log_w) | (log_w == math.inf)).any()):
        raise DomainError("log_w: expected finite values or -inf (zero weight), found NaN or +inf")


def log_mean_weight(log_w: Float[Tensor, "G M"], *, log_w_min: float | None = None) -> tuple[Tensor, Tensor]:
    r"""$\log\bar w = \mathrm{logsumexp}_m \log w_m - \log M$ per prompt, optionally clamped below.

    Returns ``(log_w_bar [G], clamped [G])``; all-zero weights give ``-inf`` (never clamped). No
    gradient: the weights are stop-gradient factors of the surrogate (``log_w`` is detached).

    Examples:
        >>> lw, _ = log_mean_weight(torch.log(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])))
        >>> lw.exp().tolist()
        [0.5, 0.0]
    """
    check_float("log_w", log_w, ndim=2)
    lw = (torch.logsumexp(log_w.detach(), dim=-1) - math.log(log_w.shape[-1])).to(log_w.dtype)
    alive = lw > -math.inf
    if log_w_min is None:
        return lw, torch.zeros_like(alive)
    clamped = alive & (lw < log_w_min)
    return torch.where(clamped, torch.full_like(lw, float(log_w_min)), lw), clamped


def _normalised(log_w: Tensor, log_w_bar: Tensor, power: float) -> tuple[Tensor, Tensor]:
    """``(rho [G, M], wbar^power [G])`` with zeros (not NaN) where $\\bar w = 0$."""
    alive = log_w_bar > -math.inf
    zero = torch.zeros((), dtype=log_w.dtype, device=log_w.device)
    safe_bar = torch.where(alive, log_w_bar, zero)
    rho = torch.where(alive.unsqueeze(-1), torch.exp(log_w.detach() - safe_bar.unsqueeze(-1)), zero)
    return rho, torch.where(alive, torch.exp(power * safe_bar), zero)


def garl_weights(
    log_w: Float[Tensor, "G M"],
    *,
    q: float,
    baseline: Literal["rloo", "none"] = "rloo",
    log_w_min: float | None = None,
) -> TsallisWeights:
    r"""GARL trace and answer weights $\bar w^{-q}(w_m - b_m)$ and $\bar w^{-q} w_m$ (see module docstring).

    Args:
        log_w: ``[G, M]`` detached log-weights (``-inf`` = weight 0).
        q: Tsallis parameter in [0, 1]; q = 0 is RLVR/RLOO, q = 1 the marginal likelihood.
        baseline: ``"rloo"`` (leave-one-out mean of w; b = 0 when M = 1) or ``"none"``.
        log_w_min: optional lower clamp on $\log\bar w$ (e.g. ``log(1e-30)``).

    Returns:
        `TsallisWeights` (``amplification`` = $\bar w^{-q}$).

    Raises:
        ShapeError: ``log_w`` not a 2-d float tensor.
        DomainError: q outside [0, 1], NaN/+inf weights, bad baseline.

    Examples:
        >>> w = garl_weights(torch.log(torch.tensor([[1.0, 0.0, 0.0, 0.0]])), q=0.0)
        >>> [round(x, 4) for x in w.trace[0].tolist()]  # RLOO advantages of r = (1, 0, 0, 0)
        [1.0, -0.3333, -0.3333, -0.3333]
        >>> round(float(garl_weights(torch.log(torch.tensor([[1.0, 0.0, 0.0, 0.0]])), q=1.0).amplification[0]), 4)
        4.0
    """
    _check_log_w(log_w, q)
    if baseline not in ("rloo", "none"):
        raise DomainError(f"baseline: expected 'rloo' or 'none', got {baseline!r}")
    log_w_bar, clamped = log_mean_weight(log_w, log_w_min=log_w_min)
    rho, scale = _normalised(log_w, log_w_bar, 1.0 - q)
    m = log_w.shape[-1]
    answer = scale.unsqueeze(-1) * rho
    if baseline == "rloo" and m > 1:
        trace = scale.unsqueeze(-1) * (rho - 1.0) * (m / (m - 1))
    else:
        trace = answer
    amplification = _normalised(log_w, log_w_bar, -q)[1]
    return TsallisWeights(trace, answer, log_w_bar, amplification, clamped)


def paft_weights(
    log_w: Float[Tensor, "G M"], uniforms: Float[Tensor, "G S"], *, q: float, log_w_min: float | None = None
) -> TsallisWeights:
    r"""PAFT weights $M\,\bar w^{1-q} c_m / S$ from S posterior resamples drawn with ``uniforms``.

    Index $m^*_s$ is the smallest m with $\sum_{j\le m}\rho_j/M > u_s$ (with replacement);
    its expectation over uniform ``uniforms`` is GARL's b = 0 weight $\bar w^{-q}w_m$.

    Args:
        log_w: ``[G, M]`` detached log-weights.
        uniforms: ``[G, S]`` numbers in [0, 1] (at or above the total probability, 1 up to rounding,
            draws the last trace of positive weight), S >= 1 resamples per prompt.
        q: Tsallis parameter in [0, 1].
        log_w_min: optional lower clamp on $\log\bar w$.

    Returns:
        `TsallisWeights` with ``trace == answer`` and ``amplification`` = $\bar w^{1-q}$.

    Examples:
        >>> lw = torch.log(torch.tensor([[0.0, 1.0, 1.0, 0.0]]))
        >>> paft_weights(lw, torch.tensor([[0.1, 0.9]]), q=1.0).trace.tolist()  # one draw each of traces 1 and 2
        [[0.0, 2.0, 2.0, 0.0]]
    """
    _check_log_w(log_w, q)
    check_float("uniforms", uniforms, ndim=2)
    if uniforms.shape[0] != log_w.shape[0] or uniforms.shape[1] < 1:
        raise ShapeError(f"uniforms: expected shape [{log_w.shape[0]}, S>=1], got {list(uniforms.shape)}")
    check_finite("uniforms", uniforms)
    if value_checks_enabled() and bool((uniforms < 0).any()):
        raise DomainError("uniforms: expected numbers in [0, 1], found a negative one")
    log_w_bar, clamped = log_mean_weight(log_w, log_w_min=log_w_min)
    rho, scale = _normalised(log_w, log_w_bar, 1.0 - q)
    m, s = log_w.shape[-1], uniforms.shape[-1]
    cdf = (rho / m).cumsum(-1)  # [G, M]
    idx = (cdf.unsqueeze(-2) <= uniforms.to(cdf.dtype).unsqueeze(-1)).sum(-1)  # [G, S]
    last = (rho > 0).to(torch.long).cumsum(-1).argmax(-1, keepdim=True)  # guard against cdf[-1] < 1 by rounding
    idx = torch.minimum(idx, last)
    counts = torch.zeros_like(rho).scatter_add_(-1, idx, torch.ones_like(idx, dtype=rho.dtype))
    trace = scale.unsqueeze(-1) * counts * (m / s)
    return TsallisWeights(trace, trace, log_w_bar, scale, clamped)


def tsallis_token_weights(
    weights: TsallisWeights,
    mask: Bool[Tensor, "B T"],
    answer_mask: Bool[Tensor, "B T"] | None = None,
) -> Float[Tensor, "B T"]:
    r"""Per-token weights: each trace's weight on its ``mask`` tokens plus its answer weight on ``answer_mask``.

    $W_{bt} = \mathrm{trace}_b\,\mathbb 1[\mathrm{mask}_{bt}] + \mathrm{answer}_b\,\mathbb 1[\mathrm{answer\_mask}_{bt}]$,
    0 elsewhere, with row $b = gM + m$ (row-major over prompts and traces). The per-token loss is then
    `weighted_logp_loss` $-W\log\pi$.

    Args:
        weights: `TsallisWeights` of ``[G, M]`` (from `garl_weights` or `paft_weights`).
        mask: ``[B, T]`` trace tokens, ``B = G*M``.
        answer_mask: ``[B, T]`` answer tokens (likelihood setting), or None (verifier setting).

    Returns:
        ``[B, T]`` weights in the dtype of ``weights.trace``.

    Raises:
        ShapeError: ``mask`` rows differ from ``G*M`` or a mask of the wrong shape.

    Examples:
        >>> w = garl_weights(torch.log(torch.tensor([[1.0, 0.0]])), q=0.0)
        >>> tsallis_token_weights(w, torch.tensor([[True, False], [True, True]])).tolist()
        [[1.0, 0.0], [-1.0, -1.0]]
    """
    b = weights.trace.numel()
    m = check_tensor("mask", mask, ndim=2)
    check_mask("mask", m, tuple(m.shape))
    if m.shape[0] != b:
        raise ShapeError(f"mask: expected B = G*M = {b} rows (the size of log_w), got shape {list(mask.shape)}")
    zero = torch.zeros((), dtype=weights.trace.dtype, device=weights.trace.device)
    token_w = torch.where(mask, weights.trace.reshape(b, 1), zero)
    if answer_mask is not None:
        check_mask("answer_mask", answer_mask, tuple(mask.shape))
        token_w = token_w + torch.where(answer_mask, weights.answer.reshape(b, 1), zero)
    return token_w


def _log_rewards(rewards: Tensor) -> Tensor:
    check_float("rewards", rewards, ndim=2)
    check_finite("rewards", rewards)
    if value_checks_enabled() and bool((rewards < 0).any()):
        raise DomainError("rewards: GARL/PAFT weights must be >= 0")
    return torch.log(rewards)


@register_advantage("garl", paper=_PAPER)
@computes_in_float32
def garl_advantages(
    rewards: Float[Tensor, "G K"], *, q: float, baseline: Literal["rloo", "none"] = "rloo"
) -> Float[Tensor, "G K"]:
    r"""GARL trace weights for non-negative rewards (verifier setting, $w = r$): $\bar r^{-q}(r_k - b_k)$.

    Use with an on-policy REINFORCE surrogate and ``seq-mean-token-sum`` aggregation. No gradient
    (advantages are constants of the policy gradient).

    Examples:
        >>> garl_advantages(torch.tensor([[1.0, 0.0]]), q=1.0).tolist()  # (1/2)^{-1} * (r - b)
        [[2.0, -2.0]]
    """
    return garl_weights(_log_rewards(rewards), q=q, baseline=baseline).trace


@register_advantage("paft", paper=_PAPER)
@computes_in_float32
def paft_advantages(
    rewards: Float[Tensor, "G K"], uniforms: Float[Tensor, "G K"], *, q: float, samples: int = 1
) -> Float[Tensor, "G K"]:
    r"""PAFT weights for non-negative rewards, resampling ``samples`` traces with ``uniforms[:, :samples]``.

    ``uniforms`` is ``[G, S]`` with ``S >= samples``. No gradient (advantages are constants of the
    policy gradient).
    """
    check_float("uniforms", uniforms, ndim=2)
    if not 1 <= samples <= uniforms.shape[-1]:
        raise DomainError(f"samples: expected 1 <= samples <= {uniforms.shape[-1]}, got {samples}")
    return paft_weights(_log_rewards(rewards), uniforms[:, :samples], q=q).trace
