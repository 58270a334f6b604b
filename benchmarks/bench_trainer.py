"""Our GRPO trainer against TRL's ``GRPOTrainer`` on the same tiny model, prompts and sizes, same run.

Both sides: the tiny Qwen2 model (hidden 128, 2 layers) built and saved locally, untrained (so most
completions run to ``max_new_tokens``), one-digit addition prompts (no chat template, no special
tokens), G prompts x K samples per step, sampling at temperature 1 with no top-p/top-k cut, one
optimizer step per rollout batch, no KL (TRL ``beta=0``), float32 weights and compute (TRL's
defaults ``bf16=True`` and ``gradient_checkpointing=True`` are turned off), fused AdamW with no
weight decay (TRL's default optimizer ``adamw_torch_fused``; ours gets ``fused=True,
weight_decay=0``), gradient clipping at 1, CPU, ``--threads`` torch threads for both.

How it is timed, so that a shared, loaded machine biases neither side:

- The two trainers run interleaved, step for step: one of our steps runs from TRL's step callback,
  before TRL's step on even repeats and after it on odd ones, so both see the same machine load.
- A step is timed with :func:`benchmarks._timing.clock` (CPU time of the process at one thread,
  where another process holding the core does not count; wall time otherwise). TRL's step is
  ``on_step_begin`` to ``on_step_end`` (generation, scoring, loss, backward, optimizer); its data
  loading and logging between steps are not counted, in its favour. Ours is a whole
  ``Trainer.train_step`` (sampling problems, generation, decoding, scoring, advantages, loss,
  backward, optimizer, metrics).
- Each repeat builds both trainers afresh, drops ``--warmup`` steps and takes the median of the
  rest; the ratio ``ours / TRL`` is reported as the median over ``--repeats`` repeats with its
  range. Generation time is the engine's ``generate`` (ours) or the model's ``generate`` (TRL).
- Both sides generate with transformers' ``generate`` until every row has hit ``<eos>`` or
  ``max_new_tokens``; the decode steps per batch (the generation work) and the mean completion
  length (tokens/s) are printed for both.

``--compile-decode`` turns on our engine's ``rollout.compile_decode`` (the decode step through
``torch.compile`` with a static KV cache); the compile happens in the first warm-up step, whose time
is printed: the timed steps then show the compiled step, not its amortised cost.

``--trl-defaults`` leaves TRL's ``bf16`` autocast and gradient checkpointing on, to show what
they cost it here; that run does not compare like with like.

Where vLLM is installed, our trainer with the vLLM engine is timed against the HF engine the same
way (alternating steps).

    python -m benchmarks.bench_trainer [--repeats 5] [--steps 8] [--warmup 2] [--threads 1] [--compile-decode]

TRL comes from the ``[trl]`` extra and vLLM from ``make test-vllm``'s venv; a missing one is
skipped with the reason printed. This is a measurement: the exit status is 0 either way.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks._timing import Spread, clock

TARGET_RATIO = 0.6
"""The goal of the performance issue: our step at most 0.6x TRL's, like for like."""


@dataclass
class Side:
    """Per-step measurements of one trainer: step and generation times (seconds), tokens, decode steps."""

    step_s: list[float] = field(default_factory=list)
    gen_s: list[float] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    decode_steps: list[int] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    """Wall time of each step (ours only): a compile's worker processes are not in this process's CPU time."""

    def after(self, warmup: int) -> Side:
        """The same measurements without the first ``warmup`` steps."""
        return Side(
            self.step_s[warmup:],
            self.gen_s[warmup:],
            self.tokens[warmup:],
            self.decode_steps[warmup:],
            self.wall_s[warmup:],
        )

    @property
    def step(self) -> float:
        return statistics.median(self.step_s)

    @property
    def gen_share(self) -> float:
        return sum(self.gen_s) / sum(self.step_s)

    @property
    def tokens_per_s(self) -> float:
        return sum(self.tokens) / sum(self.step_s)


class _TimedEngine:
    """A rollout engine that records the time and decode steps of every ``generate`` call in ``side``."""

    def __init__(self, engine: Any, side: Side, now: Callable[[], float]) -> None:
        self.engine, self.side, self.now = engine, side, now

    def generate(self, prompts: Sequence[Sequence[int]], *, n: int, seed: int, greedy: bool = False) -> Any:
        start = self.now()
        r = self.engine.generate(prompts, n=n, seed=seed, greedy=greedy)
        self.side.gen_s.append(self.now() - start)
        self.side.decode_steps.append(int(r.response_ids.shape[1]))
        return r

    def sync_weights(self, model: Any) -> None:
        self.engine.sync_weights(model)


class Ours:
    """Our trainer on the benchmark setup, stepped one ``train_step`` at a time."""

    def __init__(self, args: argparse.Namespace, model_dir: Path, engine: str, out: str) -> None:
        from posttrain.llm.config import config_from_dict
        from posttrain.llm.run import build_trainer

        cfg = config_from_dict(
            {
                "seed": 0,
                "model": {"path": str(model_dir), "dtype": "float32"},
                "data": {"task": "addition", "options": {"digits": 1}, "prompts_per_step": args.prompts},
                "rollout": {
                    "engine": engine,
                    "group_size": args.k,
                    "max_new_tokens": args.tokens,
                    "compile_decode": engine == "hf" and args.compile_decode,
                },
                "algorithm": {"method": "grpo"},
                "optim": {
                    "steps": 10_000,
                    "lr": 1e-4,
                    "max_grad_norm": 1.0,
                    "options": {"fused": True, "weight_decay": 0.0},
                },
                "logging": {"progress": False},
            }
        )
        self.side, self.now, self.rows = Side(), clock(), args.prompts * args.k
        self.trainer = build_trainer(cfg, out)
        self.trainer.out_dir = None  # measure the loop, not checkpoint writing
        self.trainer.engine = _TimedEngine(self.trainer.engine, self.side, self.now)

    def step(self) -> None:
        start, wall = self.now(), time.perf_counter()
        metrics = self.trainer.train_step()
        self.side.step_s.append(self.now() - start)
        self.side.wall_s.append(time.perf_counter() - wall)
        self.side.tokens.append(metrics["response_len"] * self.rows)


def trl_paired(args: argparse.Namespace, model_dir: Path, partner: Ours, *, partner_first: bool) -> Side:
    """TRL's GRPOTrainer on the benchmark setup; ``partner.step()`` runs once beside each of its steps."""
    import random

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from posttrain.llm.rollout.tasks import make_task

    side, now, steps = Side(), clock(), args.warmup + args.steps
    task = make_task("addition", digits=1)
    problems = task.sample(random.Random(0), args.prompts * steps)
    answers = {p.prompt: p for p in problems}
    data = Dataset.from_list([{"prompt": p.prompt} for p in problems])

    def reward(prompts: list[str], completions: list[str], **_: Any) -> list[float | None]:
        return [task.reward(answers[p], c) for p, c in zip(prompts, completions, strict=True)]

    class Interleave(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            if partner_first:
                partner.step()
            self.start = now()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            side.step_s.append(now() - self.start)
            if not partner_first:
                partner.step()

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
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
            output_dir=out,
            use_cpu=True,
            **like_with_like,
            optim="adamw_torch_fused",
            weight_decay=0.0,
            per_device_train_batch_size=args.prompts * args.k,
            num_generations=args.k,
            max_completion_length=args.tokens,
            max_steps=steps,
            learning_rate=1e-4,
            beta=0.0,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            report_to=[],
            logging_steps=1,
            save_strategy="no",
            disable_tqdm=True,
            log_level="error",
            loss_type="grpo",
            seed=0,
            max_grad_norm=1.0,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=data,
            processing_class=AutoTokenizer.from_pretrained(model_dir),
            callbacks=[Interleave()],
        )
        trainer.remove_callback(PrinterCallback)  # no per-step log dicts on stdout
        trainer.train()
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    side.tokens = [length * args.prompts * args.k for length in lengths]
    return side


def _report(name: str, sides: list[Side]) -> str:
    step = Spread.of([s.step * 1e3 for s in sides])
    share = statistics.median(s.gen_share for s in sides)
    tokens = statistics.median(s.tokens_per_s for s in sides)
    decode = statistics.mean(d for s in sides for d in s.decode_steps)
    length = statistics.mean(t for s in sides for t in s.tokens)
    return (
        f"{name} step {step} ms, {tokens:.0f} tokens/s, generation {share:.0%} of the step, "
        f"training {1 - share:.0%}; {decode:.1f} decode steps per batch, {length:.0f} tokens per batch"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_trainer", description=__doc__)
    p.add_argument("--repeats", type=int, default=5, help="independent repeats (fresh trainers)")
    p.add_argument("--steps", type=int, default=8, help="timed steps per side and repeat")
    p.add_argument("--warmup", type=int, default=2, help="untimed first steps per side and repeat")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (G)")
    p.add_argument("--k", type=int, default=8, help="samples per prompt (K)")
    p.add_argument("--tokens", type=int, default=16, help="max new tokens")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU-time clock)")
    p.add_argument(
        "--compile-decode",
        action="store_true",
        help="our HF engine with rollout.compile_decode (torch.compile, static KV cache); the compile falls in "
        "the warm-up steps, whose times are printed",
    )
    p.add_argument(
        "--trl-defaults",
        action="store_true",
        help="leave TRL's bf16 autocast and gradient checkpointing on (its defaults; not like with like)",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()
    from posttrain.llm.tools.tiny import build_tiny

    clock_name = "wall time" if clock() is time.perf_counter else "CPU time"
    print(f"{args.threads} torch thread(s), timed by {clock_name}; load average at start {_load()}")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny(Path(tmp) / "tiny", seed=0)
        have_trl, have_vllm = importlib.util.find_spec("trl") is not None, importlib.util.find_spec("vllm") is not None
        ours_hf: list[Side] = []
        ours_warm: list[Side] = []  # every step, the warm-up included
        trl: list[Side] = []
        vllm: list[tuple[Side, Side]] = []
        for r in range(args.repeats):
            ours = Ours(args, model_dir, "hf", f"{tmp}/ours{r}")
            if have_trl:
                trl.append(trl_paired(args, model_dir, ours, partner_first=r % 2 == 0).after(args.warmup))
            else:
                for _ in range(args.warmup + args.steps):
                    ours.step()
            ours_hf.append(ours.side.after(args.warmup))
            ours_warm.append(ours.side)
            if have_vllm:
                vllm.append(_vllm_pair(args, model_dir, f"{tmp}/pair{r}"))
        if args.compile_decode:
            first = Spread.of([s.wall_s[0] for s in ours_warm])
            print(
                f"ours: rollout.compile_decode on; first step (the compile; later repeats reuse it) {first} s wall, "
                "untimed (warm-up)"
            )
        print(_report("ours (HF engine):  ", ours_hf))
        if not have_vllm:
            print("ours (vLLM engine): skipped: vllm is not installed (make test-vllm installs it into .venv-vllm)")
        else:
            ratio = Spread.of([v.step / h.step for h, v in vllm])
            print(_report("ours (vLLM engine):", [v for _, v in vllm]) + f"; vLLM/HF step-time ratio {ratio}")
        if not have_trl:
            print("TRL GRPOTrainer:   skipped: trl is not installed (pip install -e '.[trl]')")
        else:
            print(_report("TRL GRPOTrainer:   ", trl))
            ratio = Spread.of([o.step / t.step for o, t in zip(ours_hf, trl, strict=True)])
            tokens = Spread.of([o.tokens_per_s / t.tokens_per_s for o, t in zip(ours_hf, trl, strict=True)])
            met = "met" if ratio.median <= TARGET_RATIO else "NOT met"
            print(
                f"ours/TRL step-time ratio {ratio} (median [min-max] over {args.repeats} repeats; "
                f"target <= {TARGET_RATIO}: {met}); tokens/s ratio {tokens}x"
            )
    print(f"load average at end {_load()}")
    return 0


def _vllm_pair(args: argparse.Namespace, model_dir: Path, out: str) -> tuple[Side, Side]:
    """Our trainer with the HF and the vLLM engine, alternating steps (vLLM's CPU KV cache: 1 GiB unless set)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    hf, v = Ours(args, model_dir, "hf", f"{out}/hf"), Ours(args, model_dir, "vllm", f"{out}/vllm")
    for _ in range(args.warmup + args.steps):
        hf.step()
        v.step()
    return hf.side.after(args.warmup), v.side.after(args.warmup)


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min; {os.cpu_count()} cores)"


if __name__ == "__main__":
    raise SystemExit(main())
