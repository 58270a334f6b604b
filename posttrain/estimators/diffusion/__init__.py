"""Path-space estimators for diffusion / flow policies (SDE paths ``[N, S, D]``).

| module | |
| --- | --- |
| `girsanov` | Girsanov path weights, the path score and the Ito policy gradient |
| `value_gradients` | value-gradient estimators (stochastic, deterministic, kernel) and the policy gradient from them |
| `forward_matching` | forward-matching losses and their time weights (template, AWM, NFT, scale-bounded) |
"""

from __future__ import annotations

from posttrain.estimators.diffusion.forward_matching import (
    Curvature,
    awm_loss,
    bounded_weight,
    elbo_weight,
    girsanov_template_weights,
    is_scale_bounded,
    nft_loss,
    scale_bounded_loss,
    template_loss,
)
from posttrain.estimators.diffusion.girsanov import girsanov_log_weights, ito_policy_gradient, path_score
from posttrain.estimators.diffusion.value_gradients import (
    VALUE_GRADIENTS,
    KDEValueGradient,
    deterministic_value_gradient,
    kde_value_gradient,
    stochastic_value_gradient,
    value_gradient_policy_gradient,
)

__all__ = [
    "VALUE_GRADIENTS",
    "Curvature",
    "KDEValueGradient",
    "awm_loss",
    "bounded_weight",
    "deterministic_value_gradient",
    "elbo_weight",
    "girsanov_log_weights",
    "girsanov_template_weights",
    "is_scale_bounded",
    "ito_policy_gradient",
    "kde_value_gradient",
    "nft_loss",
    "path_score",
    "scale_bounded_loss",
    "stochastic_value_gradient",
    "template_loss",
    "value_gradient_policy_gradient",
]
