"""The two sides of `benchmarks.bench_trainer`: our trainer and TRL's ``GRPOTrainer`` on one setup, stepped in turn."""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks._timing import clock

__all__ = ["Ours", "Setup", "Side", "trl_paired"]


@dataclass(frozen=True)
class Setup:
    """The task and prompt format both trainers get (``system``: a system turn before the chat-templated question)."""

    model_dir: Path
    task: str
    options: dict[str, Any]
    chat_template: bool = False
    system: str | None = None
    temperature: float = 1.0


@dataclass
class Side:
    """Per-step measurements of one trainer: step and generation times (seconds), tokens, decode steps."""

    step_s: list[float] = field(default_factory=list)
    gen_s: list[float] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    decode_steps: list[int] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    """Wall time of each step (ours only): a compile's worker processes are not in this process's CPU time."""
    shapes: list[tuple[list[int], list[list[int]]]] = field(default_factory=list)
    """Ours only: each step's G prompt lengths and ``[G][K]`` response lengths (the compute floor's input)."""
    flops: float | None = None
    """FLOPs of one untimed step (``torch.utils.flop_counter``: matmuls and attention kernels it knows)."""
    first_wall_s: float | None = None
    """Ours only: wall time of that untimed step, the trainer's first (a ``torch.compile`` happens in it)."""

    def after(self, warmup: int) -> Side:
        """The same measurements without the first ``warmup`` steps."""
        return Side(
            self.step_s[warmup:], self.gen_s[warmup:], self.tokens[warmup:], self.decode_steps[warmup:],
            self.wall_s[warmup:], self.shapes[warmup:], self.flops, self.first_wall_s,
        )  # fmt: skip

    @property
    def step(self) -> float:
        return statistics.median(self.step_s)

    @property
    def gen_share(self) -> float:
        return sum(self.gen_s) / sum(self.step_s)

    @property
    def tokens_per_s(self) -> float:
        return sum(self.tokens) / sum(self.step_s)


def _time_engine(engine: Any, side: Side, now: Callable[[], float]) -> None:
    """Record the time, decode steps and lengths of every ``engine.generate`` call in ``side`` (the instance's
    method is wrapped in place, so every holder of the engine calls the timed one)."""
    generate = engine.generate

    def timed(prompts: Sequence[Sequence[int]], *, n: int, seed: int, greedy: bool = False) -> Any:
        start = now()
        r = generate(prompts, n=n, seed=seed, greedy=greedy)
        side.gen_s.append(now() - start)
        side.decode_steps.append(int(r.response_ids.shape[1]))
        side.shapes.append(([len(p) for p in prompts], r.mask.sum(-1).reshape(len(prompts), n).tolist()))
        return r

    engine.generate = timed


def _flops(fn: Callable[[], Any]) -> float:
    """FLOPs counted by ``FlopCounterMode`` while ``fn`` runs."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as mode:
        fn()
    return float(mode.get_total_flops())


class Ours:
    """Our trainer on the benchmark setup, stepped one ``train_step`` at a time."""

    def __init__(self, args: argparse.Namespace, setup: Setup, engine: str, out: str) -> None:
        from posttrain.llm.config import config_from_dict
        from posttrain.llm.run import build_trainer

        cfg = config_from_dict(
            {
                "seed": 0,
                "model": {"path": str(setup.model_dir), "dtype": "float32", "chat_template": setup.chat_template,
                          "system_prompt": setup.system},
                "data": {"task": setup.task, "options": setup.options, "prompts_per_step": args.prompts},
                "rollout": {
                    "engine": engine,
                    "group_size": args.k,
                    "max_new_tokens": args.tokens,
                    "temperature": setup.temperature,
                    "compile_decode": engine == "hf" and args.compile_decode,
                },
                "algorithm": {"method": "grpo"},
                "optim": {
                    "steps": 10_000,
                    "lr": 1e-5,
                    "max_grad_norm": 1.0,
                    "options": {"fused": True, "weight_decay": 0.0},
                },
                "logging": {"progress": False},
            }
        )  # fmt: skip
        self.side, self.now, self.rows = Side(), clock(), args.prompts * args.k
        self.trainer = build_trainer(cfg, out)
        self.trainer.out_dir = None  # measure the loop, not checkpoint writing
        _time_engine(self.trainer.engine, self.side, self.now)

    def step(self) -> None:
        start, wall = self.now(), time.perf_counter()
        metrics = self.trainer.train_step()
        self.side.step_s.append(self.now() - start)
        self.side.wall_s.append(time.perf_counter() - wall)
        self.side.tokens.append(metrics["response_len"] * self.rows)

    def count_flops(self) -> None:
        """Count one untimed step's FLOPs (its measurements are dropped; its wall time is kept apart)."""
        wall = time.perf_counter()
        self.side.flops = _flops(self.trainer.train_step)
        self.side.first_wall_s = time.perf_counter() - wall
        del self.side.gen_s[-1], self.side.decode_steps[-1], self.side.shapes[-1]


def trl_paired(args: argparse.Namespace, setup: Setup, partner: Ours, *, partner_first: bool) -> Side:
    """TRL's GRPOTrainer on the benchmark setup; ``partner.step()`` runs once beside each of its steps.

    TRL's first step (a warm-up step) and one more step of ours before the steps start are counted with
    ``FlopCounterMode`` (untimed), each alone.
    """
    from datasets import Dataset
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from posttrain.llm.rollout.tasks import make_task

    side, now, steps = Side(), clock(), args.warmup + args.steps
    task = make_task(setup.task, **setup.options)
    problems = task.sample(random.Random(0), args.prompts * steps)
    answers = {p.prompt: p for p in problems}
    head = [{"role": "system", "content": setup.system}] if setup.system is not None else []

    def prompt(text: str) -> Any:
        return [*head, {"role": "user", "content": text}] if setup.chat_template else text

    def text_of(x: Any) -> str:  # a plain string, or the last message of a conversation
        return x if isinstance(x, str) else x[-1]["content"]

    data = Dataset.from_list([{"prompt": prompt(p.prompt)} for p in problems])

    def reward(prompts: list[Any], completions: list[Any], **_: Any) -> list[float | None]:
        return [task.reward(answers[text_of(p)], text_of(c)) for p, c in zip(prompts, completions, strict=True)]

    partner.count_flops()

    class Interleave(TrainerCallback):  # type: ignore[misc]
        counting: FlopCounterMode | None = None

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if partner_first and state.global_step > 0:
                partner.step()
            if state.global_step == 0:
                self.counting = FlopCounterMode(display=False)
                self.counting.__enter__()
            self.start = now()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            side.step_s.append(now() - self.start)
            if self.counting is not None:
                self.counting.__exit__(None, None, None)
                side.flops, self.counting = float(self.counting.get_total_flops()), None
            if not partner_first or state.global_step == 1:  # TRL's counted step had no partner before it
                partner.step()

    model: Any = AutoModelForCausalLM.from_pretrained(setup.model_dir, dtype=torch.float32)
    generate = model.generate

    def timed_generate(*a: Any, **k: Any) -> Any:
        start = now()
        out = generate(*a, **k)
        side.gen_s.append(now() - start)
        side.decode_steps.append(int(out.shape[1] - k["input_ids"].shape[1]))
        return out

    model.generate = timed_generate
    like_with_like: dict[str, Any] = {} if args.trl_defaults else {"bf16": False, "gradient_checkpointing": False}
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, use_cpu=True, **like_with_like, optim="adamw_torch_fused", weight_decay=0.0,
            per_device_train_batch_size=args.prompts * args.k, num_generations=args.k,
            max_completion_length=args.tokens, max_steps=steps, learning_rate=1e-5, beta=0.0,
            temperature=setup.temperature, top_p=1.0, top_k=0, report_to=[], logging_steps=1, save_strategy="no",
            disable_tqdm=True, log_level="error", loss_type="grpo", seed=0, max_grad_norm=1.0,
        )  # fmt: skip
        trainer = GRPOTrainer(
            model=model, reward_funcs=reward, args=config, train_dataset=data,
            processing_class=AutoTokenizer.from_pretrained(setup.model_dir), callbacks=[Interleave()],
        )  # fmt: skip
        trainer.remove_callback(PrinterCallback)  # no per-step log dicts on stdout
        trainer.train()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    side.tokens = [length * args.prompts * args.k for length in lengths]
    return side
