"""Loading a run config: parse, check across sections, build the method once (`plan_run`).

`load_run` (and `load_config` / `config_from_dict`, which return its config) goes, before anything is built
or a run directory is touched:

1. YAML through the strict loader (`posttrain.llm.config.load`), ``--set`` overrides applied;
2. every section parsed by `posttrain.llm.typed.from_mapping`: each key's type and limits as its annotation in
   `posttrain.llm.config.schema` declares them, and each section's own cross-field ``check()``;
3. the option mappings against what they configure (`posttrain.llm.config.targets`; the task is built and
   tried once), the optimizer's options (`posttrain.llm.train.optim.check_optimizer`);
4. the `Algorithm`, built once by `build_algorithm` (it checks the method's typed options and tries a preset's
   estimators; ``algorithm.rollout_correction`` wraps its policy loss), and every need it declares against its precondition in
   `posttrain.llm.methods.needs.NEEDS` (teacher log-probs need ``model.teacher(s)``, ...);
5. the checks across sections below, each in one function.

Every failure is one `DomainError` line that starts with the dotted key. The result, `RunPlan`, carries the
config, the `Algorithm` and the run's one `SamplingConfig` to `posttrain.llm.run.build_trainer`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.errors import DomainError
from posttrain.llm.config.load import apply_overrides, read_yaml_mapping
from posttrain.llm.config.schema import RunConfig
from posttrain.llm.config.targets import build_task_options
from posttrain.llm.methods.algorithm import Algorithm
from posttrain.llm.methods.catalog import build_algorithm
from posttrain.llm.methods.correction import with_rollout_correction
from posttrain.llm.methods.needs import NEEDS, Need, example_batch
from posttrain.llm.methods.teachers import teachers_in_domain_order
from posttrain.llm.rollout.engine import SamplingConfig
from posttrain.llm.rollout.tasks import Task
from posttrain.llm.train.optim import check_optimizer
from posttrain.llm.typed import from_mapping

__all__ = [
    "RunPlan",
    "algorithm_of",
    "config_from_dict",
    "config_to_dict",
    "load_config",
    "load_run",
    "plan_from_dict",
    "plan_run",
    "value_at",
]


@dataclass(frozen=True)
class RunPlan:
    """A checked config and what is built from it once: the method's `Algorithm`, the run's `SamplingConfig`
    (temperature and the rest: the engine, the fillers, the training forward and the hooks read this one) and
    the task (without ``data.reward``, which is imported when training builds the task)."""

    config: RunConfig
    algorithm: Algorithm
    sampling: SamplingConfig
    task: Task


def value_at(cfg: Any, key: str) -> Any:
    """The config value at a dotted key (``"rollout.oracle"``)."""
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def algorithm_of(cfg: RunConfig) -> Algorithm:
    """The `Algorithm` bundle of ``cfg.algorithm`` (pure Python, no model), its policy loss corrected by
    ``algorithm.rollout_correction`` when set."""
    a = cfg.algorithm
    alg = build_algorithm(
        method=a.method, horizon=cfg.rollout.max_new_tokens, advantage=a.advantage, loss=a.loss,
        aggregation=a.aggregation, advantage_options=a.advantage_options, loss_options=a.loss_options,
        kl=a.kl, kl_coef=a.kl_coef, entropy_coef=a.entropy_coef, options=a.options,
        group_size=cfg.rollout.group_size,
    )  # fmt: skip
    return with_rollout_correction(alg, a.rollout_correction)


def _check_needs(cfg: RunConfig, alg: Algorithm) -> None:
    """Each need the method reads has its precondition (`NEEDS`), unless the method provides it itself; a stage
    whose need only a reader may take (``only_when_read``) is not set for a method that does not read it."""
    reads, method = alg.needs | set(alg.loss_needs), cfg.algorithm.method
    for need in sorted(reads - alg.provides, key=list(Need).index):
        row = NEEDS[need]
        if row.requires and all(value_at(cfg, key) is None for key in row.requires):
            raise DomainError(
                f"{row.requires[0]}: method {method!r} reads {need} ({row.doc}); set {' or '.join(row.requires)}"
            )
    for need, row in NEEDS.items():
        if row.only_when_read and need not in reads:
            for key in (k for k in row.requires if value_at(cfg, k) is not None):
                raise DomainError(
                    f"{key}: method {method!r} does not read {need} ({row.doc}: it would train on them as sampled "
                    f"tokens); remove {key}"
                )


def _check_group_of_one(cfg: RunConfig, alg: Algorithm) -> None:
    """Groups of one sample: refuse a method whose advantage is then zero for every sample (loss and gradient 0)."""
    if cfg.rollout.group_size != 1 or alg.needs - {Need.LOGP_OLD}:
        return
    advantages = alg.advantage(example_batch(alg.needs, group_size=1, rewards=[1.0, 0.0]))
    if not bool(advantages.abs().sum() > 0):
        raise DomainError(
            f"rollout.group_size: 1 gives method {cfg.algorithm.method!r} a zero advantage on every sample (its baseline "
            "is the group's own reward), so the loss and gradient would be 0 at every step; use group_size >= 2"
        )


def _check_parallel(cfg: RunConfig) -> None:
    """What FSDP2 does not support (ranks would run different numbers of sharded forwards, or sync sharded weights)."""
    if cfg.distributed.strategy != "fsdp":
        return
    if cfg.rollout.engine != "hf":
        raise DomainError(
            f"distributed.strategy: 'fsdp' supports rollout.engine='hf' only (weight sync from sharded "
            f"parameters is not implemented), got rollout.engine={cfg.rollout.engine!r}"
        )
    if cfg.rollout.replay is not None:
        raise DomainError(
            "rollout.replay: not supported with distributed.strategy='fsdp' (ranks would replay different "
            "numbers of groups, hence run different numbers of sharded forwards); use 'ddp'"
        )
    if cfg.model.teachers is not None:
        raise DomainError("model.teachers: not supported with distributed.strategy='fsdp'; use 'ddp'")


def _check_off_policy(cfg: RunConfig, alg: Algorithm) -> None:
    """The rollout correction and training at a lag against what the method reads (docs: off_policy.md)."""
    r, method = cfg.rollout, cfg.algorithm.method
    behaviour = sorted((n for n in alg.needs if NEEDS[n].behaviour), key=list(Need).index)
    if cfg.algorithm.rollout_correction is not None and Need.SIS_TOPK_IDS in alg.needs:
        raise DomainError(
            f"algorithm.rollout_correction: method {method!r} corrects the gap to the behaviour log-probs itself "
            "(SIS's rejection test reads logp_old); use one of them"
        )
    if r.asynchronous and behaviour:
        raise DomainError(
            f"rollout.asynchronous: method {method!r} reads {behaviour[0]} ({NEEDS[behaviour[0]].doc}), a forward of "
            "the policy that generated the batch, which the worker process does not run; use rollout.staleness"
        )
    stages = [key for key in ("replay", "oracle", "answer_suffix") if getattr(r, key) is not None]
    if r.staleness and behaviour and stages:
        raise DomainError(
            f"rollout.{stages[0]}: not supported with rollout.staleness > 0 for method {method!r}: the stage rebuilds "
            f"the batch, which would drop {behaviour[0]} filled when the batch was generated"
        )
    if r.asynchronous and cfg.model.lora is not None:
        raise DomainError("model.lora: not supported with rollout.asynchronous (the worker copies the bare weights)")


def _check_sections(cfg: RunConfig, task: Task) -> None:
    """Relations between sections."""
    mb, k = cfg.optim.micro_batch_size, cfg.rollout.group_size
    if mb is not None and mb % k:
        raise DomainError(f"optim.micro_batch_size: expected a positive multiple of rollout.group_size={k}, got {mb}")
    if cfg.model.lora is not None and cfg.rollout.engine == "vllm":
        raise DomainError(
            "model.lora: not supported with rollout.engine='vllm' (the weight sync streams the policy's "
            "state dict, whose LoRA names vLLM does not load); use rollout.engine='hf'"
        )
    if cfg.model.teachers is not None:
        teachers_in_domain_order(cfg.model.teachers, getattr(task, "domains", ()), cfg.data.task)
    _check_parallel(cfg)


def plan_run(cfg: RunConfig) -> RunPlan:
    """Check a parsed config across its sections and build what is built once (see the module docstring)."""
    task = build_task_options(cfg.data.task, cfg.data.options)
    check_optimizer(cfg.optim.name, cfg.optim.lr, cfg.optim.options)
    alg = algorithm_of(cfg)
    _check_needs(cfg, alg)
    _check_group_of_one(cfg, alg)
    _check_off_policy(cfg, alg)
    _check_sections(cfg, task)
    return RunPlan(cfg, alg, cfg.rollout.sampling(), task)


def plan_from_dict(raw: Mapping[str, Any] | None) -> RunPlan:
    """The `RunPlan` of a plain mapping (missing keys take their defaults)."""
    return plan_run(from_mapping(RunConfig, raw or {}, ""))


def config_from_dict(raw: Mapping[str, Any] | None) -> RunConfig:
    """A checked `RunConfig` from a plain mapping (missing keys take their defaults)."""
    return plan_from_dict(raw).config


def config_to_dict(cfg: RunConfig) -> dict[str, Any]:
    """The plain mapping of a config (what ``config.yaml`` in a run directory holds)."""
    return dataclasses.asdict(cfg)


def load_run(path: str | Path | None, overrides: Iterable[str] = ()) -> RunPlan:
    """A YAML config (or the defaults when ``path`` is None) with ``--set`` overrides, checked and planned."""
    raw = {} if path is None else read_yaml_mapping(path)
    return plan_run(from_mapping(RunConfig, apply_overrides(raw, overrides), ""))


def load_config(path: str | Path | None, overrides: Iterable[str] = ()) -> RunConfig:
    """`load_run`'s config."""
    return load_run(path, overrides).config
