"""Our GRPO trainer against TRL's ``GRPOTrainer`` on the same model, prompts and sizes, same run.

Two models (``--model``):

- ``tiny`` (default): the tiny Qwen2 model (hidden 128, 2 layers) built and saved locally, untrained (so
  most completions run to ``max_new_tokens``), one-digit addition prompts (no chat template, no special
  tokens), sampling at temperature 1. Goal: our step <= 0.6x TRL's.
- ``smollm2``: the prepared SmolLM2-135M-Instruct (``posttrain models prepare smollm2-135m-instruct``), the
  chat addition task of ``examples/smollm2_cpu.yaml`` through the model's chat template with its system
  prompt (41 prompt tokens), temperature 0.7. Goals: our step <= 0.45x TRL's, and <= 1.3x the compute
  floor (`benchmarks._step_floor`: the FLOPs a step needs with each prompt computed once, over the
  FLOP/s of a training-sized float32 matmul measured in the same run).

Both sides: G prompts x K samples per step, no top-p/top-k cut, one optimizer step per rollout batch, no
KL (TRL ``beta=0``), float32 weights and compute (TRL's defaults ``bf16=True`` and
``gradient_checkpointing=True`` are turned off), fused AdamW with no weight decay (TRL's default
optimizer ``adamw_torch_fused``; ours gets ``fused=True, weight_decay=0``), gradient clipping at 1, CPU,
``--threads`` torch threads for both, glibc's malloc tuned as the ``posttrain`` CLI tunes it (for both).

How it is timed, so that a shared, loaded machine biases neither side:

- The two trainers run interleaved, step for step: one of our steps runs from TRL's step callback,
  before TRL's step on even repeats and after it on odd ones, so both see the same machine load.
- A step is timed with :func:`benchmarks._timing.clock` (CPU time of the process at one thread,
  where another process holding the core does not count; wall time otherwise). TRL's step is
  ``on_step_begin`` to ``on_step_end`` (generation, scoring, loss, backward, optimizer); its data
  loading and logging between steps are not counted, in its favour. Ours is a whole
  ``Trainer.train_step`` (sampling problems, generation, decoding, scoring, advantages, loss,
  backward, optimizer, metrics).
- Each repeat builds both trainers afresh, drops ``--warmup`` steps (at least 1: TRL's first step is
  counted by ``FlopCounterMode``, as is one extra step of ours) and takes the median of the rest; the
  ratio ``ours / TRL`` is reported as the median over ``--repeats`` repeats with its range. Generation
  time is the engine's ``generate`` (ours) or the model's ``generate`` (TRL).
- The FLOPs of one step of each side (``torch.utils.flop_counter``) are printed beside the needed
  FLOPs of our steps (`benchmarks._step_floor.needed_flops`).

``--compile-decode`` turns on our engine's ``rollout.compile_decode`` (the decode step through
``torch.compile`` with a static KV cache); the compile happens in the first warm-up step, whose time
is printed: the timed steps then show the compiled step, not its amortised cost.

``--trl-defaults`` leaves TRL's ``bf16`` autocast and gradient checkpointing on, to show what
they cost it here; that run does not compare like with like.

Where vLLM is installed, our trainer with the vLLM engine is timed against the HF engine the same
way (alternating steps).

    python -m benchmarks.bench_trainer [--model tiny|smollm2] [--repeats 5] [--steps 8] [--warmup 2]
        [--threads 1] [--compile-decode]

TRL comes from the ``[trl]`` extra (``.venv-adapters``) and vLLM from ``make test-vllm``'s venv; a
missing one is skipped with the reason printed. This is a measurement: the exit status is 0 either way.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks._step_floor import ModelShape, matmul_rate, needed_flops
from benchmarks._timing import Spread, clock, tune_malloc
from benchmarks._trainer_pair import Ours, Setup, Side, trl_paired

GOALS = {"tiny": {"trl": 0.6}, "smollm2": {"trl": 0.45, "floor": 1.3}}
"""Goals of the performance issue: our step at most this times TRL's, and the compute floor."""

SMOLLM2_SYSTEM = "You are a calculator. Reply with only the final number."


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


def _setup(args: argparse.Namespace, tmp: str) -> Setup:
    """The model directory and task of ``--model``."""
    if args.model == "tiny":
        from posttrain.llm.tools.tiny import build_tiny

        return Setup(build_tiny(Path(tmp) / "tiny", seed=0), "addition", {"digits": 1})
    from posttrain.llm.tools.models import resolve_model_path

    path = resolve_model_path("smollm2-135m-instruct")
    if path is None or not Path(path).is_dir():
        raise SystemExit("SmolLM2 is not prepared: posttrain models prepare smollm2-135m-instruct")
    options = {"low": 10, "high": 99, "low_b": 1, "high_b": 9}
    return Setup(Path(path), "chat_addition", options, chat_template=True, system=SMOLLM2_SYSTEM, temperature=0.7)


def _floor(sides: list[Side], model_dir: Path, rows: int) -> tuple[Spread, float, float]:
    """Our step over the compute floor (per repeat: median step / median floor), needed FLOPs per step, FLOP/s."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        shape = ModelShape.of(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir)))
    rate = matmul_rate(rows, shape.d_model, shape.d_ffn)
    needed = [[needed_flops(shape, *step) for step in s.shapes] for s in sides]
    ratios = [s.step / (statistics.median(n) / rate) for s, n in zip(sides, needed, strict=True)]
    return Spread.of(ratios), statistics.median(x for n in needed for x in n), rate


def _goal(ratio: Spread, goal: float) -> str:
    return f"{ratio}x (goal <= {goal}: {'met' if ratio.median <= goal else 'NOT met'})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_trainer", description=__doc__)
    p.add_argument("--model", choices=sorted(GOALS), default="tiny", help="tiny (built here) or smollm2 (prepared)")
    p.add_argument("--repeats", type=int, default=5, help="independent repeats (fresh trainers)")
    p.add_argument("--steps", type=int, default=8, help="timed steps per side and repeat")
    p.add_argument("--warmup", type=int, default=2, help="untimed first steps per side and repeat (>= 1)")
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
    args.warmup = max(args.warmup, 1)
    torch.set_num_threads(args.threads)
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()
    tuned = tune_malloc()
    clock_name = "wall time" if clock() is time.perf_counter else "CPU time"
    print(f"{args.model}: {args.prompts} prompts x {args.k} samples, <= {args.tokens} new tokens, float32; "
          f"{args.threads} torch thread(s), timed by {clock_name}; malloc tuned: {tuned}; load average at start {_load()}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        setup = _setup(args, tmp)
        have_trl, have_vllm = importlib.util.find_spec("trl") is not None, importlib.util.find_spec("vllm") is not None
        ours_hf: list[Side] = []
        ours_warm: list[Side] = []  # every step, the warm-up included
        trl: list[Side] = []
        vllm: list[tuple[Side, Side]] = []
        for r in range(args.repeats):
            ours = Ours(args, setup, "hf", f"{tmp}/ours{r}")
            if have_trl:
                trl.append(trl_paired(args, setup, ours, partner_first=r % 2 == 0).after(args.warmup))
            else:
                ours.count_flops()
                for _ in range(args.warmup + args.steps):
                    ours.step()
            ours_hf.append(ours.side.after(args.warmup))
            ours_warm.append(ours.side)
            if have_vllm:
                vllm.append(_vllm_pair(args, setup, f"{tmp}/pair{r}"))
        if args.compile_decode:
            first = Spread.of([s.first_wall_s if s.first_wall_s is not None else s.wall_s[0] for s in ours_warm])
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
        goals = GOALS[args.model]
        floor, needed, rate = _floor(ours_hf, setup.model_dir, args.prompts * args.k * (args.tokens + 8))
        ours_flops = statistics.median(s.flops for s in ours_hf if s.flops is not None)
        print(f"needed {needed / 1e9:.0f} GFLOP per step (each prompt once); ours {ours_flops / 1e9:.0f} GFLOP "
              f"({ours_flops / needed:.2f}x needed); matmul rate {rate / 1e9:.1f} GFLOP/s")  # fmt: skip
        if "floor" in goals:
            print(f"ours/compute-floor step ratio {_goal(floor, goals['floor'])}")
        else:
            print(f"ours/compute-floor step ratio {floor}x")
        if not have_trl:
            print("TRL GRPOTrainer:   skipped: trl is not installed (pip install -e '.[trl]'; .venv-adapters has it)")
        else:
            print(_report("TRL GRPOTrainer:   ", trl))
            trl_flops = statistics.median(s.flops for s in trl if s.flops is not None)
            print(f"TRL {trl_flops / 1e9:.0f} GFLOP per step ({trl_flops / needed:.2f}x needed)")
            ratio = Spread.of([o.step / t.step for o, t in zip(ours_hf, trl, strict=True)])
            tokens = Spread.of([o.tokens_per_s / t.tokens_per_s for o, t in zip(ours_hf, trl, strict=True)])
            print(f"ours/TRL step-time ratio {_goal(ratio, goals['trl'])} (median [min-max] over {args.repeats} "
                  f"repeats); tokens/s ratio {tokens}x")  # fmt: skip
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"load average at end {_load()}; process CPU time {usage.ru_utime + usage.ru_stime:.0f} s")
    return 0


def _vllm_pair(args: argparse.Namespace, setup: Setup, out: str) -> tuple[Side, Side]:
    """Our trainer with the HF and the vLLM engine, alternating steps (vLLM's CPU KV cache: 1 GiB unless set)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    hf, v = Ours(args, setup, "hf", f"{out}/hf"), Ours(args, setup, "vllm", f"{out}/vllm")
    for _ in range(args.warmup + args.steps):
        hf.step()
        v.step()
    return hf.side.after(args.warmup), v.side.after(args.warmup)


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min; {os.cpu_count()} cores)"


if __name__ == "__main__":
    raise SystemExit(main())
