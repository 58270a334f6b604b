"""Importance ratios between the current policy and a behaviour policy, from log-probs."""

from __future__ import annotations

from torch import Tensor

from posttrain.estimators.aggregation import masked_mean
from posttrain.shapes import Bool, Float
from posttrain.validate import check_float, check_mask, check_positive, check_same_shape

__all__ = ["LOG_RATIO_CLAMP", "log_ratio", "sequence_log_ratio"]

LOG_RATIO_CLAMP = 20.0
"""verl and OpenRLHF clamp $\\ell - \\ell_{old}$ to ``[-20, 20]`` before ``exp``."""


def log_ratio(
    logp: Float[Tensor, "B T"], logp_old: Float[Tensor, "B T"], *, clamp: float | None = LOG_RATIO_CLAMP
) -> Float[Tensor, "B T"]:
    r"""$\log r = \mathrm{clamp}(\ell - \ell_{old}, -c, c)$; ``clamp=None`` leaves it unclamped (TRL).

    Examples:
        >>> import torch
        >>> log_ratio(torch.tensor([[-30.0, -1.0]]), torch.tensor([[-1.0, -2.0]])).tolist()
        [[-20.0, 1.0]]
    """
    check_float("logp", logp)
    check_float("logp_old", logp_old)
    check_same_shape("logp", logp, logp_old=logp_old)
    d = logp - logp_old
    return d if clamp is None else d.clamp(-check_positive("clamp", clamp), clamp)


def sequence_log_ratio(
    logp: Float[Tensor, "B T"], logp_old: Float[Tensor, "B T"], mask: Bool[Tensor, "B T"]
) -> Float[Tensor, " B"]:
    r"""Length-normalised sequence log-ratio (GSPO), 0 for a fully masked row.

    $$
    \log s_i = \frac{1}{|y_i|}\sum_t m_{it}(\ell_{it} - \ell^{old}_{it})
    $$

    """
    check_float("logp", logp, ndim=2)
    check_float("logp_old", logp_old)
    check_same_shape("logp", logp, logp_old=logp_old)
    check_mask("mask", mask, logp.shape)
    return masked_mean(logp - logp_old, mask, dim=-1)
