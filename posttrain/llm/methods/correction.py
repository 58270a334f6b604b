r"""Rollout correction in the trainer, for any policy loss (``algorithm.rollout_correction``; docs: off_policy.md).

Three log-probs of every sampled token: the rollout engine's ``logp_old`` ($\mu$: the engine's kernels and,
trained at a lag, an older policy), the trainer's ``logp_prox`` ($\pi_{old}$: one no-grad forward of the
policy before the step's updates, the filler `posttrain.llm.methods.needs.policy_logp_filler`, as TRL's
``old_per_token_logps`` and verl's recomputed ``old_log_prob``) and the training forward's ``logp``
($\pi_\theta$). With a correction the method's policy loss takes ``logp_prox`` where it took the behaviour
log-probs, so its ratio is $\pi_\theta/\pi_{old}$ (1 at the first update), and its per-token value is
multiplied by the weights $w = T(\pi_{old}/\mu)$ of
`posttrain.estimators.importance.rollout_correction_weights` (no gradient):

$$
\ell^{corr}_{bt} = w_{bt}\,\ell^{pg}_{bt}(\pi_\theta, \pi_{old}, A, m)
$$

The KL term and the entropy bonus are not weighted (TRL and verl weight the policy-gradient term only), and
the aggregation's normaliser is unchanged (a masked token or sequence counts with weight 0, as in TRL and in
verl's ``rollout_is``; verl's rejection sampling ``rollout_rs`` instead removes it from the mask). Without a
correction the loss's ratio is $\pi_\theta/\mu$ against the engine's log-probs (verl's "bypass" mode): what a
method that corrects the gap itself (SIS, ``truncated_is``, replay) reads.

Logged (`correction_statistics`, per micro-batch, averaged by tokens; one value for the whole batch without
micro-batches): ``pg/is_ratio_mean``, ``pg/is_ratio_min``, ``pg/is_ratio_p05``, ``pg/is_ratio_p50``,
``pg/is_ratio_p95``, ``pg/is_ratio_max`` (the ratio before $T$: per token, or per sequence in the sequence
modes), ``pg/is_weight_mean``, ``pg/is_truncated`` and ``pg/is_masked`` (shares of tokens or sequences).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators.importance import CorrectionMode, correction_statistics, rollout_correction_weights
from posttrain.llm.methods.algorithm import Algorithm
from posttrain.llm.methods.needs import Need
from posttrain.llm.typed import Checked, OneOf, Range

__all__ = ["CorrectedDiagnostics", "RolloutCorrectionConfig", "corrected_policy_loss", "with_rollout_correction"]


@dataclass(frozen=True)
class RolloutCorrectionConfig(Checked):
    """``algorithm.rollout_correction``: the rule $T$ and its bounds (TRL: ``vllm_importance_sampling_mode``,
    ``_clip_max``, ``_clip_min``; verl: ``rollout_is`` with ``rollout_is_threshold``).

    Attributes:
        mode: ``token_truncate`` (TIS, the default), ``token_mask``, ``sequence_truncate`` or ``sequence_mask``.
        cap: $c_{max}$: truncate modes clamp the ratio to it, mask modes zero a ratio above it (verl's default
            threshold 2.0; TRL's ``vllm_importance_sampling_clip_max`` is 3.0).
        floor: $c_{min}$, or null for no lower bound (the default, as in TRL and verl's single threshold).
    """

    mode: Annotated[str, OneOf(tuple(m.value for m in CorrectionMode))] = CorrectionMode.TOKEN_TRUNCATE.value
    cap: Annotated[float, Range(0.0, 1e6, low_open=True)] = 2.0
    floor: Annotated[float, Range(0.0, 1e6)] | None = None

    def check(self) -> None:
        if self.floor is not None and not self.floor < self.cap:
            raise DomainError(f"floor: expected floor < cap={self.cap}, got {self.floor}")


class CorrectedDiagnostics:
    """The inner loss's diagnostics (its ``_asdict()``) and the correction's ``is_*`` statistics, as one mapping."""

    def __init__(self, values: dict[str, Tensor]) -> None:
        self._values = values

    def _asdict(self) -> dict[str, Tensor]:
        return dict(self._values)


def corrected_policy_loss(
    inner: Callable[..., Any], config: RolloutCorrectionConfig
) -> Callable[..., tuple[Tensor, CorrectedDiagnostics]]:
    """``inner`` (a policy loss ``(logp, logp_old, advantages, mask, **needs)``) on ``logp_prox``, weighted by the
    correction of ``config`` between ``logp_prox`` and the engine's ``logp_old`` (see the module docstring)."""
    mode = CorrectionMode(config.mode)

    def loss(
        logp: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor, *, logp_prox: Tensor | None, **needs: Any
    ) -> tuple[Tensor, CorrectedDiagnostics]:
        if logp_prox is None:
            raise DomainError("batch: logp_prox (the trainer's pre-update log-probs) must be filled before the loss")
        out = inner(logp, logp_prox, advantages, mask, **needs)
        tok, diag = out if isinstance(out, tuple) else (out, None)
        c = rollout_correction_weights(logp_prox, logp_old, mask, mode=mode, cap=config.cap, floor=config.floor)
        stats = correction_statistics(c, mask, sequence=mode.sequence)
        values = {**(diag._asdict() if hasattr(diag, "_asdict") else {}), **{f"is_{k}": v for k, v in stats.items()}}
        return tok * c.weights.to(tok.dtype), CorrectedDiagnostics(values)

    return loss


def with_rollout_correction(alg: Algorithm, config: RolloutCorrectionConfig | None) -> Algorithm:
    """``alg`` (every phase of its schedule) with its policy loss corrected by ``config``; ``alg`` when None."""
    if config is None:
        return alg
    inner = alg.schedule
    return dataclasses.replace(
        alg,
        policy_loss=corrected_policy_loss(alg.policy_loss, config),
        needs=alg.needs | {Need.LOGP_PROX},
        loss_needs=(*alg.loss_needs, Need.LOGP_PROX),
        schedule=None if inner is None else lambda step, scores: with_rollout_correction(inner(step, scores), config),
    )
