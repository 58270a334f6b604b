r"""Rollout correction: importance weights between the trainer's and the rollout engine's log-probs.

A rollout engine samples from $\mu$ (its own kernels, and under a lag an older policy); the trainer's
no-grad forward of the pre-update policy gives $\pi_{old}$ on the same tokens. The weights
$w = T(\pi_{old}/\mu)$ multiply the per-token policy-gradient term of any loss (the loss's own ratio
is then $\pi_\theta/\pi_{old}$), with $T$ one of four rules, two granularities times two constraints:

| mode | ratio | $T(r)$ |
| --- | --- | --- |
| ``token_truncate`` | $r_{bt} = e^{\ell^{old}_{bt} - \ell^{\mu}_{bt}}$ | $\mathrm{clamp}(r, c_{min}, c_{max})$ (TIS) |
| ``token_mask`` | $r_{bt}$ | $r\,\mathbb 1[c_{min} \le r \le c_{max}]$ (token MIS, IcePop) |
| ``sequence_truncate`` | $R_b = e^{\sum_t m_{bt}(\ell^{old}_{bt} - \ell^{\mu}_{bt})}$ on every token of row $b$ | $\mathrm{clamp}(R, c_{min}, c_{max})$ |
| ``sequence_mask`` | $R_b$ | $R\,\mathbb 1[c_{min} \le R \le c_{max}]$ (sequence MIS) |

$c_{min}$ absent means no lower bound. The log-ratio (the token's, or the row's sum) is clamped to
$\pm 20$ before ``exp`` (verl's bound; TRL does not clamp, which changes nothing unless $c_{max} > e^{20}$).
The weights carry no gradient. These are the rules of TRL's ``vllm_importance_sampling_mode`` (the
sequence ratio is the product of token ratios, i.e. the sum of log-ratios, as in TRL and verl) and of
verl's ``rollout_is`` (``token`` / ``sequence`` with a float threshold: truncation from above; with a
``"lower_upper"`` threshold: masking).

References: Ionides 2008 (truncated importance sampling); Yao et al. 2025, "Your efficient RL framework
secretly brings you off-policy RL training" (TIS); Liu et al. 2025, "When speed kills stability:
demystifying RL collapse from the training-inference mismatch" (sequence-level masked IS).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators._numerics import zero_off_mask
from posttrain.estimators.aggregation import masked_sum
from posttrain.estimators.importance.ratios import LOG_RATIO_CLAMP
from posttrain.shapes import Bool, Float
from posttrain.validate import check_choice, check_finite, check_float, check_mask, check_same_shape

__all__ = ["CorrectionMode", "RolloutCorrection", "correction_statistics", "rollout_correction_weights"]


class CorrectionMode(str, enum.Enum):
    """How the importance ratio becomes a weight (TRL's ``vllm_importance_sampling_mode`` names)."""

    TOKEN_TRUNCATE = "token_truncate"
    TOKEN_MASK = "token_mask"
    SEQUENCE_TRUNCATE = "sequence_truncate"
    SEQUENCE_MASK = "sequence_mask"

    @property
    def sequence(self) -> bool:
        """Whether one ratio per row is used (else one per token)."""
        return self in (CorrectionMode.SEQUENCE_TRUNCATE, CorrectionMode.SEQUENCE_MASK)

    @property
    def masks(self) -> bool:
        """Whether out-of-range ratios are zeroed (else clamped into range)."""
        return self in (CorrectionMode.TOKEN_MASK, CorrectionMode.SEQUENCE_MASK)


class RolloutCorrection(NamedTuple):
    """`rollout_correction_weights`'s result; every tensor ``[B, T]``, 0 / False off the mask.

    Attributes:
        weights: $T(r)$, the weight of each token's policy-gradient term (no gradient).
        ratio: the ratio of the mode's granularity before $T$ ($r_{bt}$, or $R_b$ on every token of row $b$).
        truncated: tokens whose weight was clamped (truncate modes; False in mask modes).
        masked: tokens whose weight was zeroed (mask modes; False in truncate modes).
    """

    weights: Tensor
    ratio: Tensor
    truncated: Tensor
    masked: Tensor


def _bounds(cap: float, floor: float | None) -> tuple[float, float]:
    cap = float(cap)
    if not cap > 0.0 or cap != cap:
        raise DomainError(f"cap: expected a number > 0, got {cap!r}")
    low = 0.0 if floor is None else float(floor)
    if not 0.0 <= low < cap:
        raise DomainError(f"floor: expected 0 <= floor < cap={cap}, got {floor!r}")
    return low, cap


def rollout_correction_weights(
    logp_old: Float[Tensor, "B T"],
    logp_rollout: Float[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    mode: CorrectionMode | str = CorrectionMode.TOKEN_TRUNCATE,
    cap: float = 2.0,
    floor: float | None = None,
) -> RolloutCorrection:
    r"""Importance weights $w = T(\pi_{old}/\mu)$ of the rollout correction (table in the module docstring).

    $$
    \log r_{bt} = \mathrm{clamp}(\ell^{old}_{bt} - \ell^{\mu}_{bt}, \pm 20),\qquad
    \log R_b = \mathrm{clamp}\Big(\sum_t m_{bt}(\ell^{old}_{bt} - \ell^{\mu}_{bt}), \pm 20\Big)
    $$

    Args:
        logp_old: ``[B, T]`` the trainer's log-probs of the sampled tokens under the pre-update policy
            ($\pi_{old}$, no gradient needed).
        logp_rollout: ``[B, T]`` the rollout engine's log-probs of the same tokens ($\mu$).
        mask: ``[B, T]`` boolean response mask. Off the mask the inputs are ignored (NaN allowed).
        mode: a `CorrectionMode` or its value.
        cap: $c_{max} > 0$. floor: $c_{min}$ in ``[0, cap)``, or None (no lower bound).

    Returns:
        `RolloutCorrection` (weights, ratio, truncated, masked), detached.

    Raises:
        ShapeError: shapes differ. DomainError: non-finite log-probs on the mask, ``cap``/``floor`` out of range,
            an unknown mode.

    Examples:
        >>> lp = torch.log(torch.tensor([[1.0, 3.0], [0.5, 1.0]])); m = torch.ones(2, 2, dtype=torch.bool)
        >>> rollout_correction_weights(lp, torch.zeros_like(lp), m, mode="token_truncate", cap=2.0).weights.tolist()
        [[1.0, 2.0], [0.5, 1.0]]
        >>> rollout_correction_weights(lp, torch.zeros_like(lp), m, mode="sequence_mask", cap=2.0).weights.tolist()
        [[0.0, 0.0], [0.5, 0.5]]
    """
    mode = check_choice("mode", mode, CorrectionMode)
    low, high = _bounds(cap, floor)
    check_float("logp_old", logp_old, ndim=2)
    check_float("logp_rollout", logp_rollout)
    check_same_shape("logp_old", logp_old, logp_rollout=logp_rollout)
    check_mask("mask", mask, logp_old.shape)
    check_finite("logp_old", logp_old, mask)
    check_finite("logp_rollout", logp_rollout, mask)
    diff = zero_off_mask(logp_old.detach() - logp_rollout.detach(), mask)  # off-mask NaN never leaks
    if mode.sequence:
        diff = masked_sum(diff, mask, dim=-1).unsqueeze(-1).expand_as(diff)
    ratio = zero_off_mask(torch.exp(diff.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)), mask)
    outside = ((ratio < low) | (ratio > high)) & mask
    if mode.masks:
        weights = torch.where(outside, torch.zeros((), dtype=ratio.dtype, device=ratio.device), ratio)
        return RolloutCorrection(weights, ratio, torch.zeros_like(mask), outside)
    return RolloutCorrection(zero_off_mask(ratio.clamp(low, high), mask), ratio, outside, torch.zeros_like(mask))


QUANTILES = (0.05, 0.5, 0.95)
"""The ratio quantiles `correction_statistics` reports."""


def correction_statistics(
    correction: RolloutCorrection, mask: Bool[Tensor, "B T"], *, sequence: bool
) -> dict[str, Tensor]:
    r"""0-d summaries of a `RolloutCorrection`: the ratio's mean, min, `QUANTILES` and max, the mean weight,
    and the shares of truncated and of masked entries.

    Over the tokens of the mask (``sequence=False``), or over the rows with a token, one value each
    (``sequence=True``: the row's ratio and weight, the share of rows truncated / masked). With no entry
    at all every ratio summary is 1 and every share 0.

    Examples:
        >>> lp = torch.log(torch.tensor([[1.0, 3.0]])); m = torch.ones(1, 2, dtype=torch.bool)
        >>> s = correction_statistics(rollout_correction_weights(lp, torch.zeros_like(lp), m), m, sequence=False)
        >>> float(s["ratio_max"]), float(s["truncated"]), float(s["weight_mean"])
        (3.0, 0.5, 1.5)
    """
    check_mask("mask", mask, correction.ratio.shape)
    if sequence:
        rows = mask.any(dim=-1)
        first = mask.long().argmax(dim=-1, keepdim=True)  # any token of a row carries the row's values
        pick = lambda t: t.gather(-1, first).squeeze(-1)[rows]  # noqa: E731
        ratio, weight = pick(correction.ratio), pick(correction.weights)
        truncated, masked = pick(correction.truncated), pick(correction.masked)
    else:
        ratio, weight = correction.ratio[mask], correction.weights[mask]
        truncated, masked = correction.truncated[mask], correction.masked[mask]
    one = torch.ones((), dtype=correction.ratio.dtype, device=correction.ratio.device)
    if ratio.numel() == 0:
        stats = {"ratio_mean": one, "ratio_min": one, "ratio_max": one, "weight_mean": one}
        stats |= {f"ratio_p{round(q * 100):02d}": one for q in QUANTILES}
        return {**stats, "truncated": one * 0, "masked": one * 0}
    qs = torch.quantile(ratio.double(), torch.tensor(QUANTILES, dtype=torch.float64, device=ratio.device))
    stats = {"ratio_mean": ratio.mean(), "ratio_min": ratio.min(), "ratio_max": ratio.max()}
    stats |= {f"ratio_p{round(q * 100):02d}": v.to(ratio.dtype) for q, v in zip(QUANTILES, qs, strict=True)}
    stats |= {"weight_mean": weight.mean()}
    return {**stats, "truncated": truncated.to(ratio.dtype).mean(), "masked": masked.to(ratio.dtype).mean()}
