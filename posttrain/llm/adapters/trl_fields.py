"""Every field TRL 1.16's ``GRPOConfig`` adds to ``TrainingArguments``, and what ``PosttrainGRPOTrainer`` does with it.

A field is either reproduced by our estimators (`Handling.ESTIMATOR`, tested equal to TRL's own
``_compute_loss`` and advantage code), acted on by TRL's own code that the adapter keeps, whose output
the adapter uses as TRL's loss does (`Handling.TRL`, tested the same way), refused at construction when
set to a value the adapter does not reproduce (`Handling.REFUSED`, `refused_settings`), or without
effect on advantages and the loss (`Handling.NONE`). ``tests/llm/adapters/test_trl_fields.py`` fails
for a field missing from `GRPO_FIELDS`, so a field a new TRL release adds is noticed. The fields of
``transformers.TrainingArguments`` are the training loop's (`TRAINING_ARGUMENTS`); of those, TRL's
loss reads only ``gradient_accumulation_steps`` (through ``current_gradient_accumulation_steps``, which the
adapter uses as TRL does).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from posttrain.errors import DomainError
from posttrain.llm.adapters.trl_recipe import LOSS_TYPES, SCALE_REWARDS

__all__ = ["GRPO_FIELDS", "TRAINING_ARGUMENTS", "Handling", "refused_settings"]


class Handling(str, Enum):
    """What the adapted trainer does with a ``GRPOConfig`` field."""

    ESTIMATOR = "estimator"
    TRL = "trl"
    REFUSED = "refused"
    NONE = "none"


_E, _T, _R, _N = Handling.ESTIMATOR, Handling.TRL, Handling.REFUSED, Handling.NONE
_SAMPLING = "generation sampling only: TRL's loss reads the sampled tokens, not this"
_VLLM_IS = "TRL computes importance_sampling_ratio (vLLM vs trainer log-probs); the loss is weighted by it as in TRL"
_OLD = "TRL decides from it when old_per_token_logps are computed; the ratio losses use them as TRL's loss does"

GRPO_FIELDS: dict[str, tuple[Handling, str]] = {
    # advantages and the loss: our estimators
    "loss_type": (
        _E,
        "grpo, bnpo, dr_grpo, dapo, luspo (clipped ratio) and cispo, with TRL's normalisers; sapo, vespo refused",
    ),
    "scale_rewards": (
        _E,
        "group: group_normalized_advantages(eps=1e-4); none: without the std; batch: batch_scaled_advantages",
    ),
    "beta": (_E, "adds beta * k3 (unclamped, as TRL) per token"),
    "use_bias_correction_kl": (_E, "the KL term times TRL's ratio pi/pi_old (token or sequence), gradient included"),
    "epsilon": (_E, "clip_low of the clipped-ratio loss (GSPO's with sequence-level ratios); in (0, 1)"),
    "epsilon_high": (_E, "clip_high (default epsilon); with loss_type=cispo the absolute cap (>= 1)"),
    "delta": (_E, "the dual clip c = delta (TRL's two-sided clip) if delta > 1 + epsilon_high; refused otherwise"),
    "importance_sampling_level": (_E, "token: clipped_ratio_loss; sequence: gspo_loss (refused with cispo)"),
    "max_completion_length": (_E, "the constant H of dr_grpo"),
    "reward_weights": (_E, "weights of the reward functions summed before the advantage"),
    "num_generations": (_E, "the group size K of the advantage (training)"),
    "num_generations_eval": (_E, "the group size K of the advantage (evaluation)"),
    # TRL's own code produces what the loss consumes
    "mask_truncated_completions": (
        _T,
        "TRL zeroes the mask of truncated completions; TRL's normalisers count those rows",
    ),
    "use_vllm": (_T, "the generation engine; with vllm_importance_sampling_correction it brings the mismatch weights"),
    "vllm_importance_sampling_correction": (_T, _VLLM_IS),
    "vllm_importance_sampling_mode": (_T, _VLLM_IS),
    "vllm_importance_sampling_clip_max": (_T, _VLLM_IS),
    "vllm_importance_sampling_clip_min": (_T, _VLLM_IS),
    "vllm_importance_sampling_cap": (_T, "deprecated alias of vllm_importance_sampling_clip_max (TRL copies it)"),
    "num_iterations": (_T, _OLD),
    "steps_per_generation": (_T, _OLD + "; also the token normaliser of dapo/cispo"),
    "generation_batch_size": (_T, "sets steps_per_generation (TRL)"),
    # refused when set
    "top_entropy_quantile": (_R, "the high-entropy token mask is not reproduced (values < 1 refused)"),
    "off_policy_mask_threshold": (_R, "TRL's off-policy sequence mask is not reproduced (any value refused)"),
    "entropy_coef": (_R, "the entropy bonus is not reproduced (non-zero refused)"),
    "use_adaptive_entropy": (_R, "the adaptive entropy bonus is not reproduced (True refused)"),
    "multi_objective_aggregation": (_R, "normalize_then_sum is not reproduced (refused)"),
    "router_aux_loss_coef": (_R, "a MoE router aux loss is not reproduced (refused when TRL enables it)"),
    # no effect on advantages or the loss
    "sapo_temperature_neg": (_N, "read only with loss_type=sapo (refused)"),
    "sapo_temperature_pos": (_N, "read only with loss_type=sapo (refused)"),
    "vespo_k_pos": (_N, "read only with loss_type=vespo (refused)"),
    "vespo_lambda_pos": (_N, "read only with loss_type=vespo (refused)"),
    "vespo_k_neg": (_N, "read only with loss_type=vespo (refused)"),
    "vespo_lambda_neg": (_N, "read only with loss_type=vespo (refused)"),
    "entropy_coef_min": (_N, "read only by the adaptive entropy bonus (refused)"),
    "entropy_coef_max": (_N, "read only by the adaptive entropy bonus (refused)"),
    "entropy_coef_delta": (_N, "read only by the adaptive entropy bonus (refused)"),
    "entropy_target": (_N, "read only by the adaptive entropy bonus (refused)"),
    "temperature": (_N, "TRL's log-prob helper divides the logits by it; the adapter calls the same helper"),
    "cast_lm_head_to_fp32": (_N, "precision of TRL's log-prob helper, which the adapter calls"),
    "disable_dropout": (_N, "model set-up"),
    "sync_ref_model": (_N, "TRL updates the reference model; the KL term reads its log-probs"),
    "ref_model_mixup_alpha": (_N, "TRL's reference-model update"),
    "ref_model_sync_steps": (_N, "TRL's reference-model update"),
    "model_init_kwargs": (_N, "model loading"),
    "trust_remote_code": (_N, "model loading"),
    "top_p": (_N, _SAMPLING),
    "top_k": (_N, _SAMPLING),
    "min_p": (_N, _SAMPLING),
    "repetition_penalty": (_N, _SAMPLING),
    "generation_kwargs": (_N, _SAMPLING),
    "cache_implementation": (_N, _SAMPLING),
    "chat_template_kwargs": (_N, "prompt formatting"),
    "max_tool_calling_iterations": (_N, "tool calls; TRL's tool mask reaches the loss mask as in TRL"),
    "ds3_gather_for_generation": (_N, "DeepSpeed generation"),
    "shuffle_dataset": (_N, "data order"),
    "pad_to_multiple_of": (_N, "padding: shapes only, masked positions never count"),
    "use_transformers_continuous_batching": (_N, "generation engine"),
    "transformers_continuous_batching_config": (_N, "generation engine"),
    "use_transformers_paged": (_N, "generation engine (deprecated)"),
    "vllm_mode": (_N, "vLLM set-up"),
    "vllm_model_impl": (_N, "vLLM set-up"),
    "vllm_enable_sleep_mode": (_N, "vLLM set-up"),
    "vllm_structured_outputs_regex": (_N, _SAMPLING),
    "vllm_server_base_url": (_N, "vLLM set-up"),
    "vllm_server_host": (_N, "vLLM set-up"),
    "vllm_server_port": (_N, "vLLM set-up"),
    "vllm_server_timeout": (_N, "vLLM set-up"),
    "vllm_group_port": (_N, "vLLM set-up"),
    "vllm_gpu_memory_utilization": (_N, "vLLM set-up"),
    "vllm_max_model_length": (_N, "vLLM set-up"),
    "vllm_tensor_parallel_size": (_N, "vLLM set-up"),
    "log_completions": (_N, "logging"),
    "log_multimodal": (_N, "logging"),
    "num_completions_to_print": (_N, "logging"),
    "log_unique_prompts": (_N, "logging"),
    "log_completions_hub_repo": (_N, "logging"),
}
"""``GRPOConfig`` field -> (handling, reason), for TRL 1.16."""

TRAINING_ARGUMENTS = (
    "transformers.TrainingArguments: the training loop (optimiser, schedule, precision, logging, saving); "
    "TRL's loss reads only gradient_accumulation_steps, through current_gradient_accumulation_steps"
)
"""The reason shared by the fields ``GRPOConfig`` inherits from ``TrainingArguments``."""

_REPLACED_BY_POLICY_LOSS = {"epsilon": 0.2, "epsilon_high": None, "delta": None, "importance_sampling_level": "token"}
"""TRL fields an explicit ``policy_loss`` replaces, with TRL's defaults (other values are refused beside it)."""

_READ = (
    "loss_type",
    "scale_rewards",
    "epsilon",
    "epsilon_high",
    "delta",
    "importance_sampling_level",
    "top_entropy_quantile",
    "off_policy_mask_threshold",
    "entropy_coef",
    "use_adaptive_entropy",
    "multi_objective_aggregation",
)


def _loss_refusals(args: Any) -> list[tuple[str, str]]:
    """TRL's loss settings the adapter does not reproduce: (field, why)."""
    out: list[tuple[str, str]] = []
    loss_type, level = args.loss_type, args.importance_sampling_level
    eps_high = args.epsilon if args.epsilon_high is None else args.epsilon_high
    if loss_type not in LOSS_TYPES:
        out.append(("loss_type", f"not reproduced; reproduced: {', '.join(LOSS_TYPES)}"))
    if args.scale_rewards not in SCALE_REWARDS:
        out.append(("scale_rewards", f"expected one of {', '.join(SCALE_REWARDS)}"))
    if getattr(args, "policy_loss", None) is not None:  # ours replaces TRL's loss settings (`_replaced`)
        return out
    if level not in ("token", "sequence"):
        out.append(("importance_sampling_level", "expected 'token' or 'sequence'"))
    if loss_type == "cispo":
        if level == "sequence":
            out.append(("importance_sampling_level", "'sequence' with loss_type='cispo' is not reproduced"))
        if not eps_high >= 1.0:
            out.append(("epsilon_high", f"with loss_type='cispo' it caps the ratio; expected >= 1, got {eps_high!r}"))
        return out
    if not 0.0 < args.epsilon < 1.0:
        out.append(("epsilon", "expected a value in (0, 1)"))
    if not eps_high > 0.0:
        out.append(("epsilon_high", "expected a positive value"))
    if args.delta is not None and level == "sequence":
        out.append(("delta", "the two-sided clip with importance_sampling_level='sequence' is not reproduced"))
    elif args.delta is not None and not args.delta > 1.0 + eps_high:
        out.append(("delta", f"reproduced (as the dual clip) only for delta > 1 + epsilon_high = {1.0 + eps_high:g}"))
    return out


def _unsupported(args: Any) -> list[tuple[str, str]]:
    """TRL features outside the loss the adapter reproduces: (field, why)."""
    checks = (
        ("top_entropy_quantile", args.top_entropy_quantile < 1.0, "the high-entropy token mask is not reproduced"),
        ("off_policy_mask_threshold", args.off_policy_mask_threshold is not None, "the off-policy sequence mask is not reproduced"),
        ("entropy_coef", args.entropy_coef != 0.0, "the entropy bonus is not reproduced"),
        ("use_adaptive_entropy", bool(args.use_adaptive_entropy), "the adaptive entropy bonus is not reproduced"),
        ("multi_objective_aggregation", args.multi_objective_aggregation != "sum_then_normalize", "only sum_then_normalize is reproduced"),
    )  # fmt: skip
    return [(field, why) for field, bad, why in checks if bad]


def _replaced(args: Any) -> list[tuple[str, str]]:
    """TRL fields set beside the option of ours that replaces them: (field, why)."""
    out: list[tuple[str, str]] = []
    advantage, loss, aggregation = (getattr(args, k, None) for k in ("advantage", "policy_loss", "aggregation"))
    if advantage is not None and args.scale_rewards != "group":
        out.append(("scale_rewards", f"replaced by advantage={advantage!r}; leave it at 'group' or unset advantage"))
    if loss is not None:
        for field, default in _REPLACED_BY_POLICY_LOSS.items():
            if getattr(args, field) != default:
                out.append((field, f"replaced by policy_loss={loss!r} (use loss_options); leave it at {default!r}"))
        if args.loss_type == "cispo":
            out.append(("loss_type", f"'cispo' names a loss, replaced by policy_loss={loss!r}"))
    if aggregation is not None and args.loss_type != "dapo":
        out.append(("loss_type", f"replaced by aggregation={aggregation!r}; leave it at 'dapo' or unset aggregation"))
    return out


def refused_settings(args: Any) -> list[str]:
    """One line per setting of ``args`` that ``PosttrainGRPOTrainer`` does not reproduce, each naming its field.

    ``args`` is a ``GRPOConfig`` (or anything with its fields), with ``PosttrainGRPOConfig``'s ``advantage``,
    ``policy_loss`` and ``aggregation`` where present. A MoE router aux loss needs the model and is refused
    by the trainer.

    Raises:
        DomainError: ``args`` lacks a field this check reads (a TRL release that renamed it).

    Examples:
        >>> from types import SimpleNamespace
        >>> args = SimpleNamespace(loss_type="dapo", scale_rewards="group", epsilon=0.2, epsilon_high=None,
        ...     delta=1.1, importance_sampling_level="token", top_entropy_quantile=0.2, off_policy_mask_threshold=None,
        ...     entropy_coef=0.0, use_adaptive_entropy=False, multi_objective_aggregation="sum_then_normalize")
        >>> for line in refused_settings(args): print(line)
        delta=1.1: reproduced (as the dual clip) only for delta > 1 + epsilon_high = 1.2
        top_entropy_quantile=0.2: the high-entropy token mask is not reproduced
    """
    missing = [name for name in _READ if not hasattr(args, name)]
    if missing:
        raise DomainError(
            f"args: this TRL's GRPOConfig lacks {', '.join(missing)}; the adapter is tested with TRL 1.16"
        )
    found = [*_loss_refusals(args), *_unsupported(args), *_replaced(args)]
    return [f"{field}={getattr(args, field)!r}: {why}" for field, why in found]
