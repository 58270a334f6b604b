r"""Open-MOPD: budget allocation for multi-teacher on-policy distillation.

Rows carry an integer domain label ``domain [B]`` in ``[0, D)`` (string labels are mapped at the
config edge); each row is hard-routed to its domain's teacher (`route_teacher_logprobs`).
The dense reward is the top-k reverse-KL reward `topk_reverse_kl_reward`
(``[B, T, K]``, K = student top-k support). Three fixes of the budget:

- token-share balancing $w^{share}_d = g^\star_d / s_d$ (`token_share_weights`);
- gap-following $f_d = \mathrm{clip}((m_d/\bar m)^\alpha, 0.05, 20)$ (`gap_factors`);
- normalised row weights with token-weighted mean 1 (`mopd_domain_weights`), multiplying
  the advantage (never the mask), and the reward refresh before every inner update
  (`refreshed_reward`, no teacher call).

Reference: Gao et al. 2026, Open-MOPD (arXiv:2608.19098).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators._numerics import zero_off_mask
from posttrain.estimators.divergences.reverse_kl import topk_reverse_kl_reward
from posttrain.registry import Registry, registry
from posttrain.shapes import Bool, Float, Int
from posttrain.validate import (
    check_float,
    check_mask,
    check_tensor,
)

__all__ = [
    "ADVANTAGE_WEIGHTS",
    "domain_gap_magnitudes",
    "domain_token_counts",
    "gap_factors",
    "mopd_domain_weights",
    "refreshed_reward",
    "route_teacher_logprobs",
    "token_share_weights",
]


_PAPER = "Gao et al. 2026, Open-MOPD, arXiv:2608.19098"

ADVANTAGE_WEIGHTS: Registry[Any] = registry("advantage_weight")


def _check_domain(domain: Tensor, rows: int, n_domains: int) -> Tensor:
    check_tensor("domain", domain, ndim=1)
    if domain.is_floating_point() or domain.dtype == torch.bool:
        raise ShapeError(f"domain: expected an integer dtype, got {domain.dtype}")
    if domain.shape[0] != rows:
        raise ShapeError(f"domain: expected shape [{rows}], got {list(domain.shape)}")
    if bool(((domain < 0) | (domain >= n_domains)).any()):
        raise DomainError(
            f"domain: unknown label; expected ids in [0, {n_domains}), got {sorted(set(domain.tolist()))}"
        )
    return domain


def route_teacher_logprobs(
    logp_teachers: Float[Tensor, "D B T K"], domain: Int[Tensor, " B"]
) -> Float[Tensor, "B T K"]:
    """Hard routing: row b takes the log-probs of teacher ``domain[b]`` (one-hot; unknown labels raise).

    Examples:
        >>> lt = torch.stack([torch.zeros(2, 1, 1), torch.ones(2, 1, 1)])
        >>> route_teacher_logprobs(lt, torch.tensor([1, 0])).flatten().tolist()
        [1.0, 0.0]
    """
    check_float("logp_teachers", logp_teachers, ndim=4)
    _check_domain(domain, logp_teachers.shape[1], logp_teachers.shape[0])
    rows = torch.arange(domain.shape[0], device=domain.device)
    return logp_teachers[domain, rows]


def domain_token_counts(domain: Int[Tensor, " B"], mask: Bool[Tensor, "B T"], n_domains: int) -> Float[Tensor, " D"]:
    """Response tokens per domain, ``[D]`` (float).

    Examples:
        >>> m = torch.tensor([[True, True], [True, False], [True, False]])
        >>> domain_token_counts(torch.tensor([0, 1, 1]), m, 3).tolist()
        [2.0, 2.0, 0.0]
    """
    check_tensor("mask", mask, ndim=2)
    _check_domain(domain, mask.shape[0], n_domains)
    n_b = mask.sum(-1).to(torch.float64)
    return torch.zeros(n_domains, dtype=torch.float64, device=mask.device).index_add(0, domain, n_b)


def token_share_weights(
    domain: Int[Tensor, " B"], mask: Bool[Tensor, "B T"], targets: Float[Tensor, " D"]
) -> Float[Tensor, " D"]:
    r"""Per-domain token-share weights $w^{share}_d = g^\star_d / s_d$ (0 for absent domains).

    $s_d$ is domain d's share of the batch's response tokens; the targets are ratios,
    renormalised over the domains present in the batch (uniform when all present targets are 0).

    Args:
        domain: ``[B]`` domain ids. mask: ``[B, T]`` boolean. targets: ``[D]`` non-negative ratios.

    Returns:
        ``[D]`` float64 weights.

    Examples:
        >>> m = torch.tensor([[True, True, True], [True, False, False]])
        >>> token_share_weights(torch.tensor([0, 1]), m, torch.tensor([1.0, 1.0])).tolist()
        [0.6666666666666666, 2.0]
    """
    check_float("targets", targets, ndim=1)
    if bool((targets < 0).any()):
        raise DomainError(f"targets: expected non-negative ratios, got {targets.tolist()}")
    counts = domain_token_counts(domain, mask, targets.shape[0])
    present = counts > 0
    if not bool(present.any()):
        raise DomainError("mask: the batch has no response token")
    tgt = torch.where(present, targets.to(torch.float64), torch.zeros((), dtype=torch.float64))
    if not bool(tgt.sum() > 0):
        tgt = present.to(torch.float64)
    tgt = tgt / tgt.sum()
    share = counts / counts.sum()
    return torch.where(present, tgt / share.clamp(min=1e-300), torch.zeros((), dtype=torch.float64))


def domain_gap_magnitudes(
    reward: Float[Tensor, "B T K"], mask: Bool[Tensor, "B T"], domain: Int[Tensor, " B"], n_domains: int
) -> Float[Tensor, " D"]:
    r"""Mean absolute per-token reward per domain (0 if absent).

    $$
    m_d = \frac{\sum_{b\in d,t} m_{bt}\,|\sum_k r_{btk}|}{\sum_{b\in d,t} m_{bt}}
    $$

    Examples:
        >>> r = torch.tensor([[[-0.5, 0.1]], [[-0.2, 0.0]]])
        >>> m = torch.ones(2, 1, dtype=torch.bool)
        >>> [round(x, 4) for x in domain_gap_magnitudes(r, m, torch.tensor([0, 1]), 2).tolist()]
        [0.4, 0.2]
    """
    check_float("reward", reward, ndim=3)
    check_mask("mask", mask, reward.shape[:2])
    per_row = zero_off_mask(reward.sum(-1).abs(), mask).sum(-1).to(torch.float64)
    counts = domain_token_counts(domain, mask, n_domains)
    totals = torch.zeros(n_domains, dtype=torch.float64, device=reward.device).index_add(0, domain, per_row)
    return totals / counts.clamp(min=1.0)


def gap_factors(
    magnitudes: Float[Tensor, " D"],
    present: Bool[Tensor, " D"],
    *,
    alpha: float = 1.0,
    clip: tuple[float, float] = (0.05, 20.0),
    reference_weights: Float[Tensor, " D"] | None = None,
    eps: float = 1e-12,
) -> Float[Tensor, " D"]:
    r"""Gap-following factors $f_d = \mathrm{clip}((m_d/\bar m)^\alpha, f_{lo}, f_{hi})$ ("multiply" direction).

    $\bar m$ is the plain mean over present domains (the paper); pass
    ``reference_weights`` (e.g. the token-share weights) for the released code's weighted mean.
    Absent domains get factor 1 (they carry no rows); all magnitudes 0 gives factors 1. A present
    domain with magnitude 0 gets $\mathrm{clip}(0^\alpha) = f_{lo}$ for $\alpha > 0$
    (and 1 for $\alpha = 0$): the power is taken of the exact ratio, never of a floored one.

    Raises:
        DomainError: a negative magnitude (magnitudes are absolute gaps).

    Examples:
        >>> [round(x, 4) for x in gap_factors(torch.tensor([0.3, 0.1]), torch.tensor([True, True])).tolist()]
        [1.5, 0.5]
    """
    check_float("magnitudes", magnitudes, ndim=1)
    check_mask("present", present, magnitudes.shape)
    if magnitudes.numel() and bool((magnitudes < 0).any()):
        raise DomainError(f"magnitudes: expected non-negative gap magnitudes, got {magnitudes.tolist()}")
    m = magnitudes.to(torch.float64)
    wts = present.to(torch.float64) if reference_weights is None else reference_weights.to(torch.float64) * present
    m_bar = (wts * m).sum() / wts.sum().clamp(min=eps)
    # no floor on m_bar: the factors are scale invariant in the magnitudes (m_bar = 0 means every gap is 0)
    ratio = torch.where(m_bar > 0, m / torch.where(m_bar > 0, m_bar, torch.ones_like(m_bar)), torch.ones_like(m))
    f = ratio ** float(alpha)  # 0 ** alpha = 0 (alpha > 0), 1 (alpha = 0), inf (alpha < 0): the clip decides
    return torch.where(present, f.clamp(clip[0], clip[1]), torch.ones_like(f))


@ADVANTAGE_WEIGHTS.register("mopd_domain_weights", paper=_PAPER)
def mopd_domain_weights(
    domain: Int[Tensor, " B"],
    mask: Bool[Tensor, "B T"],
    reward: Float[Tensor, "B T K"],
    *,
    targets: Float[Tensor, " D"] | None,
    gap_alpha: float | None = 1.0,
    gap_reference: str = "mean",
) -> Float[Tensor, " B"]:
    r"""Open-MOPD row weights $w_b$, computed once per rollout batch.

    $$
    \tilde w_d = w^{share}_d f_d,\qquad w_b = \tilde w_{d(b)}\,\frac{\sum_b n_b}{\sum_b \tilde w_{d(b)} n_b}
    $$

    so the token-weighted mean of $w_b$ is 1. ``targets=None`` is naive M-OPD (all ones,
    no gap factor); ``gap_alpha=None`` is token-share only. ``gap_reference`` is ``"mean"``
    (paper) or ``"share_weighted"`` (released code). ``D`` is ``targets.shape[0]``.

    Examples:
        >>> m = torch.tensor([[True, True, True], [True, False, False]])
        >>> r = torch.full((2, 3, 1), -0.1)
        >>> w = mopd_domain_weights(torch.tensor([0, 1]), m, r, targets=torch.tensor([1.0, 1.0]))
        >>> [round(x, 4) for x in w.tolist()]
        [0.6667, 2.0]
    """
    check_tensor("mask", mask, ndim=2)
    if targets is None:
        return torch.ones(mask.shape[0], dtype=torch.float64, device=mask.device)
    n_dom = targets.shape[0]
    w_share = token_share_weights(domain, mask, targets)
    counts = domain_token_counts(domain, mask, n_dom)
    w = w_share
    if gap_alpha is not None:
        if gap_reference not in ("mean", "share_weighted"):
            raise DomainError(f"gap_reference: expected 'mean' or 'share_weighted', got {gap_reference!r}")
        ref = w_share if gap_reference == "share_weighted" else None
        mags = domain_gap_magnitudes(reward, mask, domain, n_dom)
        w = w_share * gap_factors(mags, counts > 0, alpha=gap_alpha, reference_weights=ref)
    n_b = mask.sum(-1).to(torch.float64)
    row_w = w[domain]
    return row_w * n_b.sum() / (row_w * n_b).sum().clamp(min=1e-300)


def refreshed_reward(
    logp_student_now_k: Float[Tensor, "B T K"],
    logp_teacher_k: Float[Tensor, "B T K"],
    mask: Bool[Tensor, "B T"],
    row_weights: Float[Tensor, " B"],
) -> Float[Tensor, "B T K"]:
    r"""Reward refresh: recompute $r$ from the current student and the cached teacher, times $w_b$.

    $$
    r_{t,k} \leftarrow \mathrm{sg}[(\ell^T_k - \ell^{S,now}_k)\,\mathrm{softmax}_k(\ell^{S,now})]\,w_{d(b)}
    $$

    No teacher forward: ``logp_teacher_k`` is the rollout-time cache. On the first (on-policy)
    mini-batch it equals the stored weighted reward.

    Examples:
        >>> ls = torch.log(torch.tensor([[[0.5, 0.5]]]))
        >>> [round(x, 4) for x in refreshed_reward(ls, ls, torch.tensor([[True]]), torch.ones(1)).flatten().tolist()]
        [0.0, 0.0]
    """
    reward = topk_reverse_kl_reward(logp_student_now_k, logp_teacher_k, mask)
    check_float("row_weights", row_weights, ndim=1)
    if row_weights.shape[0] != reward.shape[0]:
        raise ShapeError(f"row_weights: expected shape [{reward.shape[0]}], got {list(row_weights.shape)}")
    return reward * row_weights.detach().to(reward.dtype).reshape(-1, 1, 1)
