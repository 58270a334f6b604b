r"""TRL adapter: ``GRPOTrainer`` whose advantages and loss are our estimators, equal to TRL's or refused.

TRL has no estimator registry; its supported extension point is a subclass (integrations.md section 2.2).
As TRL's own trainers do, the options live in a config class: ``PosttrainGRPOConfig`` is a ``GRPOConfig``
with the fields below, so they come from ``TrlParser`` (command line or YAML), are saved with the run's
args and show in ``args.to_dict()``. ``PosttrainGRPOTrainer`` takes the usual ``GRPOTrainer`` arguments
with ``args=PosttrainGRPOConfig(...)``. Both classes are built on first access, so importing this module
does not import TRL.

With none of our options set, the trainer computes TRL's advantages and loss from TRL's own fields
(``loss_type``, ``scale_rewards``, ``epsilon``/``epsilon_high``, ``delta``, ``importance_sampling_level``,
``beta``, ``use_bias_correction_kl``, ...) with our estimators (`trl_recipe`; every ``GRPOConfig`` field is
classified in `GRPO_FIELDS`), tested equal in value and gradient to TRL 1.16's ``_compute_loss`` and
advantage code; a setting it does not reproduce is refused when the config is built, one line per field
(`refused_settings`). Our options replace TRL's where set:

- ``advantage``: a name of our advantage registry whose only input is grouped rewards ``[G, K]``
  (``grpo``, ``drgrpo``, ``rloo``; register your own with `register_advantage`); ``advantage_options``
  are bound keywords (a dict, or a JSON string on the command line). Replaces ``scale_rewards``;
- ``policy_loss``: a name of our policy-loss registry with the signature
  ``(logp, logp_old, advantages, mask, **options)`` (``ppo_clip``, ``gspo``, ``cispo``, ``truncated_is``,
  ``no_is_correction``, ...); ``loss_options`` are bound keywords (e.g.
  ``{"clip_high": 0.28, "dual_clip": 3.0}``). Replaces ``epsilon``, ``epsilon_high``, ``delta`` and
  ``importance_sampling_level`` (which must keep TRL's defaults beside it);
- ``aggregation``: an `AggregationMode`, our `aggregate` (rows with no token are left out of sequence
  means; ``seq-mean-token-sum-norm`` uses ``max_completion_length`` as the constant; ``token-mean`` divides
  by the token count of the whole generation batch, as TRL's ``dapo``). Replaces the normaliser of
  ``loss_type`` (which must keep its default ``dapo`` beside it);
- ``sis_top_k``: selective importance sampling (Li et al. 2026, arXiv:2607.04728) on top of the policy
  loss: at generation one no-grad forward stores the behaviour's top-K token ids and log-probs with the
  batch; every loss computation runs one more no-grad forward of the current policy, accepts tokens by
  `sis_rejection_test` (uniforms from the trainer's own generator, seeded by ``args.seed``) and feeds
  `sis_effective_logp_old` to the loss (the KL correction keeps the true behaviour log-probs). It only
  matters when updates are off-policy (``num_iterations > 1`` or ``steps_per_generation`` > accumulation
  steps).

Hooks (private TRL methods, checked to exist when the class is built; tested against TRL 1.16, the
``[trl]`` extra's pin): ``_calculate_rewards`` is wrapped to keep the per-function rewards of the
generation batch (gathered over processes); ``_generate_and_score_completions`` then replaces TRL's
advantages by ours on the weighted sum of those rewards, grouped by ``num_generations``, sliced to this
process's rows (TRL's masks, old, reference and vLLM log-probs and mismatch weights are kept);
``_compute_loss`` recomputes the token log-probs with TRL's own helper and returns `trl_policy_loss`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import AggregationMode, masked_mean, sis_logp_old
from posttrain.estimators.importance import sis_rejection_test
from posttrain.llm.adapters.trl_fields import refused_settings
from posttrain.llm.adapters.trl_recipe import kl_term, trl_advantages, trl_policy_loss, trl_recipe

__all__ = [
    "completion_log_probs",
    "grpo_config_class",
    "grpo_trainer_class",
    "sis_effective_logp_old",
]


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
    r"""SIS inside TRL: the rejection test, then `sis_logp_old`.

    Accept token $t$ with probability $\min(1, \rho_t/M_t)$, the released test (no top-K
    membership rule; `sis_rejection_test`, the trainer hook's one-pass test; ``u`` the
    uniforms); returns
    ``(logp_old_eff [B, T], accepted [B, T])``, so any ratio loss on ``logp_old_eff`` is its SIS version.

    Args:
        logp, logp_old: ``[B, T]`` current and behaviour log-probs of the sampled tokens.
        completion_ids: ``[B, T]`` sampled tokens. topk_ids, old_topk_logp: ``[B, T, K]`` the behaviour's
            top-K ids and log-probs. cur_logp_full: ``[B, T, V]`` current log-probs. mask: ``[B, T]``.
        u: ``[B, T]`` Uniform(0, 1) draws.
    """
    cur_topk = cur_logp_full.gather(-1, topk_ids)
    accepted = sis_rejection_test(logp, logp_old, cur_topk, old_topk_logp, None, u) & mask  # completion_ids unused
    return sis_logp_old(logp, logp_old, accepted), accepted


_HOOKS = (
    "_calculate_rewards",
    "_generate_and_score_completions",
    "_compute_loss",
    "_get_per_token_logps_and_entropies",
)

_FORWARD_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)
"""The batch entries TRL 1.16's ``_compute_loss`` hands to its log-prob helper (multimodal inputs)."""


def _refuse(args: Any) -> None:
    bad = refused_settings(args)
    if bad:
        raise DomainError("args: PosttrainGRPOTrainer does not reproduce these settings:\n" + "\n".join(bad))


_HELP = {
    "advantage": "Our advantage estimator (a name of posttrain's advantage registry taking rewards [G, K]); "
    "None: TRL's, from scale_rewards.",
    "advantage_options": "Keyword options of the advantage estimator (a dict, or JSON on the command line).",
    "policy_loss": "Our per-token policy loss (a name of posttrain's policy-loss registry); None: TRL's, from "
    "loss_type, epsilon, epsilon_high, delta and importance_sampling_level.",
    "loss_options": 'Keyword options of the policy loss, e.g. {"clip_high": 0.28, "dual_clip": 3.0}.',
    "aggregation": "How the [B, T] loss becomes a scalar (posttrain's AggregationMode); None: TRL's, from loss_type.",
    "sis_top_k": "Selective importance sampling on the behaviour's top-K tokens (None: off).",
}
"""The fields ``PosttrainGRPOConfig`` adds to ``GRPOConfig``, with their help text."""


@functools.cache
def grpo_config_class() -> type:
    """``PosttrainGRPOConfig``, a dataclass subclass of the installed TRL's ``GRPOConfig`` (imports TRL).

    Its fields (module docstring) parse with ``TrlParser`` from the command line or YAML, and the
    option dicts from JSON strings, as ``GRPOConfig``'s own dict fields. Building one refuses the settings
    the adapted trainer does not reproduce (`refused_settings`, one line per field).
    """
    from trl import GRPOConfig

    taken = [name for name in _HELP if name in {f.name for f in dataclasses.fields(GRPOConfig)}]
    if taken:
        raise DomainError(
            f"trl: this TRL's GRPOConfig already has {', '.join(taken)}; the adapter is tested with TRL 1.16"
        )

    @dataclasses.dataclass
    class PosttrainGRPOConfig(GRPOConfig):  # type: ignore[misc, valid-type]
        """``GRPOConfig`` plus posttrain's ``advantage``, ``policy_loss``, ``aggregation`` and ``sis_top_k``."""

        _VALID_DICT_FIELDS: ClassVar[list[str]] = [*GRPOConfig._VALID_DICT_FIELDS, "advantage_options", "loss_options"]

        advantage: str | None = dataclasses.field(default=None, metadata={"help": _HELP["advantage"]})
        advantage_options: dict[str, Any] | str | None = dataclasses.field(
            default=None, metadata={"help": _HELP["advantage_options"]}
        )
        policy_loss: str | None = dataclasses.field(default=None, metadata={"help": _HELP["policy_loss"]})
        loss_options: dict[str, Any] | str | None = dataclasses.field(
            default=None, metadata={"help": _HELP["loss_options"]}
        )
        aggregation: str | None = dataclasses.field(default=None, metadata={"help": _HELP["aggregation"]})
        sis_top_k: int | None = dataclasses.field(default=None, metadata={"help": _HELP["sis_top_k"]})

        def __post_init__(self) -> None:
            super().__post_init__()  # parses JSON strings of the _VALID_DICT_FIELDS
            for name, owner in (("advantage_options", "advantage"), ("loss_options", "policy_loss")):
                value = getattr(self, name)
                if value is not None and not isinstance(value, dict):
                    raise DomainError(f"{name}: expected a dict (or a JSON object string), got {value!r}")
                if value is not None and getattr(self, owner) is None:
                    raise DomainError(f"{name}: options of our {owner}, which is not set (TRL's is used)")
            if self.sis_top_k is not None and int(self.sis_top_k) < 1:
                raise DomainError(f"sis_top_k: expected a positive number of behaviour tokens, got {self.sis_top_k!r}")
            if self.aggregation is not None:
                self.aggregation = AggregationMode.parse(self.aggregation).value
            _refuse(self)
            trl_recipe(self)  # unknown names and bad options fail here, not mid-run

    return PosttrainGRPOConfig


@functools.cache
def grpo_trainer_class() -> type:
    """``PosttrainGRPOTrainer``, a subclass of the installed TRL's ``GRPOTrainer`` (imports TRL)."""
    from trl import GRPOTrainer

    for hook in _HOOKS:
        if not hasattr(GRPOTrainer, hook):
            raise DomainError(f"trl: this TRL's GRPOTrainer lacks {hook}; the adapter is tested with TRL 1.16")
    config_class: Any = grpo_config_class()

    class PosttrainGRPOTrainer(GRPOTrainer):  # type: ignore[misc, valid-type]
        """``GRPOTrainer`` whose advantages and loss are `trl_recipe` of ``args`` (a ``PosttrainGRPOConfig``)."""

        def __init__(self, model: Any, reward_funcs: Any = None, args: Any = None, *rest: Any, **kwargs: Any) -> None:
            if args is None:  # as GRPOTrainer does, with our config
                name = model if isinstance(model, str) else model.config._name_or_path
                args = config_class(f"{name.split('/')[-1]}-GRPO")
            if not isinstance(args, config_class):
                raise DomainError(
                    f"args: expected a PosttrainGRPOConfig (posttrain.llm.adapters.trl), got {type(args).__name__}"
                )
            _refuse(args)  # again: the fields may have changed since the config was built
            self.posttrain_recipe = trl_recipe(args)
            self.posttrain_sis_top_k = args.sis_top_k
            self._posttrain_rewards: Tensor | None = None
            super().__init__(model, reward_funcs, args, *rest, **kwargs)
            if getattr(self, "aux_loss_enabled", False):
                raise DomainError(
                    f"router_aux_loss_coef={self.router_aux_loss_coef!r}: the MoE router aux loss is not reproduced; "
                    "set router_aux_loss_coef=0"
                )
            # SIS uniforms: a stream of their own, so SIS shifts no other random draw
            self.posttrain_sis_generator = torch.Generator().manual_seed(int(self.args.seed))

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
            k = self.args.num_generations
            if not self._posttrain_training():
                k = self.args.num_generations_eval or k
            advantage = self.posttrain_recipe.advantage
            adv = trl_advantages(self._posttrain_rewards, self.reward_weights, int(k), advantage)
            b = out["completion_ids"].shape[0]
            start = self.accelerator.process_index * b
            out["advantages"] = adv[start : start + b].to(out["advantages"].dtype)
            if self.posttrain_sis_top_k is not None:  # the behaviour's top-K, stored with the batch
                ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
                attn = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
                full = completion_log_probs(
                    self.model, ids, attn, out["completion_ids"].shape[1], self.args.temperature
                )
                top = full.topk(min(int(self.posttrain_sis_top_k), full.shape[-1]), dim=-1)
                out["posttrain_sis_topk_logp"], out["posttrain_sis_topk_ids"] = top.values, top.indices
            return out

        def _token_normalizer(self, inputs: dict[str, Any], training: bool) -> Tensor | None:
            """TRL's ``dapo`` normaliser: the generation batch's token count per process and accumulation window."""
            count = inputs.get("num_items_in_batch")
            if count is None:
                return None
            normalizer = torch.as_tensor(count).clamp(min=1.0) / self.accelerator.num_processes
            if training:
                steps_per_generation = self.args.steps_per_generation or self.args.gradient_accumulation_steps
                normalizer = normalizer * self.current_gradient_accumulation_steps / steps_per_generation
            return normalizer

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Tensor:
            completion_ids = inputs["completion_ids"]
            input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
            attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
            mask = inputs["completion_mask"].bool()
            if "tool_mask" in inputs:
                mask = mask & inputs["tool_mask"].bool()
            forward = {key: inputs.get(key) for key in _FORWARD_KEYS}
            logp = self._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, completion_ids.size(1), **forward
            )[0]
            behaviour = inputs.get("old_per_token_logps")
            behaviour = logp.detach() if behaviour is None else behaviour
            old = behaviour
            training = self._posttrain_training()
            metrics = self._metrics["train" if training else "eval"]
            if "posttrain_sis_topk_ids" in inputs:
                full = completion_log_probs(
                    model, input_ids, attention_mask, completion_ids.size(1), self.args.temperature
                )
                u = torch.rand(logp.shape, generator=self.posttrain_sis_generator).to(logp.device)
                old, accepted = sis_effective_logp_old(
                    logp, old, completion_ids, inputs["posttrain_sis_topk_ids"],
                    inputs["posttrain_sis_topk_logp"], full, mask, u,
                )  # fmt: skip
                metrics["posttrain/sis_accept_rate"].append(float(masked_mean(accepted.to(logp.dtype), mask)))
            recipe, beta = self.posttrain_recipe, float(self.args.beta)
            kl = None
            if beta != 0.0:
                kl = kl_term(
                    logp,
                    behaviour,
                    inputs["ref_per_token_logps"],
                    mask,
                    bias_correction=bool(self.args.use_bias_correction_kl),
                    sequence=recipe.sequence_ratio,
                )
            loss, diag = trl_policy_loss(
                logp,
                old,
                inputs["advantages"],
                mask,
                loss=recipe.loss,
                aggregation=recipe.aggregation,
                horizon=self.args.max_completion_length,
                beta=beta,
                kl=kl,
                is_ratio=inputs.get("importance_sampling_ratio"),
                grad_accum_steps=self.current_gradient_accumulation_steps if training else 1,
                token_normalizer=self._token_normalizer(inputs, training),
            )
            clip = getattr(diag, "clip", diag)
            if hasattr(clip, "clip_frac"):
                metrics["posttrain/clip_frac"].append(float(clip.clip_frac))
            return loss

    return PosttrainGRPOTrainer


def __getattr__(name: str) -> Any:
    if name == "PosttrainGRPOTrainer":
        return grpo_trainer_class()
    if name == "PosttrainGRPOConfig":
        return grpo_config_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
