r"""TRL adapter: ``GRPOTrainer`` with our advantage estimator, policy loss and aggregation.

TRL has no estimator registry; its supported extension point is a subclass (integrations.md section 2.2).
As TRL's own trainers do, the options live in a config class: ``PosttrainGRPOConfig`` is a ``GRPOConfig``
with the fields below, so they come from ``TrlParser`` (command line or YAML), are saved with the run's
args and show in ``args.to_dict()``. ``PosttrainGRPOTrainer`` takes the usual ``GRPOTrainer`` arguments
with ``args=PosttrainGRPOConfig(...)``. Both classes are built on first access, so importing this module
does not import TRL. The fields:

- ``advantage``: a name of our advantage registry whose only input is grouped rewards ``[G, K]``
  (``grpo``, ``drgrpo``, ``rloo``; register your own with
  `register_advantage`); ``advantage_options`` are bound keywords
  (a dict, or a JSON string on the command line);
- ``policy_loss``: a name of our policy-loss registry with the signature
  ``(logp, logp_old, advantages, mask, **options)`` (``ppo_clip``, ``gspo``, ``truncated_is``,
  ``no_is_correction``, ...); ``loss_options`` are bound keywords (e.g.
  ``{"clip_high": 0.28, "dual_clip": 3.0}``);
- ``aggregation``: an `AggregationMode` (``seq-mean-token-sum-norm`` uses
  ``max_completion_length`` as the constant, as TRL's ``dr_grpo``; ``token-mean`` divides by the token
  count of the whole generation batch, as TRL's ``dapo``);
- ``sis_top_k``: selective importance sampling (Li et al. 2026, arXiv:2607.04728) on top of the policy
  loss: at generation one no-grad forward stores the behaviour's top-K token ids and log-probs with the
  batch; every loss computation runs one more no-grad forward of the current policy, accepts tokens by
  `sis_rejection_test` (uniforms from the trainer's own generator,
  seeded by ``args.seed``) and feeds `sis_effective_logp_old` to the loss. It only matters when
  updates are off-policy (``num_iterations > 1`` or ``steps_per_generation`` > accumulation steps).

Hooks (private TRL methods, checked to exist when the class is built; tested against TRL 1.16, the
``[trl]`` extra's pin): ``_calculate_rewards`` is wrapped to keep the per-function rewards of the
generation batch (gathered over processes); ``_generate_and_score_completions`` then replaces TRL's
advantages by ours on the weighted sum of those rewards, grouped by ``num_generations``, sliced to this
process's rows; ``_compute_loss`` recomputes the token log-probs with TRL's own helper and returns
`trl_policy_loss`. TRL's ``loss_type``, ``scale_rewards``, ``epsilon*`` and
``importance_sampling_level`` are then not used (our options replace them); settings whose effect the
adapter does not reproduce (entropy bonus, top-entropy masking, off-policy masking,
``normalize_then_sum``, a MoE router aux loss) raise, read from the public ``GRPOConfig`` fields
(`unsupported_settings`; a TRL without one of those fields is refused).

Micro-batching: sequence modes (``seq-mean-*``) divide each micro-batch's loss by the
gradient-accumulation steps, so they sum to the full-batch value for equal micro-batches; ``token-mean``
divides the micro-batch's token sum by TRL's ``num_items_in_batch`` (the loss-token count of the
generation batch over all processes) rescaled to one accumulation window, exactly TRL's ``dapo``
normaliser, so the accumulated, data-parallel-averaged gradient is the token mean of the generation batch.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import ADVANTAGES, POLICY_LOSSES, AggregationMode, aggregate, k3_kl, masked_mean, masked_sum
from posttrain.estimators.sis import sis_logp_old, sis_rejection_test

__all__ = [
    "GUARDED_ARGS",
    "completion_log_probs",
    "grpo_config_class",
    "grpo_trainer_class",
    "resolve_advantage",
    "resolve_policy_loss",
    "sis_effective_logp_old",
    "trl_advantages",
    "trl_policy_loss",
    "unsupported_settings",
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

    Examples:
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
    r"""Our advantage on TRL's rewards: $R_i = \sum_f w_f r_{if}$ (None entries skipped), grouped ``[G, K]``.

    Args:
        rewards_per_func: ``[B, F]`` rewards of the generation batch (NaN where a function returned None),
            rows ordered prompt by prompt with ``num_generations`` consecutive rows each (TRL's order).
        weights: ``[F]`` ``reward_weights``. num_generations: K. advantage: ``[G, K] -> [G, K]``.

    Returns:
        ``[B]`` advantages in TRL's row order.

    Raises:
        DomainError: a completion that no reward function scored (our estimators need every reward).

    Examples:
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
    token_normalizer: Tensor | float | None = None,
) -> tuple[Tensor, Any]:
    r"""The scalar loss the adapted trainer returns for one micro-batch, and the loss's diagnostics.

    $$
    \mathcal L = \frac{1}{n_{acc}}\,\mathrm{agg}(X),\qquad
            X = \rho \odot L(\ell, \ell_{old}, A) + \beta\,k_3(\ell, \ell_{ref})
    $$

    with $L$ our per-token ``loss``, $\rho$ TRL's sampler-mismatch weights (``is_ratio``, when
    vLLM importance-sampling correction is on), $k_3$ our `k3_kl`
    (TRL's KL term) and ``agg`` our `aggregate` with ``horizon``. For
    ``token-mean`` with ``token_normalizer`` $N$ given, $\mathcal L = \sum m X / N$ instead
    (TRL's ``dapo``: $N$ is the generation batch's token count per process and accumulation window).

    Args:
        logp, logp_old: ``[B, T]``. advantages: ``[B]`` or ``[B, T]``. mask: ``[B, T]`` boolean.
        loss: per-token loss (see `resolve_policy_loss`). mode: aggregation. horizon: the constant of
            ``seq-mean-token-sum-norm``. beta, logp_ref: KL coefficient and reference log-probs.
        is_ratio: ``[B, T]`` or ``[B, 1]`` weights. grad_accum_steps: the divisor $n_{acc}$.
        token_normalizer: $N$ for ``token-mean`` (then ``grad_accum_steps`` is not applied: $N$
            already spans the accumulation window); ignored by the other modes.

    Examples:
        >>> from posttrain.estimators import no_correction_loss
        >>> lp, m = torch.zeros(1, 3), torch.tensor([[True, True, False]])
        >>> adv = torch.ones(1)
        >>> round(float(trl_policy_loss(lp, lp, adv, m, loss=no_correction_loss, mode="token-mean")[0]), 4)
        -1.0
        >>> float(trl_policy_loss(lp, lp, adv, m, loss=no_correction_loss, mode="token-mean", token_normalizer=4.0)[0])
        -0.5
    """
    out = loss(logp, logp_old, advantages, mask)
    per_token, diag = out if isinstance(out, tuple) else (out, None)
    if is_ratio is not None:
        per_token = per_token * is_ratio.detach()
    if beta != 0.0:
        if logp_ref is None:
            raise DomainError("logp_ref: required when beta != 0 (TRL computes it when its beta is non-zero)")
        per_token = per_token + beta * k3_kl(logp, logp_ref)
    if token_normalizer is not None and AggregationMode.parse(mode) is AggregationMode.TOKEN_MEAN:
        return masked_sum(per_token, mask) / token_normalizer, diag
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


GUARDED_ARGS = (
    "top_entropy_quantile",
    "off_policy_mask_threshold",
    "entropy_coef",
    "use_adaptive_entropy",
    "multi_objective_aggregation",
    "router_aux_loss_coef",
)
"""The public ``GRPOConfig`` fields `unsupported_settings` reads (a TRL without one is refused)."""

_HOOKS = (
    "_calculate_rewards",
    "_generate_and_score_completions",
    "_compute_loss",
    "_get_per_token_logps_and_entropies",
)


def unsupported_settings(args: Any, model_config: Any = None) -> list[str]:
    """The settings of ``args`` (a ``GRPOConfig``) whose effect the adapted trainer does not reproduce.

    Read from public fields only: ``top_entropy_quantile < 1``, ``off_policy_mask_threshold``, an entropy
    bonus (``entropy_coef != 0`` or ``use_adaptive_entropy``), ``multi_objective_aggregation =
    normalize_then_sum``, and a router aux loss (a MoE ``model_config`` with ``output_router_logits`` and a
    non-zero ``router_aux_loss_coef`` from ``args`` or, when that is None, from the model config).

    Raises:
        DomainError: ``args`` lacks one of `GUARDED_ARGS` (a TRL release that renamed it).

    Examples:
        >>> from types import SimpleNamespace
        >>> unsupported_settings(SimpleNamespace(top_entropy_quantile=0.2, off_policy_mask_threshold=None,
        ...     entropy_coef=0.0, use_adaptive_entropy=False, multi_objective_aggregation="sum_then_normalize",
        ...     router_aux_loss_coef=None))
        ['top_entropy_quantile < 1']
    """
    missing = [name for name in GUARDED_ARGS if not hasattr(args, name)]
    if missing:
        raise DomainError(
            f"args: this TRL's GRPOConfig lacks {', '.join(missing)}; the adapter is tested with TRL 1.16"
        )
    text_config = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    coef = args.router_aux_loss_coef
    coef = getattr(text_config, "router_aux_loss_coef", 0.0) if coef is None else coef
    checks = (
        (args.top_entropy_quantile < 1.0, "top_entropy_quantile < 1"),
        (args.off_policy_mask_threshold is not None, "off_policy_mask_threshold"),
        (
            args.entropy_coef != 0.0 or bool(args.use_adaptive_entropy),
            "an entropy bonus (entropy_coef / use_adaptive_entropy)",
        ),
        (args.multi_objective_aggregation == "normalize_then_sum", "multi_objective_aggregation=normalize_then_sum"),
        (hasattr(text_config, "output_router_logits") and bool(coef), "a router aux loss (router_aux_loss_coef)"),
    )
    return [what for bad, what in checks if bad]


_HELP = {
    "advantage": "Our advantage estimator (a name of posttrain's advantage registry taking rewards [G, K]).",
    "advantage_options": "Keyword options of the advantage estimator (a dict, or JSON on the command line).",
    "policy_loss": "Our per-token policy loss (a name of posttrain's policy-loss registry).",
    "loss_options": 'Keyword options of the policy loss, e.g. {"clip_high": 0.28, "dual_clip": 3.0}.',
    "aggregation": "How the [B, T] loss becomes a scalar (posttrain's AggregationMode).",
    "sis_top_k": "Selective importance sampling on the behaviour's top-K tokens (None: off).",
}
"""The fields ``PosttrainGRPOConfig`` adds to ``GRPOConfig``, with their help text."""


@functools.cache
def grpo_config_class() -> type:
    """``PosttrainGRPOConfig``, a dataclass subclass of the installed TRL's ``GRPOConfig`` (imports TRL).

    Its fields (module docstring) parse with ``TrlParser`` from the command line or YAML, and the
    option dicts from JSON strings, as ``GRPOConfig``'s own dict fields.
    """
    from trl import GRPOConfig

    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    missing = [name for name in GUARDED_ARGS if name not in names]
    taken = [name for name in _HELP if name in names]
    if missing or taken:
        raise DomainError(
            f"trl: this TRL's GRPOConfig {'lacks ' + ', '.join(missing) if missing else 'already has ' + ', '.join(taken)}"
            "; the adapter is tested with TRL 1.16"
        )

    @dataclasses.dataclass
    class PosttrainGRPOConfig(GRPOConfig):  # type: ignore[misc, valid-type]
        """``GRPOConfig`` plus posttrain's ``advantage``, ``policy_loss``, ``aggregation`` and ``sis_top_k``."""

        _VALID_DICT_FIELDS: ClassVar[list[str]] = [*GRPOConfig._VALID_DICT_FIELDS, "advantage_options", "loss_options"]

        advantage: str = dataclasses.field(default="grpo", metadata={"help": _HELP["advantage"]})
        advantage_options: dict[str, Any] | str | None = dataclasses.field(
            default=None, metadata={"help": _HELP["advantage_options"]}
        )
        policy_loss: str = dataclasses.field(default="ppo_clip", metadata={"help": _HELP["policy_loss"]})
        loss_options: dict[str, Any] | str | None = dataclasses.field(
            default=None, metadata={"help": _HELP["loss_options"]}
        )
        aggregation: str = dataclasses.field(default="seq-mean-token-mean", metadata={"help": _HELP["aggregation"]})
        sis_top_k: int | None = dataclasses.field(default=None, metadata={"help": _HELP["sis_top_k"]})

        def __post_init__(self) -> None:
            super().__post_init__()  # parses JSON strings of the _VALID_DICT_FIELDS
            options: dict[str, dict[str, Any] | None] = {}
            for name in ("advantage_options", "loss_options"):
                value = getattr(self, name)
                if value is not None and not isinstance(value, dict):
                    raise DomainError(f"{name}: expected a dict (or a JSON object string), got {value!r}")
                options[name] = value
            if self.sis_top_k is not None and int(self.sis_top_k) < 1:
                raise DomainError(f"sis_top_k: expected a positive number of behaviour tokens, got {self.sis_top_k!r}")
            self.aggregation = AggregationMode.parse(self.aggregation).value
            resolve_advantage(self.advantage, options["advantage_options"])  # unknown names fail here, not mid-run
            resolve_policy_loss(self.policy_loss, options["loss_options"])

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
        """``GRPOTrainer`` with our ``advantage``, ``policy_loss`` and ``aggregation`` from ``args`` (a ``PosttrainGRPOConfig``)."""

        def __init__(self, model: Any, reward_funcs: Any = None, args: Any = None, *rest: Any, **kwargs: Any) -> None:
            if args is None:  # as GRPOTrainer does, with our config
                name = model if isinstance(model, str) else model.config._name_or_path
                args = config_class(f"{name.split('/')[-1]}-GRPO")
            if not isinstance(args, config_class):
                raise DomainError(
                    f"args: expected a PosttrainGRPOConfig (posttrain.llm.adapters.trl), got {type(args).__name__}"
                )
            self.posttrain_sis_top_k = args.sis_top_k
            self.posttrain_advantage = resolve_advantage(args.advantage, args.advantage_options)
            self.posttrain_loss = resolve_policy_loss(args.policy_loss, args.loss_options)
            self.posttrain_aggregation = AggregationMode.parse(args.aggregation)
            self._posttrain_rewards: Tensor | None = None
            super().__init__(model, reward_funcs, args, *rest, **kwargs)
            bad = unsupported_settings(self.args, self.model.config)
            if bad:
                raise DomainError(f"args: PosttrainGRPOTrainer does not reproduce {', '.join(bad)}; unset them")
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
            adv = trl_advantages(self._posttrain_rewards, self.reward_weights, int(k), self.posttrain_advantage)
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
            logp = self._get_per_token_logps_and_entropies(model, input_ids, attention_mask, completion_ids.size(1))[0]
            old = inputs.get("old_per_token_logps")
            old = logp.detach() if old is None else old
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
            loss, diag = trl_policy_loss(
                logp,
                old,
                inputs["advantages"],
                mask,
                loss=self.posttrain_loss,
                mode=self.posttrain_aggregation,
                horizon=self.args.max_completion_length,
                beta=self.args.beta,
                logp_ref=inputs.get("ref_per_token_logps"),
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
