r"""TRL adapter: ``GRPOTrainer`` with our advantage estimator, policy loss and aggregation.

TRL has no estimator registry; its supported extension point is a subclass (integrations.md section 2.2).
``PosttrainGRPOTrainer`` (built on first access, so importing this module does not import TRL) takes
the usual ``GRPOTrainer`` arguments plus

- ``advantage``: a name of our advantage registry whose only input is grouped rewards ``[G, K]``
  (``grpo``, ``drgrpo``, ``rloo``) or such a callable; ``advantage_options`` are bound keywords;
- ``policy_loss``: a name of our policy-loss registry with the signature
  ``(logp, logp_old, advantages, mask, **options)`` (``ppo_clip``, ``gspo``, ``truncated_is``,
  ``no_is_correction``, ...) or such a callable; ``loss_options`` are bound keywords (e.g.
  ``{"clip_high": 0.28, "dual_clip": 3.0}``);
- ``aggregation``: an :class:`~posttrain.estimators.AggregationMode` (``seq-mean-token-sum-norm`` uses
  ``max_completion_length`` as the constant, as TRL's ``dr_grpo``);
- ``sis_top_k``: selective importance sampling (Li et al. 2026, arXiv:2607.04728) on top of the policy
  loss: at generation one no-grad forward stores the behaviour's top-K token ids and log-probs with the
  batch; every loss computation runs one more no-grad forward of the current policy, accepts tokens by
  :func:`~posttrain.estimators.sis.sis_rejection_test` (uniforms from the trainer's own generator,
  seeded by ``args.seed``) and feeds :func:`sis_effective_logp_old` to the loss. It only matters when
  updates are off-policy (``num_iterations > 1`` or ``steps_per_generation`` > accumulation steps).

Hooks (private TRL methods, feature-detected; checked against TRL 1.16):
``_calculate_rewards`` is wrapped to keep the per-function rewards of the generation batch (gathered
over processes); ``_generate_and_score_completions`` then replaces TRL's advantages by ours on the
weighted sum of those rewards, grouped by ``num_generations``, sliced to this process's rows;
``_compute_loss`` recomputes the token log-probs with TRL's own helper and returns
:func:`trl_policy_loss`. TRL's ``loss_type``, ``scale_rewards``, ``epsilon*`` and ``importance_sampling_level``
are then not used (our options replace them); settings whose effect the adapter does not reproduce
(entropy bonus, top-entropy masking, off-policy masking, ``normalize_then_sum``, MoE aux loss) raise.

Micro-batching: the loss of each micro-batch is divided by the gradient-accumulation steps, so sequence
modes (``seq-mean-*``) sum to the full-batch value for equal micro-batches, while ``token-mean`` is
per micro-batch (TRL's ``bnpo`` normaliser).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import ADVANTAGES, POLICY_LOSSES, AggregationMode, aggregate, k3_kl, masked_mean
from posttrain.estimators.sis import sis_logp_old, sis_rejection_test, token_in_topk

__all__ = [
    "completion_log_probs",
    "grpo_trainer_class",
    "resolve_advantage",
    "resolve_policy_loss",
    "sis_effective_logp_old",
    "trl_advantages",
    "trl_policy_loss",
]


def _required_positional(fn: Callable[..., Any]) -> int:
    params = inspect.signature(fn).parameters.values()
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in kinds and p.default is inspect.Parameter.empty)


def _resolve(
    kind: str, registry: Any, spec: str | Callable[..., Any], options: dict[str, Any], n_inputs: int, shape: str
) -> Callable[..., Any]:
    fn = registry.get(spec) if isinstance(spec, str) else spec
    if _required_positional(fn) != n_inputs:
        valid = [e.name for e in registry if _required_positional(e.obj) == n_inputs]
        raise DomainError(f"{kind}: {spec!r} does not take {shape}; usable here: {', '.join(valid)}")
    return functools.partial(fn, **options) if options else fn


def resolve_advantage(
    spec: str | Callable[..., Any], options: dict[str, Any] | None = None
) -> Callable[[Tensor], Tensor]:
    """Our advantage named ``spec`` (or a callable) with ``options`` bound; it must take only ``rewards [G, K]``.

    Example:
        >>> resolve_advantage("drgrpo")(torch.tensor([[1.0, 0.0]])).tolist()
        [[0.5, -0.5]]
    """
    return _resolve("advantage", ADVANTAGES, spec, options or {}, 1, "only grouped rewards [G, K]")


def resolve_policy_loss(spec: str | Callable[..., Any], options: dict[str, Any] | None = None) -> Callable[..., Any]:
    """Our policy loss named ``spec`` (or a callable) with ``options`` bound; signature ``(logp, logp_old, advantages, mask)``."""
    return _resolve("policy_loss", POLICY_LOSSES, spec, options or {}, 4, "(logp, logp_old, advantages, mask)")


def trl_advantages(
    rewards_per_func: Tensor, weights: Tensor, num_generations: int, advantage: Callable[[Tensor], Tensor]
) -> Tensor:
    r"""Our advantage on TRL's rewards: :math:`R_i = \sum_f w_f r_{if}` (None entries skipped), grouped ``[G, K]``.

    Args:
        rewards_per_func: ``[B, F]`` rewards of the generation batch (NaN where a function returned None),
            rows ordered prompt by prompt with ``num_generations`` consecutive rows each (TRL's order).
        weights: ``[F]`` ``reward_weights``. num_generations: K. advantage: ``[G, K] -> [G, K]``.

    Returns:
        ``[B]`` advantages in TRL's row order.

    Raises:
        DomainError: a completion that no reward function scored (our estimators need every reward).

    Example:
        >>> from posttrain.estimators import rloo_advantages
        >>> trl_advantages(torch.tensor([[1.0, 0.0], [0.0, float("nan")]]), torch.ones(2), 2, rloo_advantages).tolist()
        [1.0, -1.0]
    """
    unscored = torch.isnan(rewards_per_func).all(dim=1)
    if bool(unscored.any()):
        raise DomainError(
            f"reward_funcs: every reward function returned None for {int(unscored.sum())} completion(s); "
            "posttrain advantages need a reward for each completion"
        )
    rewards = (rewards_per_func * weights.to(rewards_per_func)).nansum(dim=1)
    if rewards.shape[0] % num_generations:
        raise DomainError(f"num_generations: {rewards.shape[0]} rewards do not split into groups of {num_generations}")
    return advantage(rewards.view(-1, num_generations)).reshape(-1)


def trl_policy_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    loss: Callable[..., Any],
    mode: AggregationMode | str,
    horizon: int | None = None,
    beta: float = 0.0,
    logp_ref: Tensor | None = None,
    is_ratio: Tensor | None = None,
    grad_accum_steps: int = 1,
) -> tuple[Tensor, Any]:
    r"""The scalar loss the adapted trainer returns for one micro-batch, and the loss's diagnostics.

    .. math:: \mathcal L = \frac{1}{n_{acc}}\,\mathrm{agg}\big(\rho \odot L(\ell, \ell_{old}, A) + \beta\,k_3(\ell, \ell_{ref})\big)

    with :math:`L` our per-token ``loss``, :math:`\rho` TRL's sampler-mismatch weights (``is_ratio``, when
    vLLM importance-sampling correction is on), :math:`k_3` our :func:`~posttrain.estimators.k3_kl`
    (TRL's KL term) and ``agg`` our :func:`~posttrain.estimators.aggregate` with ``horizon``.

    Args:
        logp, logp_old: ``[B, T]``. advantages: ``[B]`` or ``[B, T]``. mask: ``[B, T]`` boolean.
        loss: per-token loss (see :func:`resolve_policy_loss`). mode: aggregation. horizon: the constant of
        ``seq-mean-token-sum-norm``. beta, logp_ref: KL coefficient and reference log-probs.
        is_ratio: ``[B, T]`` or ``[B, 1]`` weights. grad_accum_steps: the divisor :math:`n_{acc}`.
    """
    out = loss(logp, logp_old, advantages, mask)
    per_token, diag = out if isinstance(out, tuple) else (out, None)
    if is_ratio is not None:
        per_token = per_token * is_ratio.detach()
    if beta != 0.0:
        if logp_ref is None:
            raise DomainError("logp_ref: required when beta != 0 (TRL computes it when its beta is non-zero)")
        per_token = per_token + beta * k3_kl(logp, logp_ref)
    return aggregate(per_token, mask, mode, horizon=horizon) / grad_accum_steps, diag


def completion_log_probs(model: Any, input_ids: Tensor, attention_mask: Tensor, t: int, temperature: float) -> Tensor:
    """``[B, T, V]`` log-softmax of the logits predicting the last ``t`` tokens (no grad; TRL's positions)."""
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -t - 1 : -1]
        return torch.log_softmax(logits.float() / temperature, dim=-1)


def sis_effective_logp_old(
    logp: Tensor,
    logp_old: Tensor,
    completion_ids: Tensor,
    topk_ids: Tensor,
    old_topk_logp: Tensor,
    cur_logp_full: Tensor,
    mask: Tensor,
    u: Tensor,
) -> tuple[Tensor, Tensor]:
    r"""SIS inside TRL: the rejection test, then :func:`~posttrain.estimators.sis.sis_logp_old`.

    Accept token :math:`t` with probability :math:`\mathbb 1[y_t\in\mathrm{topK}_\mu]\min(1, \rho_t/M_t)`
    (:func:`~posttrain.estimators.sis.sis_rejection_test`, the trainer hook's one-pass test; ``u`` the
    uniforms); returns
    ``(logp_old_eff [B, T], accepted [B, T])``, so any ratio loss on ``logp_old_eff`` is its SIS version.

    Args:
        logp, logp_old: ``[B, T]`` current and behaviour log-probs of the sampled tokens.
        completion_ids: ``[B, T]`` sampled tokens. topk_ids, old_topk_logp: ``[B, T, K]`` the behaviour's
        top-K ids and log-probs. cur_logp_full: ``[B, T, V]`` current log-probs. mask: ``[B, T]``.
        u: ``[B, T]`` Uniform(0, 1) draws.
    """
    cur_topk = cur_logp_full.gather(-1, topk_ids)
    in_topk = token_in_topk(completion_ids, topk_ids)
    accepted = sis_rejection_test(logp, logp_old, cur_topk, old_topk_logp, in_topk, u) & mask
    return sis_logp_old(logp, logp_old, accepted), accepted


_UNSUPPORTED = (
    ("top_entropy_quantile", lambda v: v is not None and v < 1.0, "top_entropy_quantile < 1"),
    ("off_policy_mask_threshold", lambda v: v is not None, "off_policy_mask_threshold"),
    ("_entropy_bonus_enabled", bool, "an entropy bonus (entropy_coef / use_adaptive_entropy)"),
    ("aux_loss_enabled", bool, "a router aux loss"),
    (
        "multi_objective_aggregation",
        lambda v: v == "normalize_then_sum",
        "multi_objective_aggregation=normalize_then_sum",
    ),
)


@functools.cache
def grpo_trainer_class() -> type:
    """``PosttrainGRPOTrainer``, a subclass of the installed TRL's ``GRPOTrainer`` (imports TRL)."""
    from trl import GRPOTrainer

    for hook in (
        "_calculate_rewards",
        "_generate_and_score_completions",
        "_compute_loss",
        "_get_per_token_logps_and_entropies",
    ):
        if not hasattr(GRPOTrainer, hook):
            raise DomainError(f"trl: this TRL's GRPOTrainer lacks {hook}; the adapter is checked against TRL 1.16")

    class PosttrainGRPOTrainer(GRPOTrainer):  # type: ignore[misc, valid-type]
        """``GRPOTrainer`` with our ``advantage``, ``policy_loss`` and ``aggregation`` (see the module docstring)."""

        def __init__(
            self,
            *args: Any,
            advantage: str | Callable[..., Any] = "grpo",
            advantage_options: dict[str, Any] | None = None,
            policy_loss: str | Callable[..., Any] = "ppo_clip",
            loss_options: dict[str, Any] | None = None,
            aggregation: AggregationMode | str = AggregationMode.SEQ_MEAN_TOKEN_MEAN,
            sis_top_k: int | None = None,
            **kwargs: Any,
        ) -> None:
            if sis_top_k is not None and int(sis_top_k) < 1:
                raise DomainError(f"sis_top_k: expected a positive number of behaviour tokens, got {sis_top_k!r}")
            self.posttrain_sis_top_k = sis_top_k
            self.posttrain_advantage = resolve_advantage(advantage, advantage_options)
            self.posttrain_loss = resolve_policy_loss(policy_loss, loss_options)
            self.posttrain_aggregation = AggregationMode.parse(aggregation)
            self._posttrain_rewards: Tensor | None = None
            super().__init__(*args, **kwargs)
            # SIS uniforms: a stream of their own, so SIS shifts no other random draw
            self.posttrain_sis_generator = torch.Generator().manual_seed(int(self.args.seed))
            bad = [what for attr, test, what in _UNSUPPORTED if test(getattr(self, attr, None))]
            if bad:
                raise DomainError(f"args: PosttrainGRPOTrainer does not reproduce {', '.join(bad)}; unset them")

        def _posttrain_training(self) -> bool:
            model: Any = self.model  # TRL's own test of train vs eval mode
            return bool(model.training)

        def _calculate_rewards(self, *args: Any, **kwargs: Any) -> Tensor:
            self._posttrain_rewards = super()._calculate_rewards(*args, **kwargs)
            return self._posttrain_rewards

        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
            out: dict[str, Any] = super()._generate_and_score_completions(inputs)
            if self._posttrain_rewards is None:
                raise DomainError("trl: _calculate_rewards was not called while scoring; this TRL is not supported")
            k: Any = self.num_generations
            if not self._posttrain_training():
                k = getattr(self, "num_generations_eval", None) or k
            adv = trl_advantages(self._posttrain_rewards, self.reward_weights, int(k), self.posttrain_advantage)
            b = out["completion_ids"].shape[0]
            start = self.accelerator.process_index * b
            out["advantages"] = adv[start : start + b].to(out["advantages"].dtype)
            if self.posttrain_sis_top_k is not None:  # the behaviour's top-K, stored with the batch
                ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
                attn = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
                full = completion_log_probs(self.model, ids, attn, out["completion_ids"].shape[1], self.temperature)
                top = full.topk(min(int(self.posttrain_sis_top_k), full.shape[-1]), dim=-1)
                out["posttrain_sis_topk_logp"], out["posttrain_sis_topk_ids"] = top.values, top.indices
            return out

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Tensor:
            completion_ids = inputs["completion_ids"]
            input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
            attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            mask = inputs["completion_mask"].bool()
            if "tool_mask" in inputs:
                mask = mask & inputs["tool_mask"].bool()
            logp = self._get_per_token_logps_and_entropies(model, input_ids, attention_mask, completion_ids.size(1))[0]
            old = inputs.get("old_per_token_logps")
            old = logp.detach() if old is None else old
            training = self._posttrain_training()
            metrics = self._metrics["train" if training else "eval"]
            if "posttrain_sis_topk_ids" in inputs:
                full = completion_log_probs(model, input_ids, attention_mask, completion_ids.size(1), self.temperature)
                u = torch.rand(logp.shape, generator=self.posttrain_sis_generator).to(logp.device)
                old, accepted = sis_effective_logp_old(
                    logp, old, completion_ids, inputs["posttrain_sis_topk_ids"],
                    inputs["posttrain_sis_topk_logp"], full, mask, u,
                )  # fmt: skip
                metrics["posttrain/sis_accept_rate"].append(float(masked_mean(accepted.to(logp.dtype), mask)))
            loss, diag = trl_policy_loss(
                logp,
                old,
                inputs["advantages"],
                mask,
                loss=self.posttrain_loss,
                mode=self.posttrain_aggregation,
                horizon=self.max_completion_length,
                beta=self.beta,
                logp_ref=inputs.get("ref_per_token_logps"),
                is_ratio=inputs.get("importance_sampling_ratio"),
                grad_accum_steps=self.current_gradient_accumulation_steps if training else 1,
            )
            clip = getattr(diag, "clip", diag)
            if hasattr(clip, "clip_frac"):
                metrics["posttrain/clip_frac"].append(float(clip.clip_frac))
            return loss

    return PosttrainGRPOTrainer


def __getattr__(name: str) -> Any:
    if name == "PosttrainGRPOTrainer":
        return grpo_trainer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
