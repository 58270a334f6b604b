"""Assembling a run from a config: model, SFT warm-up, reference/teacher, engine, algorithm, trainer.

This is the config edge: names are resolved here (engine factories, the algorithm bundle, the
task) and nowhere in the loop. Directory layout of a run::

    out/config.yaml       the resolved config
    out/tiny/             the built tiny model (when model.path is null)
    out/initial/          the policy after the SFT warm-up (reference model; vLLM loads it)
    out/metrics.jsonl     one JSON object per step
    out/checkpoints/      step_NNNNNN/ (atomic)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import yaml

from posttrain.llm.algorithm import build_algorithm
from posttrain.llm.config import RunConfig, config_to_dict
from posttrain.llm.generate import HFEngine, RolloutEngine, token_logprobs
from posttrain.llm.gflowrl_algorithm import prompt_feature_filler
from posttrain.llm.parallel import wrap_frozen, wrap_model
from posttrain.llm.sinks import metric_sinks
from posttrain.llm.stages import build_stages
from posttrain.llm.tasks import make_task
from posttrain.llm.topk_fill import StudentTopK, topk_logp_filler
from posttrain.llm.trainer import Filler, Trainer

__all__ = ["ENGINE_FACTORIES", "build_trainer", "load_model", "train"]


def load_model(path: str | Path, cfg: RunConfig) -> tuple[Any, Any]:
    """``AutoModelForCausalLM`` and ``AutoTokenizer`` from a local directory or hub id."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    auto: Any = AutoModelForCausalLM
    model = auto.from_pretrained(str(path), dtype=getattr(torch, cfg.model.dtype)).to(cfg.model.device)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _hf_engine(cfg: RunConfig, model: Any, tokenizer: Any, model_dir: Path) -> RolloutEngine:
    sharded = cfg.distributed.strategy == "fsdp" and dist.is_available() and dist.is_initialized()
    return HFEngine(
        model,
        pad_id=tokenizer.pad_token_id,
        eos_id=tokenizer.eos_token_id,
        sampling=cfg.rollout.sampling(),
        synced_gpus=sharded,
    )


def _vllm_engine(cfg: RunConfig, model: Any, tokenizer: Any, model_dir: Path) -> RolloutEngine:
    from posttrain.llm.generate_vllm import VLLMEngine

    return VLLMEngine(
        model_dir,
        sampling=cfg.rollout.sampling(),
        seed=cfg.seed,
        dtype=cfg.model.dtype,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization,
        device=cfg.model.device,
    )


ENGINE_FACTORIES: dict[str, Callable[[RunConfig, Any, Any, Path], RolloutEngine]] = {
    "hf": _hf_engine,
    "vllm": _vllm_engine,
}


def _logp_filler(model: Any, temperature: float) -> Filler:
    model.eval().requires_grad_(False)

    def fill(batch: Any) -> torch.Tensor:
        logp, _ = token_logprobs(
            model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask, temperature=temperature
        )
        return logp

    return fill


def build_trainer(
    cfg: RunConfig, out_dir: str | Path, *, resume: bool = False, engine: RolloutEngine | None = None
) -> Trainer:
    """Everything a run needs, ready to :meth:`~posttrain.llm.trainer.Trainer.fit`.

    On a fresh run: build or load the model, run the SFT warm-up, save it as ``out/initial``. On
    resume, ``out/initial`` is loaded and the checkpoint's weights replace the policy's.
    """
    from posttrain.llm.sft import sft_warmup
    from posttrain.llm.tiny import TinyConfig, build_tiny

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    task = make_task(cfg.data.task, **cfg.data.options)
    initial = out / "initial"
    if not (resume and (initial / "config.json").is_file()):
        if rank == 0:
            source = cfg.model.path or build_tiny(out / "tiny", TinyConfig(**cfg.model.tiny), seed=cfg.seed)
            model, tokenizer = load_model(source, cfg)
            if cfg.data.sft_steps:
                sft_warmup(
                    model,
                    tokenizer,
                    task,
                    steps=cfg.data.sft_steps,
                    batch_size=cfg.data.sft_batch_size,
                    lr=cfg.data.sft_lr,
                    seed=cfg.seed,
                    chat_template=cfg.model.chat_template,
                )
            model.save_pretrained(initial)
            tokenizer.save_pretrained(initial)
            (out / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
    model, tokenizer = load_model(initial, cfg)
    algorithm = build_algorithm(
        method=cfg.algorithm.method,
        horizon=cfg.rollout.max_new_tokens,
        advantage=cfg.algorithm.advantage,
        loss=cfg.algorithm.loss,
        aggregation=cfg.algorithm.aggregation,
        advantage_options=cfg.algorithm.advantage_options,
        loss_options=cfg.algorithm.loss_options,
        kl=cfg.algorithm.kl,
        kl_coef=cfg.algorithm.kl_coef,
        entropy_coef=cfg.algorithm.entropy_coef,
        options=cfg.algorithm.options,
    )
    device = next(model.parameters()).device
    for module in algorithm.modules:  # on the policy's device: NCCL all-reduces their gradients there
        module.to(device)
    fillers: dict[str, Filler] = {}
    temperature = cfg.rollout.temperature
    if algorithm.needs & {"logp_ref", "topk_logp_ref"}:
        reference = wrap_frozen(load_model(cfg.model.reference or initial, cfg)[0], cfg.distributed.strategy)
        fillers["logp_ref"] = _logp_filler(reference, temperature)
        fillers["topk_logp_ref"] = topk_logp_filler(reference, temperature=temperature, field="topk_logp_ref")
    if cfg.model.teacher is not None:
        teacher = wrap_frozen(load_model(cfg.model.teacher, cfg)[0], cfg.distributed.strategy)
        fillers["logp_teacher"] = _logp_filler(teacher, temperature)
        fillers["topk_logp_teacher"] = topk_logp_filler(teacher, temperature=temperature, field="topk_logp_teacher")
    student = StudentTopK(model, k=cfg.algorithm.topk, temperature=temperature)  # one forward for both fields
    fillers["topk_ids"], fillers["topk_logp_old"] = student.ids, student.logp
    if "prompt_features" in algorithm.needs:  # e.g. FlowRL's log-partition input, from the policy itself
        fillers["prompt_features"] = prompt_feature_filler(model)
    wrapped = wrap_model(model, cfg.distributed.strategy)  # FSDP2 shards in place, before the engine sees it
    engine = engine or ENGINE_FACTORIES[cfg.rollout.engine](cfg, model, tokenizer, initial)
    trainer = Trainer(
        cfg,
        model=wrapped,
        tokenizer=tokenizer,
        task=task,
        engine=engine,
        algorithm=algorithm,
        out_dir=out,
        fillers=fillers,
        stages=build_stages(
            cfg,
            vocab_size=len(tokenizer),
            world=dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1,
        ),
    )
    if resume:
        trainer.resume()
    return trainer


def train(
    cfg: RunConfig, out_dir: str | Path, *, resume: bool = False, progress: bool | None = None
) -> list[dict[str, Any]]:
    """Build the trainer and run it, with a rich progress bar showing reward, KL and entropy; every step's
    metrics also go to the TensorBoard / W&B sinks the config asks for (:mod:`posttrain.llm.sinks`)."""
    trainer = build_trainer(cfg, out_dir, resume=resume)
    show = cfg.logging.progress if progress is None else progress
    with metric_sinks(cfg, Path(out_dir), rank=trainer.rank) as to_sinks:
        if not show:
            return trainer.fit(on_step=to_sinks)
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
        ) as bar:
            job = bar.add_task("train", total=cfg.optim.steps, completed=trainer.step, info="")

            def on_step(m: dict[str, Any]) -> None:
                kl = "-" if m["kl"] is None else f"{m['kl']:.4f}"
                info = f"reward {m['reward_mean']:.3f}  kl {kl}  entropy {m['entropy']:.3f}"
                bar.update(job, completed=m["step"], info=info)
                to_sinks(m)

            return trainer.fit(on_step=on_step)
