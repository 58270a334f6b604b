r"""OraRL: an annotation as one oracle rollout per GRPO group, without advantage inversion.

Per group: ``n`` policy rewards ``rewards [G, n]`` and the oracle's reward ``oracle_reward [G]``
(the annotation scored by the same reward). Group-level tensors with the oracle use ``[G, n+1]``
with the oracle in the **last** column. Five stages (docs: methods/orarl.md; constants are the released
code's defaults):

1. oracle-free raw-centred baseline $c_i = r_i - \mu_\pi$;
2. directional gain $g=\mathrm{clip}((\sigma_{all}/(\sigma_\pi+\epsilon))^\gamma,1,4)$ on positive
   $c_i$, then re-centring (`orarl_policy_advantages`);
3. detached, capped oracle advantage (`orarl_oracle_advantage`);
4. sign-balanced selection of K rows: oracle + $q^+$ positives + $q^-$ negatives
   (`sign_balanced_selection`);
5. post-selection centring, oracle sign projection, RMS match (`post_selection_correction`).

`naive_injection_advantages` is the baseline that puts the oracle inside the GRPO
statistics, and `inversion_rate` measures the inversion it causes.

Reference: Li, Mu, Li, Qian, Zhang, Hou, Cheng 2026, Annotations as Rollouts (arXiv:2608.20492).
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators._numerics import computes_in_float32
from posttrain.estimators._registry import register_advantage
from posttrain.estimators.advantages.group import group_normalized_advantages
from posttrain.shapes import Bool, Float
from posttrain.validate import check_choice, check_finite, check_float, check_mask, check_positive

__all__ = [
    "OraRLAdvantages",
    "OracleMode",
    "naive_injection_advantages",
    "orarl_advantages",
    "orarl_oracle_advantage",
    "orarl_policy_advantages",
    "post_selection_correction",
    "sign_balanced_selection",
]


_PAPER = "Li et al. 2026, Annotations as Rollouts (OraRL), arXiv:2608.20492"


class OracleMode(str, Enum):
    """How the oracle row's advantage is formed."""

    DETACHED = "detached"
    """Stage 3: $\\min(\\kappa w, \\text{cap})$ (OraRL)."""
    GAP = "gap"
    """Ablation "w/o detached oracle": $A^\\star = r^\\star - \\mu_\\pi$, uncapped."""


class OraRLAdvantages(NamedTuple):
    """Output of `orarl_advantages` (no gradient anywhere)."""

    advantages: Tensor
    """``[G, n+1]`` final row advantages; dropped rows are 0; oracle last."""
    keep: Tensor
    """``[G, n+1]`` boolean rows that enter the update."""
    gain: Tensor
    """``[G]`` directional gain g."""
    flips: Tensor
    """``[G]`` number of kept policy rows whose final sign differs from $\\operatorname{sign}(c_i)$ (c_i != 0)."""


def _check_group(rewards: Tensor, oracle_reward: Tensor) -> None:
    check_float("rewards", rewards, ndim=2)
    check_float("oracle_reward", oracle_reward, ndim=1)
    if oracle_reward.shape[0] != rewards.shape[0] or rewards.shape[1] < 1:
        raise ShapeError(
            f"oracle_reward: expected shape [{rewards.shape[0]}] with rewards [G, n >= 1], "
            f"got {list(oracle_reward.shape)} and {list(rewards.shape)}"
        )
    check_finite("rewards", rewards)
    check_finite("oracle_reward", oracle_reward)


def _std(x: Tensor) -> Tensor:
    """Unbiased std over the last axis; 0 for fewer than 2 values."""
    if x.shape[-1] < 2:
        return torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    return x.std(dim=-1, correction=1)


def orarl_policy_advantages(
    rewards: Float[Tensor, "G n"],
    oracle_reward: Float[Tensor, " G"],
    *,
    gamma: float = 0.25,
    gain_max: float = 4.0,
    eps: float = 1e-6,
) -> tuple[Float[Tensor, "G n"], Float[Tensor, " G"]]:
    r"""Stages 1-2: oracle-free baseline, positive-only directional gain, re-centring.

    $$
    c_i = r_i - \mu_\pi,\quad g = \mathrm{clip}((\sigma_{all}/(\sigma_\pi+\epsilon))^\gamma, 1, g_{max}),
                  \quad \hat c_i = g c_i\,[c_i>0] + c_i\,[c_i\le0],\quad A_i = \hat c_i - \overline{\hat c}
    $$

    $\sigma_{all}$ is the unbiased std of the n policy rewards and $r^\star$;
    $\sigma_\pi$ that of the policy rewards. $r^\star$ enters only through g.

    Returns:
        ``(A [G, n], g [G])``, detached.

    Examples:
        >>> a, g = orarl_policy_advantages(torch.tensor([[0.2] * 7 + [0.28]]), torch.tensor([1.0]))
        >>> round(float(g), 3), round(float(a[0, 7]), 4)
        (1.749, 0.1159)
    """
    _check_group(rewards, oracle_reward)
    gamma = check_positive("gamma", gamma, strict=False)
    r = rewards.detach()
    c = r - r.mean(-1, keepdim=True)
    sigma_all = _std(torch.cat([r, oracle_reward.detach().unsqueeze(-1)], dim=-1))
    sigma_pi = _std(r)
    g = ((sigma_all / (sigma_pi + eps)) ** gamma).clamp(1.0, float(gain_max))
    c_hat = torch.where(c > 0, g.unsqueeze(-1) * c, c)
    return c_hat - c_hat.mean(-1, keepdim=True), g


def orarl_oracle_advantage(
    rewards: Float[Tensor, "G n"],
    oracle_reward: Float[Tensor, " G"],
    policy_advantages: Float[Tensor, "G n"],
    *,
    kappa: float = 2.0,
    beta: float = 2.0,
    rho: float = 1.2,
    cap_low: float = 0.05,
    cap_high: float = 1.0,
    eps: float = 1e-6,
) -> Float[Tensor, " G"]:
    r"""Stage 3: the detached, capped oracle advantage.

    $$
    w = \mathrm{clip}\Big(\frac{r^\star-\mu_\pi}{r^\star+\epsilon}, 0, 1\Big)^\beta,\quad
                  \text{cap} = \begin{cases}\mathrm{clip}(\rho A^+_{max}, m_{lo}, m_{hi}) & \exists A_i>0\\
                  m_{lo} & \text{else}\end{cases},\quad
                  A^\star = \mathrm{sg}[\min(\kappa w, \text{cap})]
    $$

    Examples:
        >>> round(float(orarl_oracle_advantage(torch.zeros(1, 8), torch.ones(1), torch.zeros(1, 8))), 4)
        0.05
    """
    _check_group(rewards, oracle_reward)
    check_float("policy_advantages", policy_advantages)
    if policy_advantages.shape != rewards.shape:
        raise ShapeError(
            f"policy_advantages: expected shape {list(rewards.shape)}, got {list(policy_advantages.shape)}"
        )
    r_star = oracle_reward.detach()
    mu = rewards.detach().mean(-1)
    w = ((r_star - mu) / (r_star + eps)).clamp(0.0, 1.0) ** float(beta)
    adv = policy_advantages.detach()
    has_pos = (adv > 0).any(-1)
    a_max = adv.max(-1).values
    cap = torch.where(has_pos, (float(rho) * a_max).clamp(cap_low, cap_high), torch.full_like(a_max, cap_low))
    return torch.minimum(float(kappa) * w, cap)


def sign_balanced_selection(
    advantages: Float[Tensor, "G M"], is_oracle: Bool[Tensor, "G M"], *, keep: int = 4, q_pos: int = 1, q_neg: int = 2
) -> Bool[Tensor, "G M"]:
    r"""Stage 4: keep exactly ``keep`` rows per group (vectorised over groups).

    Priority: the oracle; the top-$q^+$ positive and top-$q^-$ negative policy rows
    by $|A|$; then the other non-zero rows by $|A|$ (cross-sign fill); then zero rows.
    Ties go to the lower row index.

    Raises:
        DomainError: $q^++q^-+1 \ne K$, fewer than K rows, or not exactly one oracle per group.

    Examples:
        >>> a = torch.tensor([[0.3, -0.1, -0.2, 0.5, 0.0, 0.2]])
        >>> orc = torch.tensor([[False] * 5 + [True]])
        >>> sign_balanced_selection(a, orc).int().tolist()
        [[0, 1, 1, 1, 0, 1]]
    """
    check_float("advantages", advantages, ndim=2)
    check_mask("is_oracle", is_oracle, advantages.shape)
    k = int(keep)
    if q_pos < 0 or q_neg < 0 or q_pos + q_neg + 1 != k:
        raise DomainError(f"q_pos, q_neg: expected q_pos + q_neg + 1 == keep = {k}, got {q_pos} + {q_neg} + 1")
    if advantages.shape[1] < k:
        raise DomainError(f"advantages: every group needs at least keep = {k} rows, got {advantages.shape[1]}")
    if bool((is_oracle.sum(-1) != 1).any()):
        raise DomainError("is_oracle: expected exactly one oracle row per group")
    a = advantages.detach()
    mag = a.abs()
    inf = torch.full_like(mag, float("inf"))
    pos, neg = (a > 0) & ~is_oracle, (a < 0) & ~is_oracle

    def rank(sel: Tensor) -> Tensor:  # rank by (-|A|, index) among the selected rows of each group
        order = torch.sort(torch.where(sel, -mag, inf), dim=-1, stable=True).indices
        return torch.argsort(order, dim=-1)

    quota = (pos & (rank(pos) < q_pos)) | (neg & (rank(neg) < q_neg))
    fill = (pos | neg) & ~quota
    tier = torch.full_like(a, 3.0)
    tier = torch.where(fill, 2.0, torch.where(quota, 1.0, torch.where(is_oracle, 0.0, tier)))
    order1 = torch.sort(torch.where(fill, -mag, torch.zeros_like(mag)), dim=-1, stable=True).indices
    order2 = torch.sort(tier.gather(-1, order1), dim=-1, stable=True).indices
    chosen = order1.gather(-1, order2)[:, :k]
    return torch.zeros_like(is_oracle).scatter(-1, chosen, True)


def post_selection_correction(
    active: Float[Tensor, "G K"],
    active_is_oracle: Bool[Tensor, "G K"],
    rms_ref: Float[Tensor, " G"],
    sigma_pi: Float[Tensor, " G"],
    *,
    rms_match: bool = True,
    min_scale: float = 0.25,
    sigma_floor: float = 1e-3,
    eps: float = 1e-6,
) -> Float[Tensor, "G K"]:
    r"""Stage 5: centre the K active rows, project the oracle to $\ge 0$, shrink to the reference RMS.

    $$
    a \leftarrow a - \bar a;\quad a^\star<0 \Rightarrow a_i \leftarrow a_i + \tfrac{a^\star}{K-1},\
                  a^\star\leftarrow 0;\quad
                  a \leftarrow \mathrm{clip}\Big(\tfrac{\mathrm{RMS}_{ref}}{\mathrm{RMS}_{act}+\epsilon}, s_{min}, 1\Big)a
    $$

    The RMS step is skipped when $\sigma_\pi <$ ``sigma_floor`` or $\mathrm{RMS}_{act}\le\epsilon$.

    Examples:
        >>> a = torch.tensor([[0.0, 0.0, 0.0, 0.05]])
        >>> orc = torch.tensor([[False, False, False, True]])
        >>> [round(x, 4) for x in post_selection_correction(a, orc, torch.zeros(1), torch.zeros(1))[0].tolist()]
        [-0.0125, -0.0125, -0.0125, 0.0375]
    """
    check_float("active", active, ndim=2)
    check_mask("active_is_oracle", active_is_oracle, active.shape)
    k = active.shape[1]
    if k < 2:
        raise DomainError(f"active: expected at least 2 active rows per group, got {k}")
    a = active - active.mean(-1, keepdim=True)
    a_star = (a * active_is_oracle).sum(-1, keepdim=True)
    deficit = (-a_star).clamp(min=0.0)
    a = torch.where(active_is_oracle, a + deficit, a - deficit / (k - 1))
    if not rms_match:
        return a
    rms_act = a.pow(2).mean(-1).sqrt()
    scale = (rms_ref / (rms_act + eps)).clamp(min_scale, 1.0)
    apply = (sigma_pi >= sigma_floor) & (rms_act > eps)
    return a * torch.where(apply, scale, torch.ones_like(scale)).unsqueeze(-1)


@register_advantage("orarl", paper=_PAPER)
@computes_in_float32
def orarl_advantages(
    rewards: Float[Tensor, "G n"],
    oracle_reward: Float[Tensor, " G"],
    *,
    gamma: float = 0.25,
    oracle_mode: OracleMode | str = OracleMode.DETACHED,
    prune: bool = True,
    keep: int = 4,
    q_pos: int = 1,
    q_neg: int = 2,
    rms_match: bool = True,
) -> OraRLAdvantages:
    r"""The full OraRL pipeline (stages 1-5) for G groups of n policy rows plus one oracle row.

    With ``prune=False`` every row is kept and stages 4-5 are skipped (the "no pruning" ablation).

    Args:
        rewards: ``[G, n]`` policy rewards. oracle_reward: ``[G]`` the oracle's reward $r^\star$.
        gamma: gain exponent (0 disables the directional gain).
        oracle_mode: `OracleMode` (``"gap"`` is the "w/o detached oracle" ablation).
        prune, keep, q_pos, q_neg: the sign-balanced selection. rms_match: stage 5's RMS step.

    Returns:
        `OraRLAdvantages` with ``[G, n+1]`` advantages (oracle last) and keep mask.

    Examples:
        >>> out = orarl_advantages(torch.tensor([[0.2] * 7 + [0.28]]), torch.tensor([1.0]))
        >>> [round(x, 4) for x in out.advantages[0][out.keep[0]].tolist()]
        [-0.0435, -0.0435, 0.0365, 0.0505]
    """
    mode = check_choice("oracle_mode", oracle_mode, OracleMode)
    pol, g = orarl_policy_advantages(rewards, oracle_reward, gamma=gamma)
    r = rewards.detach()
    if mode is OracleMode.DETACHED:
        a_star = orarl_oracle_advantage(r, oracle_reward, pol)
    else:
        a_star = oracle_reward.detach() - r.mean(-1)
    full = torch.cat([pol, a_star.unsqueeze(-1)], dim=-1)
    is_oracle = torch.zeros_like(full, dtype=torch.bool)
    is_oracle[:, -1] = True
    if prune:
        keep_mask = sign_balanced_selection(full, is_oracle, keep=keep, q_pos=q_pos, q_neg=q_neg)
        idx = torch.sort(torch.nonzero(keep_mask)[:, 1].reshape(full.shape[0], int(keep)), dim=-1).values
        corrected = post_selection_correction(
            full.gather(-1, idx), is_oracle.gather(-1, idx), pol.pow(2).mean(-1).sqrt(), _std(r), rms_match=rms_match
        )
        final = torch.zeros_like(full).scatter(-1, idx, corrected)
    else:
        keep_mask = torch.ones_like(is_oracle)
        final = full
    c = r - r.mean(-1, keepdim=True)
    pol_final = final[:, :-1]
    flipped = keep_mask[:, :-1] & (c != 0) & (torch.sign(pol_final) != torch.sign(c))
    return OraRLAdvantages(final, keep_mask, g, flipped.sum(-1))


@register_advantage("naive_oracle_injection", paper=_PAPER)
@computes_in_float32
def naive_injection_advantages(
    rewards: Float[Tensor, "G n"], oracle_reward: Float[Tensor, " G"], *, eps: float = 1e-6
) -> Float[Tensor, "G n+1"]:
    r"""Naive GT injection: GRPO over the n+1 rows (oracle last), so the oracle shifts the baseline.

    $$
    A_i = \frac{r_i - \mu_{all}}{\sigma_{all}+\epsilon},\quad \mu_{all} = \frac{n\mu_\pi + r^\star}{n+1}
    $$

    A policy row is inverted iff $0 < r_i-\mu_\pi \le (r^\star-\mu_\pi)/(n+1)$.

    Examples:
        >>> a = naive_injection_advantages(torch.tensor([[0.2] * 7 + [0.28]]), torch.tensor([1.0]))
        >>> round(float(a[0, 7]), 3)
        -0.067
    """
    _check_group(rewards, oracle_reward)
    return group_normalized_advantages(torch.cat([rewards, oracle_reward.unsqueeze(-1)], dim=-1), eps=eps)
