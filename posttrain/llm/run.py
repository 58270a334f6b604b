"""Assembling a run from a config: model, SFT warm-up, reference/teacher, engine, algorithm, trainer.

This is the config edge: names are resolved here (engine factories, the algorithm bundle, the
task) and nowhere in the loop. Directory layout of a run:

    out/config.yaml       the resolved config (written first, atomically; a resume's changes as comments)
    out/tiny/             the built tiny model (when model.path is null)
    out/sft_metrics.jsonl the SFT warm-up's loss per step
    out/initial/          the policy after the SFT warm-up (reference model; vLLM loads it), atomic + checksums
    out/metrics.jsonl     one JSON object per step
    out/checkpoints/      step_NNNNNN/ (atomic + checksums)

A directory belongs to one run (`posttrain.llm.train.rundir`): training into one that holds a run
needs ``resume`` (same config, except the keys of ``RESUMABLE_KEYS``) or ``overwrite``.

The entry points take a `RunPlan` (`posttrain.llm.config.load_run`: the checked config, its `Algorithm` built
once, the run's one `SamplingConfig` and its task) or a `RunConfig` (planned here). The fillers of the needs
the method declares are built from the table `posttrain.llm.methods.needs.NEEDS`; a method's own pieces
(``Algorithm.edge``) join them; nothing here tests a method's name or a need by name.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from posttrain.llm.config import RunConfig, RunPlan, plan_run
from posttrain.llm.es.trainer import (
    EsStepLog,
    EsTrainConfig,
    es_train,
    generation_fitness,
    rank_world,
    trainable_params,
)
from posttrain.llm.methods.algorithm import EdgeContext
from posttrain.llm.methods.needs import NEEDS, FillContext, Filler, Need
from posttrain.llm.methods.teachers import check_same_tokenizer, teachers_in_domain_order
from posttrain.llm.policy import prepare_policy
from posttrain.llm.rollout.answer import AnswerSuffixStage
from posttrain.llm.rollout.branching import BranchingStage
from posttrain.llm.rollout.engine import HFEngine, RolloutEngine, SamplingConfig
from posttrain.llm.rollout.oracle import OracleStage
from posttrain.llm.rollout.replay import ReplayStage
from posttrain.llm.rollout.reward_fn import with_reward_function
from posttrain.llm.rollout.stages import RolloutStage
from posttrain.llm.train.parallel import wrap_frozen, wrap_model
from posttrain.llm.train.rundir import (
    RunDirError,
    append_jsonl,
    atomic_directory,
    atomic_write_text,
    check_run_dir,
    claim_run_dir,
    verify_checksums,
)
from posttrain.llm.train.sinks import metric_sinks
from posttrain.llm.train.trainer import Trainer

__all__ = [
    "ENGINE_FACTORIES", "as_plan", "build_initial", "build_stages", "build_trainer", "es_from_config", "grpo_then_es",
    "load_model", "train", "training_task",
]  # fmt: skip


def as_plan(run: RunPlan | RunConfig) -> RunPlan:
    """``run`` itself, or the `RunPlan` of a config (checked and planned now)."""
    return run if isinstance(run, RunPlan) else plan_run(run)


def training_task(plan: RunPlan) -> Any:
    """The plan's task scored by ``data.reward`` when set (its module imported and tried here, not at load)."""
    return with_reward_function(plan.task, plan.config.data.reward)


def load_model(path: str | Path, cfg: RunConfig) -> tuple[Any, Any]:
    """``AutoModelForCausalLM`` and ``AutoTokenizer`` from a local directory, a hub id, or a model name
    registered in `posttrain.llm.tools.models` (its prepared directory)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.llm.tools.models import resolve_model_path

    path = resolve_model_path(path) or path
    auto: Any = AutoModelForCausalLM
    model = auto.from_pretrained(str(path), dtype=getattr(torch, cfg.model.dtype)).to(cfg.model.device)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _hf_engine(cfg: RunConfig, sampling: SamplingConfig, model: Any, tokenizer: Any, model_dir: Path) -> RolloutEngine:
    sharded = cfg.distributed.strategy == "fsdp" and dist.is_available() and dist.is_initialized()
    return HFEngine(
        model,
        pad_id=tokenizer.pad_token_id,
        eos_id=tokenizer.eos_token_id,
        sampling=sampling,
        synced_gpus=sharded,
        compile_decode=cfg.rollout.compile_decode,
    )


def _vllm_engine(
    cfg: RunConfig, sampling: SamplingConfig, model: Any, tokenizer: Any, model_dir: Path
) -> RolloutEngine:
    from posttrain.llm.rollout.vllm import VLLMEngine

    return VLLMEngine(
        model_dir,
        sampling=sampling,
        seed=cfg.seed,
        dtype=cfg.model.dtype,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization,
        enforce_eager=cfg.rollout.enforce_eager,
        device=cfg.model.device,
    )


ENGINE_FACTORIES: dict[str, Callable[[RunConfig, SamplingConfig, Any, Any, Path], RolloutEngine]] = {
    "hf": _hf_engine,
    "vllm": _vllm_engine,
}
"""``rollout.engine`` (`posttrain.llm.config.schema.EngineName`) -> ``(cfg, sampling, model, tokenizer, model_dir)``."""


def _teachers(cfg: RunConfig, policy: Any, tokenizer: Any, domains: Sequence[str]) -> list[Any]:
    """The frozen ``model.teacher``, or the ``model.teachers`` in the task's domain order; every teacher must
    share the policy's tokenizer."""
    m = cfg.model
    if m.teachers is None:
        if m.teacher is None:
            return []
        specs = [("model.teacher", m.teacher)]
    else:
        paths = teachers_in_domain_order(m.teachers, domains, cfg.data.task)
        specs = [(f"model.teachers.{d}", path) for d, path in zip(domains, paths, strict=True)]
    out = []
    for key, path in specs:
        teacher, teacher_tokenizer = load_model(path, cfg)
        check_same_tokenizer(key, teacher_tokenizer, teacher, tokenizer, policy)
        out.append(wrap_frozen(teacher, cfg.distributed.strategy))
    return out


def build_stages(
    cfg: RunConfig, *, vocab_size: int, world: int = 1, tokenizer: Any = None, task: Any = None
) -> tuple[RolloutStage, ...]:
    """The stages a config asks for, in loop order: RAIL branching (shapes the fresh groups), then replay;
    the answer suffix (``rollout.answer_suffix``, never with those two) needs the ``tokenizer``, the oracle
    row (``rollout.oracle``, alone) the ``tokenizer`` and the ``task``."""
    r = cfg.rollout
    stages: list[RolloutStage] = []
    if r.branching is not None:
        stages.append(
            BranchingStage(
                r.branching,
                group_size=r.group_size,
                max_new_tokens=r.max_new_tokens,
                vocab_size=vocab_size,
                seed=cfg.seed,
                world=world,
            )
        )
    if r.replay is not None:  # a branch row is a prefix (< max_new_tokens) plus up to max_new_tokens more
        horizon = r.max_new_tokens * (2 if r.branching is not None else 1)
        stages.append(ReplayStage(r.replay, group_size=r.group_size, horizon=horizon))
    if r.answer_suffix is not None:
        stages.append(AnswerSuffixStage(r.answer_suffix, tokenizer=tokenizer))
    if r.oracle is not None:
        stages.append(
            OracleStage(r.oracle, tokenizer=tokenizer, task=task, micro_batch_size=cfg.optim.micro_batch_size)
        )
    return tuple(stages)


def _initial_is_usable(initial: Path, checkpoints: Path) -> bool:
    """Whether a resume can load ``initial/`` as is (complete and intact); raises when it is corrupt but
    checkpoints were trained from it (the reference model would change)."""
    if not (initial / "config.json").is_file():
        return False
    reason = verify_checksums(initial)
    if reason is None:
        return True
    if checkpoints.is_dir() and any(checkpoints.glob("step_*")):
        raise RunDirError(f"--resume: {initial} is corrupt ({reason}) and checkpoints depend on it; use --overwrite")
    return False


def build_initial(
    cfg: RunConfig, out: Path, task: Any, *, on_sft_step: Callable[[int, float], None] | None = None
) -> Path:
    """Build or load the policy (``model.path``, or a tiny model in ``out/tiny``), run the SFT warm-up on ``task``
    (losses in ``out/sft_metrics.jsonl``) and save it atomically as ``out/initial`` (the reference model); returns
    that directory. Single process: a data-parallel caller runs it on rank 0."""
    from posttrain.llm.tools.tiny import build_tiny
    from posttrain.llm.train.sft import sft_warmup

    initial = out / "initial"
    source = cfg.model.path or build_tiny(out / "tiny", cfg.model.tiny, seed=cfg.seed)
    model, tokenizer = load_model(source, cfg)
    if cfg.data.sft_steps:
        losses = sft_warmup(
            model,
            tokenizer,
            task,
            steps=cfg.data.sft_steps,
            batch_size=cfg.data.sft_batch_size,
            lr=cfg.data.sft_lr,
            seed=cfg.seed,
            **cfg.model.prompt_format().options(),
            on_step=on_sft_step,
        )
        rows = [json.dumps({"step": i + 1, "loss": loss}) for i, loss in enumerate(losses)]
        atomic_write_text(out / "sft_metrics.jsonl", "".join(f"{r}\n" for r in rows))
    with atomic_directory(initial) as tmp:  # a kill mid-save leaves no initial/: a resume redoes SFT
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return initial


def _fill_context(plan: RunPlan, model: Any, tokenizer: Any, initial: Path, domains: Sequence[str]) -> FillContext:
    """What the fillers of ``plan`` are built from; the reference and the teachers load on first use, once."""
    cfg = plan.config

    @functools.cache
    def reference() -> Any:
        return wrap_frozen(load_model(cfg.model.reference or initial, cfg)[0], cfg.distributed.strategy)

    @functools.cache
    def teachers() -> list[Any]:
        return _teachers(cfg, model, tokenizer, domains)

    routed = cfg.model.teachers is not None
    return FillContext(model, plan.sampling.temperature, cfg.algorithm.topk, reference, teachers, routed)


def build_trainer(
    run: RunPlan | RunConfig,
    out_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    engine: RolloutEngine | None = None,
    on_sft_step: Callable[[int, float], None] | None = None,
) -> Trainer:
    """Everything a run needs, ready to `fit`.

    ``out_dir`` must be new or empty unless ``resume`` (continue the run in it; the config may differ only
    in `RESUMABLE_KEYS`) or ``overwrite`` (remove its run first); else `RunDirError`. The training task (with
    ``data.reward``, imported here) is built before the directory is claimed. On a fresh run: build or load the
    model, run the SFT warm-up (``on_sft_step(step, loss)`` after each step; the losses also go to
    ``sft_metrics.jsonl``), save it atomically as ``out/initial``. On resume, ``out/initial`` is loaded and the
    newest intact checkpoint's weights replace the policy's. The plan's `Algorithm` is the one trained (a plan
    builds one trainer).
    """
    plan = as_plan(run)
    cfg, algorithm = plan.config, plan.algorithm
    out = Path(out_dir)
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    changes = check_run_dir(out, cfg, resume=resume, overwrite=overwrite)  # every rank: read only
    task = training_task(plan)
    if distributed:
        dist.barrier()
    if rank == 0:
        claim_run_dir(out, cfg, changes, overwrite=overwrite)
    initial = out / "initial"
    if not (resume and _initial_is_usable(initial, out / "checkpoints")):
        if rank == 0:
            build_initial(cfg, out, task, on_sft_step=on_sft_step)
        if distributed:
            dist.barrier()
    model, tokenizer = load_model(initial, cfg)
    m = cfg.model
    model = prepare_policy(model, lora=m.lora, gradient_checkpointing=m.gradient_checkpointing, base_path=initial)
    device = next(model.parameters()).device
    for module in algorithm.modules:  # on the policy's device: NCCL all-reduces their gradients there
        module.to(device)
    context = _fill_context(plan, model, tokenizer, initial, getattr(task, "domains", ()))

    def fill(need: Need) -> Filler:
        make = NEEDS[need].fill
        assert make is not None, need
        return make(context)

    fillers = {n: fill(n) for n in algorithm.needs - algorithm.provides if NEEDS[n].fill is not None}
    stages = build_stages(
        cfg, vocab_size=len(tokenizer), world=dist.get_world_size() if distributed else 1, tokenizer=tokenizer,
        task=task,
    )  # fmt: skip
    if algorithm.edge is not None:  # the method's own pieces, e.g. Self-Routing's router and queue-only forwards
        encode = functools.partial(m.prompt_format().encode, tokenizer)
        own_stages, own_fillers = algorithm.edge(
            EdgeContext(
                cfg.seed,
                tokenizer,
                task,
                encode,
                fill,
                has_teacher=m.teacher is not None or m.teachers is not None,
                policy=model,
                temperature=plan.sampling.temperature,
            )
        )
        stages, fillers = stages + own_stages, {**fillers, **own_fillers}
    wrapped = wrap_model(model, cfg.distributed.strategy)  # FSDP2 shards in place, before the engine sees it
    engine = engine or ENGINE_FACTORIES[cfg.rollout.engine](cfg, plan.sampling, model, tokenizer, initial)
    trainer = Trainer(
        cfg, model=wrapped, tokenizer=tokenizer, task=task, engine=engine, algorithm=algorithm,
        sampling=plan.sampling, out_dir=out, fillers=fillers, stages=stages,
    )  # fmt: skip
    if resume:
        trainer.resume()
        trainer.resumed_with = {k: [old, new] for k, (old, new) in changes.items()} or None
    return trainer


def train(
    run: RunPlan | RunConfig,
    out_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool | None = None,
) -> list[dict[str, Any]]:
    """Build the trainer and run it, showing its progress (`posttrain.llm.train.progress`: bars on a terminal,
    plain lines in a log): the model build, the SFT warm-up (loss) and the RL steps (reward, KL, entropy);
    every step's metrics also go to the sinks (`posttrain.llm.train.sinks`: curves.png, TensorBoard, W&B)."""
    from posttrain.llm.train.progress import run_progress

    plan = as_plan(run)
    cfg = plan.config
    show = cfg.logging.progress if progress is None else progress
    with run_progress(steps=cfg.optim.steps, sft_steps=cfg.data.sft_steps, show=show) as bar:
        trainer = build_trainer(plan, out_dir, resume=resume, overwrite=overwrite, on_sft_step=bar.sft_step)
        bar.ready(trainer.step)
        with metric_sinks(cfg, Path(out_dir), rank=trainer.rank) as to_sinks:

            def on_step(m: dict[str, Any]) -> None:
                bar.train_step(m)
                to_sinks(m)

            return trainer.fit(on_step=on_step)


def grpo_then_es(
    run_config: RunPlan | RunConfig,
    out_dir: str | Path,
    es_config: EsTrainConfig,
    *,
    prompts_per_step: int,
    max_new_tokens: int | None = None,
    rl_first: bool = True,
    micro_batch: int | None = None,
    on_step: Callable[[EsStepLog], None] | None = None,
    overwrite: bool = False,
) -> tuple[list[dict[str, Any]], list[EsStepLog]]:
    """The sequential GRPO -> ES schedule (Ba et al. 2026, §4C): the RL trainer's run, then ES from its endpoint.

    ``run_config`` is a `RunPlan` or `RunConfig` (its ``optim.steps`` are the GRPO
    half; ``rl_first=False`` skips it: ES from the SFT'd model); ES then runs ``es_config.steps`` on the
    same model, task and response limit with greedy fitness on ``prompts_per_step`` prompts per step
    (``micro_batch`` of them per ``generate`` call).
    The ES endpoint is saved (atomically) as ``out_dir/es``; ``overwrite`` replaces a run already in ``out_dir``.
    """
    plan = as_plan(run_config)
    cfg = plan.config
    trainer = build_trainer(plan, out_dir, overwrite=overwrite)
    rl_logs = trainer.fit() if rl_first else []
    model = trainer.policy
    fitness = generation_fitness(
        model, trainer.tokenizer, trainer.task, prompts_per_step=prompts_per_step, seed=es_config.seed,
        max_new_tokens=max_new_tokens or cfg.rollout.max_new_tokens,
        **cfg.model.prompt_format().options(), micro_batch=micro_batch,
    )  # fmt: skip
    es_logs = es_train(trainable_params(model), fitness, es_config, on_step=on_step)
    with atomic_directory(Path(out_dir) / "es") as tmp:
        model.save_pretrained(tmp)
        trainer.tokenizer.save_pretrained(tmp)
    return rl_logs, es_logs


def es_from_config(
    run: RunPlan | RunConfig,
    out_dir: str | Path,
    *,
    on_step: Callable[[EsStepLog], None] | None = None,
    overwrite: bool = False,
) -> tuple[list[dict[str, Any]], list[EsStepLog]]:
    """``posttrain es``: the config's ``es`` section (`EsConfig`) run by `grpo_then_es`.

    Each ES step is appended to ``out_dir/es_metrics.jsonl`` (``step`` from 1, population
    ``reward_mean`` and ``reward_std``, ``noop``); RL steps (``es.after_rl``) go to ``metrics.jsonl`` as usual.
    """
    plan = as_plan(run)
    cfg = plan.config
    e = cfg.es
    es_config = EsTrainConfig(
        population=e.population, sigma=e.sigma, lr=e.lr, steps=e.steps, seed=cfg.seed, antithetic=e.antithetic,
        shaping=e.shaping, lockstep=e.lockstep,
    )  # fmt: skip
    log_path = Path(out_dir) / "es_metrics.jsonl"

    def log(entry: EsStepLog) -> None:
        if rank_world(None)[0] == 0:
            append_jsonl(log_path, {**entry._asdict(), "step": entry.step + 1})
        if on_step is not None:
            on_step(entry)

    return grpo_then_es(
        plan, out_dir, es_config, prompts_per_step=e.prompts_per_step or cfg.data.prompts_per_step,
        rl_first=e.after_rl, micro_batch=e.micro_batch, on_step=log, overwrite=overwrite,
    )  # fmt: skip
