"""GFlowRL: trajectory balance with an in-batch Monte Carlo log-partition, and FlowRL's learned-log-Z baseline.

Both losses are per-sequence squared residuals. They return a ``[B, T]`` matrix holding each
sequence's loss divided by its length on its valid tokens, so that
``aggregate(loss, mask, "seq-mean-token-sum")`` is the mean over sequences of paper Eq. 8 (with
equal group sizes, $\\frac{1}{|\\mathcal P|}\\sum_x\\frac1G\\sum_i$). Sequences are ``B = G*K``
flat rows in row-major group order; rewards are ``[G, K]``.

References: Liu et al. 2026, "GFlowRL: Scaling Distribution-Matching RL to Large Language Models",
arXiv:2607.13394 (Eqs. 4-8); Zhu et al. 2025, FlowRL, arXiv:2509.15207.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import NamedTuple

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators._numerics import computes_in_float32, zero_off_mask
from posttrain.estimators._registry import register_policy_loss
from posttrain.estimators.advantages.group import group_normalized_advantages
from posttrain.estimators.aggregation import masked_mean, masked_sum
from posttrain.estimators.importance.ratios import LOG_RATIO_CLAMP
from posttrain.shapes import Bool, Float
from posttrain.validate import (
    check_finite,
    check_float,
    check_mask,
    check_nonempty_mask,
    check_positive,
    check_same_shape,
)

__all__ = [
    "FlowGap",
    "GFlowRLDiagnostics",
    "LengthNorm",
    "flow_gap",
    "flowrl_loss",
    "flowrl_optimal_log_z",
    "gflowrl_loss",
    "mc_log_partition",
]


class LengthNorm(str, Enum):
    """Where GFlowRL divides by the response length $L_i$ (docs: methods/gflowrl.md)."""

    PAPER = "paper"
    """Sum inside the log-partition (Eq. 4), per-token mean in the gap and residual (Eq. 6) as printed."""
    NORMALIZED = "normalized"
    """Per-token means everywhere: fixed point tempered by $|y|$."""
    CPRIME = "cprime"
    """No normalisation: the exact fixed point $\\pi \\propto \\pi_{ref} e^{\\beta r}$ (Prop. B.1)."""

    @classmethod
    def parse(cls, v: LengthNorm | str) -> LengthNorm:
        try:
            return cls(v)
        except ValueError:
            raise DomainError(
                f"variant: unknown length normalisation {v!r}; valid: paper, normalized, cprime"
            ) from None


class FlowGap(NamedTuple):
    """Per-sequence flow gaps of one batch (no gradient)."""

    gap: Tensor
    """``[G, K]`` $g_i$ before clipping (0 on empty responses)."""
    clipped_gap: Tensor
    """``[G, K]`` $\\tilde g_i = \\mathrm{clip}(g_i, -\\text{max\\_up}, \\text{max\\_down})$."""
    log_partition: Tensor
    """``[G]`` the in-batch estimate $\\mathcal Z_t(x)$."""
    lengths: Tensor
    """``[G, K]`` $L_i$ (number of valid tokens), as the float dtype."""
    valid: Tensor
    """``[G, K]`` boolean, $L_i > 0$."""


class GFlowRLDiagnostics(NamedTuple):
    """Diagnostics (no gradient) of `gflowrl_loss` / `flowrl_loss`."""

    sequence_loss: Tensor
    """``[G, K]`` per-sequence loss $w_i(\\cdot)^2$ (0 on empty responses)."""
    log_partition: Tensor
    """``[G]`` log-partition used (in-batch estimate, or the learned $\\log Z_\\phi$)."""
    clip_frac: Tensor
    """0-d fraction of valid sequences whose flow gap (GFlowRL) or IS weight (FlowRL) is clipped."""
    is_weight_mean: Tensor
    """0-d mean importance weight over valid sequences."""


def mc_log_partition(scores: Float[Tensor, "G K"], valid: Bool[Tensor, "G K"] | None = None) -> Float[Tensor, " G"]:
    r"""In-batch Monte Carlo log-partition (paper Eq. 4): the group mean of per-sample log-weights.

    $$
    \mathcal Z_t(x) = \frac{1}{|\{i\}|}\sum_{i\in x} s_i,\qquad
                  s_i = \beta r_i + \log\pi_{ref}(y_i|x) - \log\pi_{old}(y_i|x)
    $$

    With $y_i\sim\pi_{old}$, $\mathbb E[\mathcal Z_t] = \log Z - \mathrm{KL}(\pi_{old}\|p^\star)
    \le \log Z$ (equality iff $\pi_{old} = p^\star$, where every $s_i = \log Z$) and its
    variance is $O(1/K)$. Detached (a stop-gradient baseline). Groups with no valid sample give 0;
    a batch with none at all is an error.

    Args:
        scores: ``[G, K]`` per-sample log-weights $s_i$.
        valid: optional ``[G, K]`` boolean; invalid samples (empty responses) are excluded.

    Returns:
        ``[G]`` estimates.

    Examples:
        >>> mc_log_partition(torch.tensor([[1.0, 3.0, 8.0]]), torch.tensor([[True, True, False]])).tolist()
        [2.0]
    """
    check_float("scores", scores, ndim=2)
    if valid is None:
        return scores.detach().mean(dim=-1)
    check_mask("valid", valid, scores.shape)
    check_nonempty_mask("valid", valid)
    return masked_mean(scores.detach(), valid, dim=-1)


def _grouped_sums(
    name: str, rewards: Tensor, mask: Tensor, **token_tensors: Tensor
) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """Validate and return per-sequence sums ``[G, K]`` of each token tensor, lengths and validity."""
    check_float(name, rewards, ndim=2)
    check_finite(name, rewards)
    g, k = rewards.shape
    first_name, first = next(iter(token_tensors.items()))
    check_float(first_name, first, ndim=2)
    if first.shape[0] != g * k:
        raise ShapeError(
            f"{first_name}: expected {g * k} rows (G*K from {name} {list(rewards.shape)}), got {first.shape[0]}"
        )
    check_same_shape(first_name, first, **{n: t for n, t in token_tensors.items() if n != first_name})
    check_mask("mask", mask, first.shape)
    check_nonempty_mask("mask", mask)
    sums = {}
    for n, t in token_tensors.items():
        check_float(n, t)
        check_finite(n, t.detach(), mask)
        sums[n] = masked_sum(t, mask, dim=-1).reshape(g, k)
    lengths = mask.sum(dim=-1).reshape(g, k)
    return sums, lengths.to(first.dtype), lengths > 0


def flow_gap(
    rewards: Float[Tensor, "G K"],
    logp_old: Float[Tensor, "B T"],
    logp_ref: Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    beta: float = 8.0,
    variant: LengthNorm | str = LengthNorm.PAPER,
    max_up: float = 0.2,
    max_down: float = 0.28,
) -> FlowGap:
    r"""Flow gaps at the rollout policy (paper Eqs. 4, 6, 7), computed once per group, no gradient.

    With $S^{old}_i, S^{ref}_i$ the masked sums of ``logp_old``, ``logp_ref`` over response
    $i$, $L_i$ its length and $d_i = S^{ref}_i - S^{old}_i$:

    $$
    \mathcal Z_t = \mathrm{mean}_{i\in x}\big(\beta r_i + d_i/\lambda^{Z}_i\big),\qquad
    g_i = \mathcal Z_t - \beta r_i - d_i/\lambda^{g}_i,\qquad
    \tilde g_i = \mathrm{clip}(g_i, -\text{max\_up}, +\text{max\_down})
    $$

    with $(\lambda^Z, \lambda^g) = (1, L)$ for ``paper``, $(L, L)$ for ``normalized``
    and $(1, 1)$ for ``cprime``. The loss pushes $\delta_i$ toward $-\tilde g_i$,
    so ``max_up`` bounds the increase of a response's log-probability and ``max_down`` its
    decrease; the defaults (0.2 up, 0.28 down) are Eq. 7 as printed, $\mathrm{clip}(g,
    -\epsilon_{low}, \epsilon_{high})$ (the paper's prose suggests the swapped bounds; see docs: methods/gflowrl.md,
    section 10.1). In ``cprime``/``normalized`` the unclipped gaps of a group sum to zero.

    Args:
        rewards: ``[G, K]`` raw rewards. logp_old, logp_ref: ``[B, T]`` (B = G*K) behaviour and
            reference log-probs. mask: ``[B, T]`` policy-token mask (empty rows are excluded).
        beta: inverse temperature $\beta > 0$. variant: a `LengthNorm`.
        max_up, max_down: clip bounds, >= 0.

    Returns:
        `FlowGap`.

    Raises:
        ShapeError: wrong shapes or dtypes.
        DomainError: bad hyperparameters, non-finite values.

    Examples:
        >>> r = torch.tensor([[1.0, 0.0]]); z = torch.zeros(2, 1); m = torch.ones(2, 1, dtype=torch.bool)
        >>> fg = flow_gap(r, z, z, m, beta=0.2)
        >>> fg.gap.tolist(), fg.log_partition.tolist()
        ([[-0.10000000149011612, 0.10000000149011612]], [0.10000000149011612])
    """
    beta = check_positive("beta", beta)
    max_up = check_positive("max_up", max_up, strict=False)
    max_down = check_positive("max_down", max_down, strict=False)
    v = LengthNorm.parse(variant)
    sums, lengths, valid = _grouped_sums("rewards", rewards, mask, logp_old=logp_old, logp_ref=logp_ref)
    with torch.no_grad():
        d = (sums["logp_ref"] - sums["logp_old"]).detach()
        d_mean = d / lengths.clamp(min=1)
        br = beta * rewards.detach()
        log_z = mc_log_partition(br + (d_mean if v is LengthNorm.NORMALIZED else d), valid)
        g = log_z.unsqueeze(-1) - br - (d if v is LengthNorm.CPRIME else d_mean)
        g = zero_off_mask(g, valid)
        g_clip = g.clamp(-max_up, max_down)
    return FlowGap(g, g_clip, log_z, lengths, valid)


def _spread_over_tokens(seq_loss: Tensor, lengths: Tensor, valid: Tensor, mask: Tensor) -> Tensor:
    """``[G, K]`` per-sequence losses -> ``[B, T]``: loss / L on each valid token (0 elsewhere)."""
    per_token = zero_off_mask(seq_loss / lengths.clamp(min=1), valid)
    return zero_off_mask(per_token.reshape(-1, 1).expand(mask.shape), mask)


@register_policy_loss("gflowrl", paper="Liu et al. 2026, GFlowRL, arXiv:2607.13394")
@computes_in_float32
def gflowrl_loss(
    logp: Float[Tensor, "B T"],
    logp_old: Float[Tensor, "B T"],
    logp_ref: Float[Tensor, "B T"],
    rewards: Float[Tensor, "G K"],
    mask: Bool[Tensor, "B T"],
    *,
    beta: float = 8.0,
    variant: LengthNorm | str = LengthNorm.PAPER,
    max_up: float = 0.2,
    max_down: float = 0.28,
    is_cap: float = 2.0,
    geometric_ratio: bool = True,
    gap: FlowGap | None = None,
) -> tuple[Float[Tensor, "B T"], GFlowRLDiagnostics]:
    r"""GFlowRL trajectory-balance loss with drift correction and flow-gap clipping (paper Eq. 8).

    $$
    \delta_i = (S_i - S^{old}_i)/\lambda_i,\qquad
    w_i = \mathrm{sg}\big(\min(\rho_i, 1+\epsilon_{IS})\big),\qquad
    \mathcal L_i = w_i\,(\tilde g_i + \delta_i)^2
    $$

    with $\tilde g_i$ from `flow_gap`, $\lambda_i = L_i$ (``paper``,
    ``normalized``) or 1 (``cprime``), and $\rho_i = e^{(S_i - S^{old}_i)/L_i}$ (geometric,
    default) or $e^{S_i - S^{old}_i}$. At $\theta = \theta_{old}$ the gradient is a policy
    gradient with per-sequence advantage $-2\tilde g_i/\lambda_i$. Compute ``gap`` once over
    whole groups before micro-batching and pass it in; otherwise it is computed here.

    Args:
        logp: ``[B, T]`` current log-probs (gradient). logp_old, logp_ref: ``[B, T]`` no gradient.
        rewards: ``[G, K]`` raw rewards (B = G*K). mask: ``[B, T]`` policy-token mask.
        beta, variant, max_up, max_down: see `flow_gap`. is_cap: $1+\epsilon_{IS} > 0$.
        geometric_ratio: length-normalised (True) or literal sequence IS ratio.
        gap: precomputed `FlowGap` for these rows.

    Returns:
        ``(loss [B, T], GFlowRLDiagnostics)``; aggregate with ``seq-mean-token-sum`` for Eq. 8.

    References:
        Liu et al. 2026 (arXiv:2607.13394); Malkin et al. 2022, trajectory balance (arXiv:2201.13259).

    Examples:
        >>> r = torch.tensor([[1.0, 0.0]]); z = torch.zeros(2, 1); m = torch.ones(2, 1, dtype=torch.bool)
        >>> loss, d = gflowrl_loss(z, z, z, r, m, beta=0.2)
        >>> [round(x, 4) for x in d.sequence_loss[0].tolist()]
        [0.01, 0.01]
    """
    is_cap = check_positive("is_cap", is_cap)
    v = LengthNorm.parse(variant)
    if gap is None:
        gap = flow_gap(rewards, logp_old, logp_ref, mask, beta=beta, variant=v, max_up=max_up, max_down=max_down)
    sums, lengths, valid = _grouped_sums("rewards", rewards, mask, logp=logp, logp_old=logp_old)
    if gap.gap.shape != rewards.shape:
        raise ShapeError(f"gap: expected flow gaps of shape {list(rewards.shape)}, got {list(gap.gap.shape)}")
    diff = sums["logp"] - sums["logp_old"].detach()
    mean_diff = diff / lengths.clamp(min=1)
    delta = diff if v is LengthNorm.CPRIME else mean_diff
    log_rho = (mean_diff if geometric_ratio else diff).detach()
    weight = torch.exp(log_rho.clamp(max=math.log(is_cap)))
    seq_loss = weight * (gap.clipped_gap + delta) ** 2
    seq_loss = zero_off_mask(seq_loss, valid)
    with torch.no_grad():
        clipped = (gap.clipped_gap != gap.gap) & valid
        diag = GFlowRLDiagnostics(
            seq_loss.detach(),
            gap.log_partition,
            masked_mean(clipped.to(seq_loss.dtype), valid),
            masked_mean(weight, valid),
        )
    return _spread_over_tokens(seq_loss, lengths, valid, mask), diag


class _FlowRLTerms(NamedTuple):
    offset: Tensor  # [G, K] (S - S_ref)/L - beta r_hat: the residual without log Z (gradient via logp)
    weight: Tensor  # [G, K] clipped sequence IS weight (detached)
    raw: Tensor  # [G, K] unclipped sequence IS ratio (detached)
    lengths: Tensor
    valid: Tensor


def _check_flowrl_options(beta: float, clip: float) -> tuple[float, float]:
    """FlowRL's hyperparameters: ``beta > 0`` and the IS clip ``clip`` in (0, 1); returned as floats."""
    beta = check_positive("beta", beta)
    clip = check_positive("clip", clip)
    if clip >= 1.0:
        raise DomainError(f"clip: expected a value in (0, 1), got {clip!r}")
    return beta, clip


def _flowrl_terms(
    logp: Tensor,
    logp_old: Tensor,
    logp_ref: Tensor,
    rewards: Tensor,
    mask: Tensor,
    *,
    beta: float,
    clip: float,
    r_hat: Tensor | None,
) -> _FlowRLTerms:
    """Validate FlowRL's inputs and compute the per-sequence terms shared by the loss and the optimal log Z."""
    beta, clip = _check_flowrl_options(beta, clip)
    sums, lengths, valid = _grouped_sums("rewards", rewards, mask, logp=logp, logp_old=logp_old, logp_ref=logp_ref)
    if r_hat is None:
        r_hat = group_normalized_advantages(rewards.detach())
    else:
        check_float("r_hat", r_hat, ndim=2)
        check_same_shape("rewards", rewards, r_hat=r_hat)
        check_finite("r_hat", r_hat)
    offset = (sums["logp"] - sums["logp_ref"].detach()) / lengths.clamp(min=1) - beta * r_hat.detach()
    raw = torch.exp((sums["logp"] - sums["logp_old"]).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return _FlowRLTerms(offset, raw.clamp(1.0 - clip, 1.0 + clip), raw, lengths, valid)


@register_policy_loss("flowrl", paper="Zhu et al. 2025, FlowRL, arXiv:2509.15207")
@computes_in_float32
def flowrl_loss(
    logp: Float[Tensor, "B T"],
    logp_old: Float[Tensor, "B T"],
    logp_ref: Float[Tensor, "B T"],
    rewards: Float[Tensor, "G K"],
    mask: Bool[Tensor, "B T"],
    log_z: Float[Tensor, " G"],
    *,
    beta: float = 15.0,
    clip: float = 0.2,
    r_hat: Float[Tensor, "G K"] | None = None,
) -> tuple[Float[Tensor, "B T"], GFlowRLDiagnostics]:
    r"""FlowRL's trajectory-balance loss with a learned log-partition (the GFlowRL baseline).

    $$
    \Delta_i = \log Z_\phi(x) + \frac{S_i - S^{ref}_i}{L_i} - \beta\hat r_i,\qquad
    w_i = \mathrm{sg}\big(\mathrm{clip}(e^{S_i - S^{old}_i}, 1-\epsilon, 1+\epsilon)\big),\qquad
    \mathcal L_i = w_i\Delta_i^2
    $$

    with $\hat r$ the group z-scored reward (`group_normalized_advantages`). Gradients
    flow into both ``logp`` and ``log_z``; the ``log_z`` minimising the batch's loss is
    `flowrl_optimal_log_z`.

    Args:
        logp, logp_old, logp_ref: ``[B, T]``. rewards: ``[G, K]``. mask: ``[B, T]``.
        log_z: ``[G]`` learned log-partition per prompt (carries gradient).
        beta: reward scale (FlowRL: 15). clip: $\epsilon \in (0, 1)$.
        r_hat: optional ``[G, K]`` precomputed $\hat r$ (z-scored over whole groups before
            micro-batching); ``rewards`` then only gives the shape.

    Returns:
        ``(loss [B, T], GFlowRLDiagnostics)``; aggregate with ``seq-mean-token-sum``.

    References:
        Zhu et al. 2025, FlowRL (arXiv:2509.15207).

    Examples:
        >>> z = torch.zeros(2, 1); m = torch.ones(2, 1, dtype=torch.bool)
        >>> _, d = flowrl_loss(z, z, z, torch.tensor([[1.0, 0.0]]), m, torch.zeros(1), beta=1.0)
        >>> [round(x, 3) for x in d.sequence_loss[0].tolist()]
        [0.5, 0.5]
    """
    terms = _flowrl_terms(logp, logp_old, logp_ref, rewards, mask, beta=beta, clip=clip, r_hat=r_hat)
    check_float("log_z", log_z, ndim=1)
    if log_z.shape[0] != rewards.shape[0]:
        raise ShapeError(f"log_z: expected shape [{rewards.shape[0]}], got {list(log_z.shape)}")
    check_finite("log_z", log_z)
    residual = log_z.unsqueeze(-1) + terms.offset
    seq_loss = zero_off_mask(terms.weight * residual**2, terms.valid)
    with torch.no_grad():
        diag = GFlowRLDiagnostics(
            seq_loss.detach(),
            log_z.detach(),
            masked_mean((terms.raw != terms.weight).to(terms.raw.dtype), terms.valid),
            masked_mean(terms.weight, terms.valid),
        )
    return _spread_over_tokens(seq_loss, terms.lengths, terms.valid, mask), diag


def flowrl_optimal_log_z(
    logp: Float[Tensor, "B T"],
    logp_old: Float[Tensor, "B T"],
    logp_ref: Float[Tensor, "B T"],
    rewards: Float[Tensor, "G K"],
    mask: Bool[Tensor, "B T"],
    *,
    beta: float = 15.0,
    clip: float = 0.2,
    r_hat: Float[Tensor, "G K"] | None = None,
) -> Float[Tensor, " G"]:
    r"""The per-prompt $\log Z$ that minimises `flowrl_loss` on this batch (no gradient).

    $\sum_i w_i\Delta_i^2$ is a convex quadratic in $\log Z(x)$, minimised at the
    weighted mean

    $$
    \log Z^\star(x) = \frac{\sum_{i\in x} w_i\big(\beta\hat r_i - (S_i - S^{ref}_i)/L_i\big)}{\sum_{i\in x} w_i}
    $$

    (valid responses only; 0 for a group without one). At $\theta = \theta_{old}$ (all
    $w_i = 1$) this is GFlowRL's in-batch estimate `mc_log_partition` of
    $\beta\hat r_i + (S^{ref}_i - S^{old}_i)/L_i$ (the ``normalized`` variant): the learned
    $\log Z_\phi$ of FlowRL chases what GFlowRL computes in closed form.

    Args: as `flowrl_loss` (without ``log_z``).

    Returns:
        ``[G]`` optimal log-partitions.

    Examples:
        >>> lp = torch.tensor([[-1.0], [-2.0]]); m = torch.ones(2, 1, dtype=torch.bool)  # r_hat = +-0.7071
        >>> flowrl_optimal_log_z(lp, lp, torch.zeros(2, 1), torch.tensor([[1.0, 0.0]]), m, beta=1.0).tolist()
        [1.5]
    """
    with torch.no_grad():
        t = _flowrl_terms(logp, logp_old, logp_ref, rewards, mask, beta=beta, clip=clip, r_hat=r_hat)
        w = zero_off_mask(t.weight, t.valid)
        return -(w * t.offset.detach()).sum(-1) / w.sum(-1).clamp(min=torch.finfo(w.dtype).tiny)
