r"""verl plugin: our advantage estimators and policy losses in verl's registries, under ``posttrain_*`` names.

Importing this module registers (when verl is installed; verl >= 0.6.1 for the ``(loss, metrics)``
policy-loss return):

- ``posttrain_grpo``: `group_normalized_advantages`, ``scale_by_std`` from
  ``algorithm.norm_adv_by_std_in_grpo`` (verl built-in to match: ``grpo``);
- ``posttrain_drgrpo``: `drgrpo_advantages` (``grpo`` without the std);
- ``posttrain_rloo``: `rloo_advantages` (``rloo``);
- ``posttrain_reinforce_pp``: `reinforce_pp_advantages`, ``algorithm.gamma``
  (``reinforce_plus_plus``);
- ``posttrain_reinforce_pp_baseline``: `reinforce_pp_baseline_advantages`
  (``reinforce_plus_plus_baseline``);
- policy loss ``posttrain_ppo_clip``: `clipped_ratio_loss` with the dual clip
  ``clip_ratio_c`` (``vanilla``);
- policy loss ``posttrain_gspo``: `gspo_loss` (``gspo``);
- policy loss ``posttrain_cispo``: `cispo_loss` in verl's convention
  $w = \mathrm{clip}(r, 1-\epsilon_{low}, 1+\epsilon_{high})$ from ``clip_ratio_low``/``_high``
  (built-in ``cispo``, compared with verl 0.9.1);
- policy losses ``posttrain_truncated_is`` (`truncated_is_loss`, cap 2) and
  ``posttrain_no_is_correction`` (`no_correction_loss`), no verl twin.

Advantages: verl's ``index`` (prompt uids) groups the rows into our ``[G, K]``; the outcome score is the
sum of ``token_level_rewards`` over every position, as verl's built-ins (verl's rollout correction may
mask tokens or whole rows after the reward is placed; such rows keep their score in the group
statistics); the result comes back in verl's row order, times the mask, as ``(advantages, returns)``
with the same tensor twice (outcome estimators have no separate returns).
Policy losses: our per-token loss, times ``rollout_is_weights`` when given (as verl's built-ins), reduced
by `global_aggregate` with ``loss_agg_mode`` and the actor config's
``global_batch_info`` (so data-parallel and micro-batch invariance are verl's); clip settings from the
actor config (``clip_ratio``, ``clip_ratio_low``/``_high``, ``clip_ratio_c``). A micro-batch whose every
token is masked gives 0, as verl's losses do.

Not registered, because their inputs do not reach verl's call: SIS (needs the behaviour policy's
top-K log-probs at every position; the TRL adapter has it, ``sis_top_k``), OPD / KDRL / OPD^2 / ExOPD (teacher log-probs; verl's own
distillation losses cover the k1/k3 reverse-KL forms), OraRL (an oracle row per group, not marked in
verl's batch), GFlowRL / GARL / PAFT (partition estimates, trace weights).

Make the names visible in every Ray worker (registries are per process): ``pip install posttrain``
declares the ``verl.plugins`` entry point (verl >= 0.9 imports it on ``import verl``); with older verl
set ``VERL_USE_EXTERNAL_MODULES=posttrain.llm.adapters.verl`` in the workers' environment. Then
`check_registered` confirms the names are there. Bind other hyperparameters with
`register_policy_loss_variant` (verl's config dataclasses may reject unknown keys).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from posttrain.errors import DomainError, RegistryError
from posttrain.estimators import (
    cispo_loss,
    clipped_ratio_loss,
    drgrpo_advantages,
    group_normalized_advantages,
    group_rewards,
    gspo_loss,
    masked_mean,
    masked_sum,
    no_correction_loss,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
    truncated_is_loss,
)
from posttrain.llm.adapters.convert import (
    clip_options,
    config_value,
    global_aggregate,
    group_ids_from_index,
    grouped_token_advantages,
    outcome_scores,
    response_bool_mask,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "PREFIX",
    "check_registered",
    "register",
    "register_policy_loss_variant",
    "verl_advantage",
    "verl_policy_loss",
]

PREFIX = "posttrain_"
"""Prefix of every name we register in verl (verl's ``grpo`` / ``gae`` never reach its registry)."""

AdvantageFn = Callable[..., tuple[Tensor, Tensor]]
PolicyLossFn = Callable[..., tuple[Tensor, dict[str, Any]]]


def _require_index(index: Any) -> Any:
    if index is None:
        raise DomainError("index: posttrain's group estimators need verl's prompt uids (non_tensor_batch['uid'])")
    return index


def verl_advantage(grouped: Callable[[Tensor, Any], Tensor]) -> AdvantageFn:
    """A verl advantage estimator from ``grouped(rewards [G, K], algorithm_config) -> [G, K]``.

    The result has verl's keyword signature ``(token_level_rewards, response_mask, index, config, **kwargs)``
    and returns ``(advantages, advantages)``, both ``[B, T]`` times the mask, in verl's row order.
    """

    def estimator(
        token_level_rewards: Tensor, response_mask: Tensor, index: Any = None, config: Any = None, **_: Any
    ) -> tuple[Tensor, Tensor]:
        mask = response_bool_mask(response_mask)
        with torch.no_grad():
            adv = grouped_token_advantages(
                lambda r: grouped(r, config),
                outcome_scores(token_level_rewards),
                group_ids_from_index(_require_index(index), device=token_level_rewards.device),
                mask,
            )
        return adv, adv

    return estimator


def _reinforce_pp(
    token_level_rewards: Tensor, response_mask: Tensor, config: Any = None, **_: Any
) -> tuple[Tensor, Tensor]:
    """verl adapter of `reinforce_pp_advantages` (``algorithm.gamma``, default 1).

    Returns the advantages twice: verl's built-in returns the discounted returns second, which only a
    critic would read (and none is built for this estimator).
    """
    with torch.no_grad():
        adv = reinforce_pp_advantages(
            token_level_rewards, response_bool_mask(response_mask), gamma=float(config_value(config, "gamma", 1.0))
        )
    return adv, adv


def _reinforce_pp_baseline(
    token_level_rewards: Tensor, response_mask: Tensor, index: Any = None, config: Any = None, **_: Any
) -> tuple[Tensor, Tensor]:
    """verl adapter of `reinforce_pp_baseline_advantages` (rows regrouped and restored)."""
    mask = response_bool_mask(response_mask)
    with torch.no_grad():
        ids = group_ids_from_index(_require_index(index), device=token_level_rewards.device)
        grouped, order = group_rewards(outcome_scores(token_level_rewards), ids)
        adv = torch.empty_like(token_level_rewards)
        adv[order] = reinforce_pp_baseline_advantages(grouped, mask[order]).to(adv.dtype)
    return adv, adv


ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {
    f"{PREFIX}grpo": verl_advantage(
        lambda r, c: group_normalized_advantages(r, scale_by_std=bool(config_value(c, "norm_adv_by_std_in_grpo", True)))
    ),
    f"{PREFIX}drgrpo": verl_advantage(lambda r, c: drgrpo_advantages(r)),
    f"{PREFIX}rloo": verl_advantage(lambda r, c: rloo_advantages(r)),
    f"{PREFIX}reinforce_pp": _reinforce_pp,
    f"{PREFIX}reinforce_pp_baseline": _reinforce_pp_baseline,
}
"""verl name -> estimator with verl's signature."""


_LOSS_METRICS = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")
"""The metrics verl's built-in policy losses return."""


def verl_policy_loss(
    loss: Callable[..., Any], options: Callable[[Any], dict[str, Any]] = lambda config: {}
) -> PolicyLossFn:
    """A verl policy loss from our per-token ``loss(logp, logp_old, advantages, mask, **options)``.

    ``options(actor_config)`` maps verl's actor config to the loss's keyword options. The result has
    verl's signature ``(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
    rollout_is_weights)`` and returns ``(scalar loss, {"actor/pg_clipfrac", "actor/ppo_kl",
    "actor/pg_clipfrac_lower"})``.
    """

    def policy_loss(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
        **_: Any,
    ) -> tuple[Tensor, dict[str, Any]]:
        mask = response_bool_mask(response_mask)
        if not bool(mask.any()):  # a micro-batch whose tokens verl's rollout rejection all masked: 0, as verl's losses
            return masked_sum(log_prob, mask), dict.fromkeys(_LOSS_METRICS, 0.0)
        out = loss(log_prob, old_log_prob, advantages, mask, **options(config))
        per_token, diag = out if isinstance(out, tuple) else (out, None)
        if rollout_is_weights is not None:
            per_token = per_token * rollout_is_weights.detach()
        batch_info = dict(config_value(config, "global_batch_info", {}) or {})
        batch_info.setdefault("loss_scale_factor", config_value(config, "loss_scale_factor", None))
        value = global_aggregate(per_token, mask, loss_agg_mode, **batch_info)
        with torch.no_grad():
            ppo_kl = masked_mean(old_log_prob - log_prob.detach(), mask)
            clip = getattr(diag, "clip", diag)  # SIS-style diagnostics nest the clip ones
            values = (
                float(getattr(clip, "clip_frac", 0.0)),
                float(ppo_kl),
                float(getattr(clip, "dual_clip_frac", 0.0)),
            )
            metrics = dict(zip(_LOSS_METRICS, values, strict=True))
        return value, metrics

    return policy_loss


POLICY_LOSSES: dict[str, PolicyLossFn] = {
    f"{PREFIX}ppo_clip": verl_policy_loss(clipped_ratio_loss, lambda c: clip_options(c).kwargs()),
    f"{PREFIX}gspo": verl_policy_loss(gspo_loss, lambda c: clip_options(c, dual_clip=False).kwargs()),
    f"{PREFIX}cispo": verl_policy_loss(cispo_loss, lambda c: clip_options(c, dual_clip=False).kwargs()),
    f"{PREFIX}truncated_is": verl_policy_loss(truncated_is_loss),
    f"{PREFIX}no_is_correction": verl_policy_loss(no_correction_loss),
}
"""verl name -> policy loss with verl's signature."""


def _core_algos() -> Any:
    import verl.trainer.ppo.core_algos as core_algos

    return core_algos


def register_policy_loss_variant(name: str, loss: Callable[..., Any], **fixed: Any) -> PolicyLossFn:
    """Register ``loss`` with hyperparameters bound (e.g. ``truncated_is_loss, cap=5.0``) as ``posttrain_<name>``.

    Call it in a module that `VERL_USE_EXTERNAL_MODULES` imports, so every worker registers it.
    """
    fn = verl_policy_loss(functools.partial(loss, **fixed))
    _core_algos().register_policy_loss(PREFIX + name)(fn)
    return fn


def register() -> list[str]:
    """Register every adapter in verl's registries (idempotent); returns the names."""
    core_algos = _core_algos()
    for name, adv in ADVANTAGE_ESTIMATORS.items():
        core_algos.register_adv_est(name)(adv)  # same object again is accepted by verl
    for name, pl in POLICY_LOSSES.items():
        core_algos.register_policy_loss(name)(pl)
    return [*ADVANTAGE_ESTIMATORS, *POLICY_LOSSES]


def _found(lookup: Callable[[str], Any], name: str, fn: Any) -> bool:
    try:
        return lookup(name) is fn
    except ValueError:  # verl's lookups raise ValueError for an unknown name
        return False


def check_registered() -> dict[str, list[str]]:
    """Look every name up through verl's own ``get_adv_estimator_fn`` / ``get_policy_loss_fn``.

    Returns ``{"adv_estimator": [...], "policy_loss": [...]}``; raises ``RegistryError`` naming the
    missing ones (e.g. a Ray worker that imported verl without the plugin).
    """
    core_algos = _core_algos()
    tables: list[tuple[Callable[[str], Any], dict[str, Any]]] = [
        (core_algos.get_adv_estimator_fn, ADVANTAGE_ESTIMATORS),
        (core_algos.get_policy_loss_fn, POLICY_LOSSES),
    ]
    missing = [name for lookup, table in tables for name, fn in table.items() if not _found(lookup, name, fn)]
    if missing:
        raise RegistryError(
            f"verl registries lack {', '.join(missing)}: import posttrain.llm.adapters.verl in every process "
            "(entry point verl.plugins, or VERL_USE_EXTERNAL_MODULES=posttrain.llm.adapters.verl)"
        )
    return {"adv_estimator": list(ADVANTAGE_ESTIMATORS), "policy_loss": list(POLICY_LOSSES)}


if importlib.util.find_spec("verl") is not None:  # the plugin contract: register at import time
    register()
