"""Run configuration: a few frozen dataclasses loaded from YAML with ``yaml.safe_load``.

Unknown keys and unknown names (method, advantage, loss, KL, aggregation, task, engine,
optimizer, scheduler, ``logging.eval_metric``) fail at load with the list of valid ones. Every option
mapping is checked at load against what it configures (`OPTION_TARGETS`: the task's fields, the
loss's and advantage's keyword parameters, the optimizer's constructor, the tiny model's fields), names
and the types of their annotated scalars, before anything is built. Numbers must be finite (NaN and
inf are refused everywhere). ``--set section.key=value`` overrides are applied to the raw mapping
before validation; values are parsed as YAML scalars (``--set optim.lr=1e-4``, ``--set algorithm.kl=null``).
A YAML syntax error names the file, line and column.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from posttrain.errors import DomainError
from posttrain.estimators import ADVANTAGES, KL_ESTIMATORS, POLICY_LOSSES, AggregationMode
from posttrain.estimators.es import REWARD_SHAPINGS
from posttrain.estimators.replay import REPLAY_RULES
from posttrain.llm.methods.catalog import METHODS
from posttrain.llm.methods.dpo import DpoConfig
from posttrain.llm.methods.pairs import PairDesignConfig
from posttrain.llm.policy import LoraConfig
from posttrain.llm.rollout.answer import AnswerSuffixConfig
from posttrain.llm.rollout.branching import BranchingConfig
from posttrain.llm.rollout.engine import SamplingConfig
from posttrain.llm.rollout.oracle import OracleConfig
from posttrain.llm.rollout.replay import ReplayConfig
from posttrain.llm.rollout.reward_fn import load_reward_function
from posttrain.llm.rollout.tasks import TASKS, make_task

__all__ = [
    "OPTION_TARGETS",
    "AlgorithmConfig",
    "CheckpointConfig",
    "DataConfig",
    "DistributedConfig",
    "EsConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimConfig",
    "RolloutConfig",
    "RunConfig",
    "algorithm_of",
    "apply_overrides",
    "check_options",
    "config_from_dict",
    "config_to_dict",
    "from_mapping",
    "load_config",
    "parse_scalar",
    "read_yaml",
]

ENGINES = ("hf", "vllm")
SCHEDULERS = ("constant", "linear", "cosine")
STRATEGIES = ("ddp", "fsdp")
"""``distributed.strategy``: the wrappers of `posttrain.llm.train.parallel`."""
MODEL_OPTIMIZERS = ("MuonWithAdamW",)
"""Optimizers built from the model (they need parameter names), not only its parameters
(`posttrain.llm.train.optim.MODEL_OPTIMIZERS` maps each to its class)."""


@dataclass(frozen=True)
class ModelConfig:
    """The policy: ``path`` (local directory or hub id) or, when null, a tiny model built in ``out/tiny``."""

    path: str | None = None
    tiny: dict[str, Any] = field(default_factory=dict)
    teacher: str | None = None
    teachers: dict[str, str] | None = None
    """Several teachers, domain name -> path or registered name, each routed to the rows of its domain (the
    task's `Problem.domain`: ``mixture`` task, ``dataset``'s ``domain`` column); exclusive with ``teacher``."""
    reference: str | None = None
    """The reference model of ``logp_ref`` and ``topk_logp_ref`` (KL terms; ExOPD's and OPD²'s teacher-base); null: the
    initial (SFT'd) policy."""
    dtype: str = "float32"
    device: str = "cpu"
    chat_template: bool = False
    system_prompt: str | None = None
    """The system turn of chat-template prompts (null: the template's default, if any)."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass (less memory, one more forward)."""
    lora: LoraConfig | None = None
    """LoRA adapters through peft (`LoraConfig`); null: full fine-tuning."""


@dataclass(frozen=True)
class DataConfig:
    """The task, prompts per step (G), and the supervised warm-up run before RL."""

    task: str = "multiple"
    options: dict[str, Any] = field(default_factory=dict)
    reward: str | None = None
    """A reward function ``"module:function"`` with TRL's signature (replaces the task's own scoring)."""
    prompts_per_step: int = 16
    eval_prompts: int = 64
    sft_steps: int = 0
    sft_lr: float = 1e-2
    sft_batch_size: int = 64


@dataclass(frozen=True)
class RolloutConfig:
    """Sampling: engine (``hf`` or ``vllm``), K samples per prompt, length and temperature; optional stages."""

    engine: str = "hf"
    group_size: int = 8
    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    vllm_gpu_memory_utilization: float = 0.3
    enforce_eager: bool | None = None
    """vLLM only: run without CUDA graphs (None: eager on CPU, CUDA graphs on a GPU)."""
    compile_decode: bool = False
    """HF engine only: the decode step through ``torch.compile`` with a static KV cache (pays back
    its compile time only over many rollouts; see ``docs/performance.md``)."""
    replay: ReplayConfig | None = None
    branching: BranchingConfig | None = None
    answer_suffix: AnswerSuffixConfig | None = None
    """Append ``delimiter + gold answer + <eos>`` after every trace, scored in the training forward
    (`posttrain.llm.rollout.answer`); only for methods that read ``answer_mask``."""
    oracle: OracleConfig | None = None
    """Append the task's reference solution to every group as one more row (``synthetic``), scored by the same
    reward (`posttrain.llm.rollout.oracle`); ``group_size`` then counts it (``group_size - 1`` samples)."""

    def sampling(self) -> SamplingConfig:
        """The engines' `SamplingConfig` of these fields (validated there)."""
        return SamplingConfig(self.max_new_tokens, self.temperature, self.top_p, self.top_k)


@dataclass(frozen=True)
class AlgorithmConfig:
    """A method preset by name; any field set here overrides the preset's choice."""

    method: str = "grpo"
    advantage: str | None = None
    loss: str | None = None
    aggregation: str | None = None
    advantage_options: dict[str, Any] = field(default_factory=dict)
    loss_options: dict[str, Any] = field(default_factory=dict)
    kl: str | None = None
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    options: dict[str, Any] = field(default_factory=dict)
    """Keyword options of a method built by a factory (e.g. ``gflowrl``: ``beta``, ``max_up``, ...)."""
    topk: int = 1024
    """K of the student's top-K support filled for methods that need ``[B, T, K]`` log-probs (``opd2``);
    clamped to the vocabulary size (K = V is the exact expectation)."""


@dataclass(frozen=True)
class OptimConfig:
    """Optimisation: ``steps`` rollout batches, ``updates_per_batch`` optimizer steps on each."""

    steps: int = 40
    name: str = "AdamW"
    lr: float = 1e-5
    options: dict[str, Any] = field(default_factory=dict)
    updates_per_batch: int = 1
    micro_batch_size: int | None = None
    max_grad_norm: float | None = 1.0
    scheduler: str = "constant"
    warmup_steps: int = 0


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoint every ``every`` steps (0: only at the end), keeping the ``keep`` latest."""

    every: int = 0
    keep: int = 2


@dataclass(frozen=True)
class LoggingConfig:
    """``metrics.jsonl`` always; a rich progress bar, TensorBoard and W&B when asked (and installed)."""

    progress: bool = True
    tensorboard: bool = False
    wandb_project: str | None = None
    eval_every: int = 0
    eval_samples: int = 8
    eval_metric: str = "reward_mean"  # the validation score a schedule reads (a key of `evaluate`'s output)


@dataclass(frozen=True)
class DistributedConfig:
    """Data parallel under ``torch.distributed`` (ignored in a single process): ``ddp`` or ``fsdp`` (FSDP2)."""

    strategy: str = "ddp"


@dataclass(frozen=True)
class EsConfig:
    """``posttrain es``: evolution strategies in place (Qiu et al. 2025, arXiv:2509.24372).

    ES starts from the SFT'd model, or after the ``optim.steps`` RL steps of the config when
    ``after_rl`` (GRPO -> ES, Ba et al. 2026). Fitness: mean reward of one greedy response on each of
    ``prompts_per_step`` prompts (default ``data.prompts_per_step``), at most ``rollout.max_new_tokens``,
    ``micro_batch`` prompts per ``generate`` call (all at once if None; fewer = less activation memory).
    """

    population: int = 32
    sigma: float = 1e-3
    lr: float = 5e-4
    steps: int = 500
    antithetic: bool = False
    shaping: str = "zscore"
    lockstep: bool = True
    prompts_per_step: int | None = None
    after_rl: bool = False
    micro_batch: int | None = None


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs; ``seed`` fixes model init, data, sampling and SFT."""

    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    es: EsConfig = field(default_factory=EsConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    pairs: PairDesignConfig = field(default_factory=PairDesignConfig)
    """``posttrain pairs design``: the DPO pair design (`PairDesignConfig`)."""
    dpo: DpoConfig = field(default_factory=DpoConfig)
    """``posttrain dpo``: DPO on a pairs file (`DpoConfig`)."""


T = TypeVar("T")


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _dataclass_of(tp: Any) -> Any:
    """The dataclass of a section annotation (``X`` or ``X | None``), else None."""
    if _is_dataclass_type(tp):
        return tp
    inner = [a for a in typing.get_args(tp) if a is not type(None)]
    return inner[0] if len(inner) == 1 and _is_dataclass_type(inner[0]) else None


def parse_scalar(where: str, value: Any, tp: Any) -> Any:
    """Check a YAML value against a simple annotation (int, float, str, bool, dict, X | None).

    The one place YAML's number quirk is handled: YAML 1.1 reads ``1e-3`` (no dot) as a string,
    which a ``float`` field parses.
    """
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return parse_scalar(where, value, inner)
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise DomainError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is float and isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise DomainError(f"{where}: expected a finite number, got {value!r}")
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is bool and isinstance(value, bool):
        return value
    if tp is str and isinstance(value, str):
        return value
    raise DomainError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {value!r}")


def from_mapping(cls: type[T], raw: Mapping[str, Any], where: str) -> T:
    """A frozen dataclass from a parsed YAML mapping: unknown keys fail naming the valid ones, sections
    (dataclass-typed fields) recurse, scalars are checked by `parse_scalar`; ``where`` prefixes errors."""
    if not isinstance(raw, Mapping):
        raise DomainError(f"{where or 'config'}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise DomainError(f"{where or 'config'}: unknown key(s) {', '.join(unknown)}; valid: {', '.join(names)}")
    kwargs: dict[str, Any] = {}
    for name, value in raw.items():
        key = f"{where}.{name}" if where else name
        tp = hints[name]
        section = _dataclass_of(tp) if value is not None else None  # a section, or an optional one that is set
        kwargs[name] = from_mapping(section, value, key) if section is not None else parse_scalar(key, value, tp)
    return cls(**kwargs)


_SCALARS = (int, float, bool, str)


def _scalar_hint(tp: Any) -> Any:
    """``tp`` when it is a scalar annotation (``int``, ``float | None``, ...) that `parse_scalar` checks, else None."""
    args = (
        [a for a in typing.get_args(tp) if a is not type(None)]
        if typing.get_origin(tp) in (typing.Union, types.UnionType)
        else [tp]
    )
    return tp if len(args) == 1 and args[0] in _SCALARS else None


def _finite_numbers(where: str, value: Any) -> None:
    """Refuse NaN and inf anywhere inside an option value (lists and mappings included)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise DomainError(f"{where}: expected a finite number, got {value!r}")
    if isinstance(value, Mapping):
        for k, v in value.items():
            _finite_numbers(f"{where}.{k}", v)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _finite_numbers(f"{where}[{i}]", v)


def check_options(where: str, target: Any, options: Mapping[str, Any], *, skip: Iterable[str] = ()) -> None:
    """Check an option mapping against what it configures, without building it.

    ``target`` is a dataclass (its fields are the options) or a callable (its keyword parameters with a
    default, or keyword-only; a ``**kwargs`` target accepts any name). Unknown names raise
    ``DomainError`` listing the valid ones; values of scalar-annotated options (``int``, ``float``,
    ``bool``, ``str``, optionally ``| None``) are type-checked; NaN and inf are refused anywhere.
    ``skip``: parameters the caller passes itself (e.g. an optimizer's ``params`` and ``lr``).

    Examples:
        >>> from posttrain.llm.rollout.tasks import Multiple
        >>> check_options("data.options", Multiple, {"high": 9})
        >>> check_options("data.options", Multiple, {"hihg": 9})
        Traceback (most recent call last):
        ...
        posttrain.errors.DomainError: data.options: unknown option(s) hihg; valid: low, high, bound
    """
    skipped = set(skip)
    try:
        hints = typing.get_type_hints(
            target.__init__ if isinstance(target, type) and not dataclasses.is_dataclass(target) else target  # type: ignore[misc]
        )
    except Exception:  # unresolvable annotations (e.g. a third-party class): names only
        hints = {}
    if dataclasses.is_dataclass(target):
        valid: list[str] | None = [f.name for f in dataclasses.fields(target) if f.init]
    else:
        params = inspect.signature(target).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            valid = None
        else:
            valid = [
                p.name
                for p in params
                if p.name not in skipped
                and (p.kind is inspect.Parameter.KEYWORD_ONLY or p.default is not inspect.Parameter.empty)
            ]
    if valid is not None:
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise DomainError(f"{where}: unknown option(s) {', '.join(unknown)}; valid: {', '.join(valid) or '(none)'}")
    for name, value in options.items():
        key = f"{where}.{name}"
        _finite_numbers(key, value)
        hint = _scalar_hint(hints.get(name))
        if hint is not None:
            parse_scalar(key, value, hint)


def _optimizer_class(cfg: RunConfig) -> Any:
    import torch

    if cfg.optim.name in MODEL_OPTIMIZERS:
        from posttrain.llm.train.optim import MODEL_OPTIMIZERS as classes

        return classes[cfg.optim.name]
    return getattr(torch.optim, cfg.optim.name)


def _tiny_config(cfg: RunConfig) -> Any:
    from posttrain.llm.tools.tiny import TinyConfig

    return TinyConfig


OPTION_TARGETS: tuple[tuple[str, Callable[[RunConfig], Any], tuple[str, ...]], ...] = (
    ("data.options", lambda cfg: TASKS.get(cfg.data.task), ()),
    ("model.tiny", _tiny_config, ()),
    ("optim.options", _optimizer_class, ("params", "lr", "model")),
)
"""``(key, what it configures, parameters the caller passes)`` of every option mapping checked at load by
`check_options` (the algorithm's mappings are checked against the resolved loss / advantage /
method factory in `_check_algorithm`). A new section with an option mapping adds its row here."""


def _section_value(cfg: RunConfig, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def algorithm_of(cfg: RunConfig) -> Any:
    """The `Algorithm` bundle of ``cfg.algorithm`` (pure Python, no model)."""
    from posttrain.llm.methods.catalog import build_algorithm

    a = cfg.algorithm
    return build_algorithm(
        method=a.method, horizon=cfg.rollout.max_new_tokens, advantage=a.advantage, loss=a.loss,
        aggregation=a.aggregation, advantage_options=a.advantage_options, loss_options=a.loss_options,
        kl=a.kl, kl_coef=a.kl_coef, entropy_coef=a.entropy_coef, options=a.options,
        group_size=cfg.rollout.group_size,
    )  # fmt: skip


def _check_algorithm(cfg: RunConfig) -> None:
    """The algorithm's option mappings against the resolved loss, advantage or method factory; the bundle
    built once (pure Python, no model) so any other inconsistency fails at load; group size 1 refused
    where it makes every advantage zero."""
    from posttrain.estimators import get_advantage, get_policy_loss
    from posttrain.llm.methods.algorithm import MethodBundle, MethodPreset

    a = cfg.algorithm
    entry = METHODS.get(a.method)
    if isinstance(entry, MethodPreset):
        check_options("algorithm.loss_options", get_policy_loss(a.loss or entry.loss), a.loss_options)
        check_options("algorithm.advantage_options", get_advantage(a.advantage or entry.advantage), a.advantage_options)
    elif isinstance(entry, MethodBundle):  # its factory's keyword options: names, scalar types (not group_size)
        check_options("algorithm.options", entry.factory, a.options, skip=("group_size",))
    alg = algorithm_of(cfg)
    if cfg.rollout.group_size == 1 and alg.needs <= {"logp_old"}:
        _refuse_zero_advantages(cfg, alg)
    _check_answer_suffix(cfg, alg)
    _check_oracle(cfg, alg)


def _check_oracle(cfg: RunConfig, alg: Any) -> None:
    """``rollout.oracle`` is set when the method reads the synthetic rows (``synthetic`` in its needs); it does
    not combine with the stages that rebuild the groups (another method on it trains on the oracle row as sampled:
    e.g. GRPO, the naive-injection baseline)."""
    r = cfg.rollout
    if "synthetic" in alg.needs and r.oracle is None:
        raise DomainError(
            f"rollout.oracle: method {cfg.algorithm.method!r} trains on the task's reference solution as one row "
            "per group; set rollout.oracle: {} (rollout.group_size then counts that row)"
        )
    if r.oracle is not None and (r.replay is not None or r.branching is not None or r.answer_suffix is not None):
        raise DomainError(
            "rollout.oracle: not supported with rollout.replay, rollout.branching or rollout.answer_suffix"
        )
    if r.oracle is not None and r.group_size < 2:
        raise DomainError(
            f"rollout.group_size: rollout.oracle needs at least 1 sample + the oracle row, got {r.group_size}"
        )


def _check_answer_suffix(cfg: RunConfig, alg: Any) -> None:
    """``rollout.answer_suffix`` is set exactly when the method reads the appended answer (``answer_mask``)."""
    r, reads = cfg.rollout, "answer_mask" in alg.loss_needs
    if reads and r.answer_suffix is None:
        raise DomainError(
            f"rollout.answer_suffix: method {cfg.algorithm.method!r} with algorithm.options {cfg.algorithm.options} "
            "scores the gold answer after each trace; set rollout.answer_suffix: {delimiter: ...}"
        )
    if r.answer_suffix is None:
        return
    if not reads:
        raise DomainError(
            f"rollout.answer_suffix: method {cfg.algorithm.method!r} does not read the appended answer tokens "
            "(it would train on them as sampled tokens); remove rollout.answer_suffix"
        )
    if r.replay is not None or r.branching is not None:
        raise DomainError("rollout.answer_suffix: not supported with rollout.replay or rollout.branching")


def _refuse_zero_advantages(cfg: RunConfig, alg: Any) -> None:
    """Groups of one sample: refuse a method whose advantage is then zero for every sample (loss and gradient 0)."""
    import torch

    from posttrain.llm.rollout.batch import RolloutBatch

    one = torch.ones(2, 1, dtype=torch.long)
    probe = RolloutBatch(
        prompt_ids=one, prompt_mask=one.bool(), response_ids=one, mask=one.bool(),
        rewards=torch.tensor([1.0, 0.0]), group_size=1, logp_old=torch.zeros(2, 1),
    )  # fmt: skip
    if not bool(alg.advantage(probe).abs().sum() > 0):
        raise DomainError(
            f"rollout.group_size: 1 gives method {cfg.algorithm.method!r} a zero advantage on every sample (its baseline "
            "is the group's own reward), so the loss and gradient would be 0 at every step; use group_size >= 2"
        )


def _one_of(where: str, value: str | None, valid: Iterable[str]) -> None:
    valid = sorted(valid)
    if value is not None and value not in valid:
        raise DomainError(f"{where}: unknown name {value!r}; valid: {', '.join(valid)}")


def _positive(where: str, value: float | None, *, allow_zero: bool = False, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or value < 0 or (value == 0 and not allow_zero):
        raise DomainError(f"{where}: expected a number {'>= 0' if allow_zero else '> 0'}, got {value!r}")


def validate_names(cfg: RunConfig) -> RunConfig:
    """Check every name against its registry and the numeric ranges that would fail later."""
    import torch

    a = cfg.algorithm
    _one_of("algorithm.method", a.method, METHODS.names())
    _one_of("algorithm.advantage", a.advantage, ADVANTAGES.names())
    _one_of("algorithm.loss", a.loss, POLICY_LOSSES.names())
    _one_of("algorithm.kl", a.kl, KL_ESTIMATORS.names())
    _one_of("algorithm.aggregation", a.aggregation, [m.value for m in AggregationMode])
    _one_of("data.task", cfg.data.task, TASKS.names())
    _one_of("rollout.engine", cfg.rollout.engine, ENGINES)
    _one_of("optim.scheduler", cfg.optim.scheduler, SCHEDULERS)
    _one_of("es.shaping", cfg.es.shaping, REWARD_SHAPINGS.names())
    _one_of("distributed.strategy", cfg.distributed.strategy, STRATEGIES)
    optimizers = [
        n
        for n in dir(torch.optim)
        if isinstance(getattr(torch.optim, n), type)
        and issubclass(getattr(torch.optim, n), torch.optim.Optimizer)
        and n != "Optimizer"
    ]
    _one_of("optim.name", cfg.optim.name, optimizers + sorted(MODEL_OPTIMIZERS))
    _one_of("model.dtype", cfg.model.dtype, ("float32", "float64", "bfloat16", "float16"))
    from posttrain.llm.train.evaluate import eval_metric_names

    _one_of("logging.eval_metric", cfg.logging.eval_metric, eval_metric_names())
    for key, target, skip in OPTION_TARGETS:
        check_options(key, target(cfg), _section_value(cfg, key), skip=skip)
    for where, value in (
        ("data.prompts_per_step", cfg.data.prompts_per_step),
        ("rollout.group_size", cfg.rollout.group_size),
        ("rollout.max_new_tokens", cfg.rollout.max_new_tokens),
        ("optim.steps", cfg.optim.steps),
        ("optim.updates_per_batch", cfg.optim.updates_per_batch),
        ("optim.lr", cfg.optim.lr),
        ("rollout.temperature", cfg.rollout.temperature),
        ("data.eval_prompts", cfg.data.eval_prompts),
        ("algorithm.topk", a.topk),
        ("es.population", cfg.es.population),
        ("es.sigma", cfg.es.sigma),
        ("es.lr", cfg.es.lr),
    ):
        _positive(where, value)
    _positive("es.prompts_per_step", cfg.es.prompts_per_step, allow_none=True)
    _positive("es.micro_batch", cfg.es.micro_batch, allow_none=True)
    if cfg.es.antithetic and cfg.es.population % 2:
        raise DomainError(f"es.population: antithetic pairs need an even population, got {cfg.es.population}")
    for where, value in (
        ("data.sft_steps", cfg.data.sft_steps),
        ("algorithm.kl_coef", a.kl_coef),
        ("algorithm.entropy_coef", a.entropy_coef),
        ("checkpoint.every", cfg.checkpoint.every),
        ("logging.eval_every", cfg.logging.eval_every),
        ("optim.warmup_steps", cfg.optim.warmup_steps),
        ("es.steps", cfg.es.steps),
    ):
        _positive(where, value, allow_zero=True)
    _positive("optim.max_grad_norm", cfg.optim.max_grad_norm, allow_none=True)
    _positive("checkpoint.keep", cfg.checkpoint.keep)
    mb = cfg.optim.micro_batch_size
    if mb is not None and (mb < 1 or mb % cfg.rollout.group_size):
        raise DomainError(
            f"optim.micro_batch_size: expected a positive multiple of rollout.group_size={cfg.rollout.group_size}, got {mb}"
        )
    if cfg.distributed.strategy == "fsdp" and cfg.rollout.engine != "hf":
        raise DomainError(
            f"distributed.strategy: 'fsdp' supports rollout.engine='hf' only (weight sync from sharded "
            f"parameters is not implemented), got rollout.engine={cfg.rollout.engine!r}"
        )
    if cfg.distributed.strategy == "fsdp" and cfg.rollout.replay is not None:
        raise DomainError(
            "rollout.replay: not supported with distributed.strategy='fsdp' (ranks would replay different "
            "numbers of groups, hence run different numbers of sharded forwards); use 'ddp'"
        )
    _validate_stages(cfg.rollout)
    cfg.pairs.check("pairs")
    cfg.dpo.check("dpo")
    _check_policy(cfg)
    if (a.kl is None) != (a.kl_coef == 0.0):
        raise DomainError(
            f"algorithm.kl and algorithm.kl_coef: set both (a KL name and a coefficient > 0) or neither; got {a.kl!r}, {a.kl_coef!r}"
        )
    _check_algorithm(cfg)
    return cfg


def _check_policy(cfg: RunConfig) -> None:
    """LoRA values, the vLLM + LoRA refusal, and the reward function (imported and its signature checked)."""
    if cfg.model.lora is not None:
        cfg.model.lora.check("model.lora")
        if cfg.rollout.engine == "vllm":
            raise DomainError(
                "model.lora: not supported with rollout.engine='vllm' (the weight sync streams the policy's "
                "state dict, whose LoRA names vLLM does not load); use rollout.engine='hf'"
            )
    if cfg.data.reward is not None:
        load_reward_function(cfg.data.reward, "data.reward")
    if cfg.data.task in ("dataset", "mixture") or cfg.model.teachers is not None:  # dataset: reads the file(s)
        task = make_task(cfg.data.task, **cfg.data.options)  # a missing file, column or task fails naming its key
        if cfg.model.teachers is not None:
            from posttrain.llm.methods.teachers import teachers_in_domain_order

            if cfg.model.teacher is not None:
                raise DomainError("model.teachers: set model.teacher (one teacher) or model.teachers, not both")
            if cfg.distributed.strategy == "fsdp":  # ranks would run different numbers of sharded teacher forwards
                raise DomainError("model.teachers: not supported with distributed.strategy='fsdp'; use 'ddp'")
            teachers_in_domain_order(cfg.model.teachers, getattr(task, "domains", ()), cfg.data.task)


def _validate_stages(r: RolloutConfig) -> None:
    """``rollout.replay`` and ``rollout.branching``: names and ranges."""
    if r.replay is not None:
        _one_of("rollout.replay.rule", r.replay.rule, REPLAY_RULES.names())
        _positive("rollout.replay.k_rep", r.replay.k_rep, allow_zero=True)
        _positive("rollout.replay.tau", r.replay.tau, allow_zero=True)
        _positive("rollout.replay.capacity", r.replay.capacity)
    b = r.branching
    if b is None:
        return
    if not 1 <= b.branches < r.group_size:
        raise DomainError(
            f"rollout.branching.branches: expected 1 <= b < rollout.group_size={r.group_size}, got {b.branches}"
        )
    for where, value in (("shadow_steps", b.shadow_steps), ("ridge", b.ridge)):
        _positive(f"rollout.branching.{where}", value, allow_zero=True)
    for where, value in (("window", b.window), ("gamma", b.gamma), ("delta", b.delta)):
        _positive(f"rollout.branching.{where}", value)
    if not 0.0 <= b.explore <= 1.0:
        raise DomainError(f"rollout.branching.explore: expected a probability in [0, 1], got {b.explore!r}")


def config_from_dict(raw: Mapping[str, Any] | None) -> RunConfig:
    """A validated `RunConfig` from a plain mapping (missing keys take their defaults)."""
    return validate_names(from_mapping(RunConfig, raw or {}, ""))


def config_to_dict(cfg: RunConfig) -> dict[str, Any]:
    """The plain mapping of a config (what ``config.yaml`` in a run directory holds)."""
    return dataclasses.asdict(cfg)


def apply_overrides(raw: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` strings to a raw mapping; values are parsed with ``yaml.safe_load``.

    Examples:
        >>> apply_overrides({"optim": {"lr": 0.1}}, ["optim.lr=0.001", "algorithm.method=rloo"])
        {'optim': {'lr': 0.001}, 'algorithm': {'method': 'rloo'}}
    """
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in raw.items()}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise DomainError(f"--set: expected key=value, got {item!r}")
        parts = key.strip().split(".")
        node = out
        for p in parts[:-1]:
            child = node.get(p)
            node[p] = dict(child) if isinstance(child, Mapping) else {}
            node = node[p]
        value = _parse_yaml(text, f"--set {item}", marks=False)
        node[parts[-1]] = value if not (isinstance(value, str) and value.lower() == "none") else None
    return out


def _parse_yaml(text: str, where: str, *, marks: bool = True) -> Any:
    """``yaml.safe_load(text)``; a syntax error becomes one ``DomainError`` line ``where:line:column: ...``."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) if marks else None
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark is not None else where
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise DomainError(f"{at}: YAML syntax error: {problem}") from None


def read_yaml(path: str | Path) -> Any:
    """A YAML file read with the safe loader; unreadable files and syntax errors raise ``DomainError`` naming it."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise DomainError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    return _parse_yaml(text, str(path))


def load_config(path: str | Path | None, overrides: Iterable[str] = ()) -> RunConfig:
    """Load YAML (safe loader), apply ``--set`` overrides, validate."""
    raw: Any = {} if path is None else read_yaml(path)
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise DomainError(f"{path}: expected a YAML mapping at the top level")
    return config_from_dict(apply_overrides(raw, overrides))
