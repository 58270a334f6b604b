"""Run configuration: a few frozen dataclasses loaded from YAML with ``yaml.safe_load``.

Unknown keys and unknown names (method, advantage, loss, KL, aggregation, task, engine,
optimizer, scheduler) fail at load with the list of valid ones. ``--set section.key=value``
overrides are applied to the raw mapping before validation; values are parsed as YAML scalars
(``--set optim.lr=1e-4``, ``--set algorithm.kl=null``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from posttrain.errors import DomainError
from posttrain.estimators import ADVANTAGES, KL_ESTIMATORS, POLICY_LOSSES, AggregationMode
from posttrain.estimators.es import REWARD_SHAPINGS
from posttrain.estimators.replay import REPLAY_RULES
from posttrain.llm.methods.catalog import METHODS
from posttrain.llm.rollout.branching import BranchingConfig
from posttrain.llm.rollout.engine import SamplingConfig
from posttrain.llm.rollout.replay import ReplayConfig
from posttrain.llm.rollout.tasks import TASKS

__all__ = [
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
    "apply_overrides",
    "config_from_dict",
    "config_to_dict",
    "from_mapping",
    "load_config",
    "parse_scalar",
]

ENGINES = ("hf", "vllm")
SCHEDULERS = ("constant", "linear", "cosine")
STRATEGIES = ("ddp", "fsdp")
"""``distributed.strategy``: the wrappers of :mod:`posttrain.llm.train.parallel`."""
MODEL_OPTIMIZERS = ("MuonWithAdamW",)
"""Optimizers built from the model (they need parameter names), not only its parameters
(:data:`posttrain.llm.train.optim.MODEL_OPTIMIZERS` maps each to its class)."""


@dataclass(frozen=True)
class ModelConfig:
    """The policy: ``path`` (local directory or hub id) or, when null, a tiny model built in ``out/tiny``."""

    path: str | None = None
    tiny: dict[str, Any] = field(default_factory=dict)
    teacher: str | None = None
    reference: str | None = None
    """The reference model of ``logp_ref`` and ``topk_logp_ref`` (KL terms; ExOPD's and OPD²'s teacher-base); null: the
    initial (SFT'd) policy."""
    dtype: str = "float32"
    device: str = "cpu"
    chat_template: bool = False
    system_prompt: str | None = None
    """The system turn of chat-template prompts (null: the template's default, if any)."""


@dataclass(frozen=True)
class DataConfig:
    """The task, prompts per step (G), and the supervised warm-up run before RL."""

    task: str = "multiple"
    options: dict[str, Any] = field(default_factory=dict)
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
    replay: ReplayConfig | None = None
    branching: BranchingConfig | None = None

    def sampling(self) -> SamplingConfig:
        """The engines' :class:`~posttrain.llm.rollout.engine.SamplingConfig` of these fields (validated there)."""
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
    (dataclass-typed fields) recurse, scalars are checked by :func:`parse_scalar`; ``where`` prefixes errors."""
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
    if (a.kl is None) != (a.kl_coef == 0.0):
        raise DomainError(
            f"algorithm.kl and algorithm.kl_coef: set both (a KL name and a coefficient > 0) or neither; got {a.kl!r}, {a.kl_coef!r}"
        )
    return cfg


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
    """A validated :class:`RunConfig` from a plain mapping (missing keys take their defaults)."""
    return validate_names(from_mapping(RunConfig, raw or {}, ""))


def config_to_dict(cfg: RunConfig) -> dict[str, Any]:
    """The plain mapping of a config (what ``config.yaml`` in a run directory holds)."""
    return dataclasses.asdict(cfg)


def apply_overrides(raw: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` strings to a raw mapping; values are parsed with ``yaml.safe_load``.

    Example:
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
        value = yaml.safe_load(text)
        node[parts[-1]] = value if not (isinstance(value, str) and value.lower() == "none") else None
    return out


def load_config(path: str | Path | None, overrides: Iterable[str] = ()) -> RunConfig:
    """Load YAML (safe loader), apply ``--set`` overrides, validate."""
    raw: Any = {} if path is None else yaml.safe_load(Path(path).read_text())
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise DomainError(f"{path}: expected a YAML mapping at the top level")
    return config_from_dict(apply_overrides(raw, overrides))
