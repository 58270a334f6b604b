"""Direct preference optimisation (DPO): the per-pair loss from sequence log-probabilities.

A preference pair is ``(x, y_w, y_l)`` (chosen, rejected). The inputs are *sequence* log-probs
``[B]`` (sum of token log-probs over the response mask, e.g.
`posttrain.estimators.masked_sum`) of the policy and of the frozen reference.
Per-pair losses are a new registry kind, ``preference_loss``, so ``posttrain list`` shows them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor

from posttrain.estimators._numerics import computes_in_float32
from posttrain.registry import Registry, registry
from posttrain.shapes import Float
from posttrain.validate import check_finite, check_float, check_in_range, check_positive, check_same_shape

__all__ = ["PREFERENCE_LOSSES", "DPODiagnostics", "dpo_loss", "register_preference_loss"]

PREFERENCE_LOSSES: Registry[Any] = registry("preference_loss")
Fn = TypeVar("Fn", bound=Callable[..., Any])


def register_preference_loss(name: str, *, paper: str = "") -> Callable[[Fn], Fn]:
    """Register a per-pair preference loss under ``name`` (decorator)."""
    return PREFERENCE_LOSSES.register(name, paper=paper)


class DPODiagnostics(NamedTuple):
    """Per-pair tensors ``[B]`` (no gradient)."""

    chosen_rewards: Tensor
    r"""Implicit reward $\beta(\ell_w - \ell^{ref}_w)$."""
    rejected_rewards: Tensor
    r"""Implicit reward $\beta(\ell_l - \ell^{ref}_l)$."""
    margin: Tensor
    """The DPO logit ``u`` = chosen reward - rejected reward."""
    accuracy: Tensor
    """1.0 where ``u > 0`` (the implicit reward ranks the pair correctly), else 0.0."""


@register_preference_loss("dpo", paper="Rafailov et al. 2023, DPO, arXiv:2305.18290")
@computes_in_float32
def dpo_loss(
    logp_chosen: Float[Tensor, " B"],
    logp_rejected: Float[Tensor, " B"],
    logp_ref_chosen: Float[Tensor, " B"],
    logp_ref_rejected: Float[Tensor, " B"],
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[Float[Tensor, " B"], DPODiagnostics]:
    r"""DPO loss per preference pair (with optional conservative label smoothing).

    $$
    u = \beta\Big[(\ell_w - \ell^{ref}_w) - (\ell_l - \ell^{ref}_l)\Big],\qquad
    \mathcal L = -(1-\varepsilon)\log\sigma(u) - \varepsilon\log\sigma(-u),
    $$

    where $\ell_w$ = ``logp_chosen``, $\ell_l$ = ``logp_rejected``, the ``ref``
    versions are the reference model's, $\beta$ = ``beta`` and $\varepsilon$ =
    ``label_smoothing`` (the probability that a label is flipped; 0 is plain DPO). ``u`` is the
    Bradley-Terry logit of the implicit reward difference; for a log-linear policy
    $\pi_\theta \propto \pi_0 e^{\theta^\top\phi}$ it equals $\beta\,\theta^\top(\phi_w-\phi_l)$
    (the edge vector of `posttrain.theory.dpo_design`). Computed with ``logsigmoid`` (no
    overflow for large ``|u|``).

    Args:
        logp_chosen: ``[B]`` policy sequence log-prob of the chosen response.
        logp_rejected: ``[B]`` policy sequence log-prob of the rejected response.
        logp_ref_chosen: ``[B]`` reference sequence log-prob of the chosen response.
        logp_ref_rejected: ``[B]`` reference sequence log-prob of the rejected response.
        beta: KL strength / temperature, > 0 (paper default 0.1).
        label_smoothing: flip probability in [0, 0.5] (cDPO).

    Returns:
        ``(loss [B], DPODiagnostics)``; reduce with ``loss.mean()``.

    Raises:
        ShapeError: non-float inputs, not rank 1, or different shapes.
        DomainError: ``beta <= 0``, ``label_smoothing`` outside [0, 0.5], non-finite inputs.

    References:
        Rafailov, Sharma, Mitchell, Ermon, Manning, Finn (2023), "Direct Preference Optimization",
        arXiv:2305.18290. Label smoothing: Mitchell (2023), "A note on DPO with noisy preferences".

    Examples:
        >>> z = torch.zeros(1, dtype=torch.float64)
        >>> loss, diag = dpo_loss(z, z, z, z, beta=0.1)
        >>> round(float(loss[0]), 6)  # -log sigma(0) = log 2
        0.693147
        >>> loss, diag = dpo_loss(z + 2.0, z, z, z, beta=0.5)  # u = 0.5 * 2 = 1
        >>> float(diag.margin[0]), round(float(loss[0]), 6)
        (1.0, 0.313262)
    """
    check_float("logp_chosen", logp_chosen, ndim=1)
    others = {
        "logp_rejected": logp_rejected,
        "logp_ref_chosen": logp_ref_chosen,
        "logp_ref_rejected": logp_ref_rejected,
    }
    check_same_shape("logp_chosen", logp_chosen, **others)
    for name, t in others.items():
        check_float(name, t)
    beta = check_positive("beta", beta)
    eps = check_in_range("label_smoothing", label_smoothing, 0.0, 0.5)
    for name, t in {"logp_chosen": logp_chosen, **others}.items():
        check_finite(name, t.detach())
    chosen = beta * (logp_chosen - logp_ref_chosen)
    rejected = beta * (logp_rejected - logp_ref_rejected)
    u = chosen - rejected
    loss = -(1.0 - eps) * F.logsigmoid(u)
    if eps > 0.0:
        loss = loss - eps * F.logsigmoid(-u)
    with torch.no_grad():
        diag = DPODiagnostics(
            chosen_rewards=chosen.detach(),
            rejected_rewards=rejected.detach(),
            margin=u.detach(),
            accuracy=(u.detach() > 0).to(u.dtype),
        )
    return loss, diag
