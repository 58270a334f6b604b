"""Our GRPO trainer against TRL's ``GRPOTrainer`` on the same tiny model, prompts and sizes, same run.

Both sides: the tiny Qwen2 model (hidden 128, 2 layers) built and saved locally, untrained (so
completions run to ``max_new_tokens`` on both sides), one-digit addition prompts, G prompts x K
samples per step, one optimizer step per rollout batch, AdamW, no KL (TRL ``beta=0``), CPU, float32.
Reports the median step time after warm-up, generated tokens per second, their ratio (target:
ours <= 0.5x TRL's step time), the share of our step spent in generation, and, where vLLM is
installed, our trainer with the vLLM engine against the HF engine.

    python -m benchmarks.bench_trainer [--steps 16] [--warmup 3] [--threads 2]

TRL comes from the ``[trl]`` extra and vLLM from ``make test-vllm``'s venv; a missing one is
skipped with the reason printed. This is a measurement: the exit status is 0 either way.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

TARGET_RATIO = 0.5


def _cfg(args: argparse.Namespace, model_dir: Path, engine: str) -> Any:
    from posttrain.llm.config import config_from_dict

    return config_from_dict(
        {
            "seed": 0,
            "model": {"path": str(model_dir)},
            "data": {"task": "addition", "options": {"digits": 1}, "prompts_per_step": args.prompts},
            "rollout": {"engine": engine, "group_size": args.k, "max_new_tokens": args.tokens},
            "algorithm": {"method": "grpo"},
            "optim": {"steps": args.warmup + args.steps, "lr": 1e-4, "max_grad_norm": 1.0},
            "logging": {"progress": False},
        }
    )


def ours(args: argparse.Namespace, model_dir: Path, engine: str) -> dict[str, float]:
    """Median step time, generation share and tokens/s of our trainer."""
    from posttrain.llm.run import build_trainer

    cfg = _cfg(args, model_dir, engine)
    with tempfile.TemporaryDirectory() as out:
        trainer = build_trainer(cfg, out)
        trainer.out_dir = None  # measure the loop, not checkpoint writing
        history = trainer.fit()
    timed = history[args.warmup :]
    step = statistics.median(m["step_time_s"] for m in timed)
    gen = statistics.median(m["gen_time_s"] / m["step_time_s"] for m in timed)
    tokens = statistics.mean(m["response_len"] for m in timed) * args.prompts * args.k
    return {"step_s": step, "gen_share": gen, "tokens_per_s": tokens / step}


def trl(args: argparse.Namespace, model_dir: Path) -> dict[str, float]:
    """Median step time and tokens/s of TRL's GRPOTrainer on the same setup."""
    import random

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from posttrain.llm.tasks import make_task

    task = make_task("addition", digits=1)
    problems = task.sample(random.Random(0), args.prompts * (args.warmup + args.steps))
    answers = {p.prompt: p for p in problems}
    data = Dataset.from_list([{"prompt": p.prompt} for p in problems])

    def reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        return [task.reward(answers[p], c) for p, c in zip(prompts, completions, strict=True)]

    times: list[float] = []

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            times.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            per_device_train_batch_size=args.prompts * args.k,
            num_generations=args.k,
            max_completion_length=args.tokens,
            max_steps=args.warmup + args.steps,
            learning_rate=1e-4,
            beta=0.0,
            temperature=1.0,
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
        tok = AutoTokenizer.from_pretrained(model_dir)
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir),
            reward_funcs=reward,
            args=config,
            train_dataset=data,
            processing_class=tok,
            callbacks=[Clock()],
        )
        trainer.remove_callback(PrinterCallback)  # no per-step log dicts on stdout
        trainer.train()
        lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    step = statistics.median(times[args.warmup :])
    tokens = statistics.mean(lengths[args.warmup :]) * args.prompts * args.k
    return {"step_s": step, "tokens_per_s": tokens / step}


def _line(name: str, r: dict[str, float]) -> str:
    share = r["gen_share"]
    return (
        f"{name} step {r['step_s'] * 1e3:.0f} ms, {r['tokens_per_s']:.0f} tokens/s, "
        f"generation {share:.0%} of the step, training {1 - share:.0%}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_trainer", description=__doc__)
    p.add_argument("--steps", type=int, default=16, help="timed steps per side")
    p.add_argument("--warmup", type=int, default=3, help="untimed first steps per side")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (G)")
    p.add_argument("--k", type=int, default=8, help="samples per prompt (K)")
    p.add_argument("--tokens", type=int, default=16, help="max new tokens")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers.utils import logging

    logging.disable_progress_bar()
    from posttrain.llm.tiny import build_tiny

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny(Path(tmp) / "tiny", seed=0)
        ours_hf = ours(args, model_dir, "hf")
        print(_line("ours (HF engine):  ", ours_hf))
        if importlib.util.find_spec("vllm") is None:
            print("ours (vLLM engine): skipped: vllm is not installed (make test-vllm installs it into .venv-vllm)")
        else:
            v = ours(args, model_dir, "vllm")
            print(_line("ours (vLLM engine):", v) + f"; vLLM/HF step-time ratio {v['step_s'] / ours_hf['step_s']:.2f}")
        if importlib.util.find_spec("trl") is None:
            print("TRL GRPOTrainer:   skipped: trl is not installed (pip install -e '.[trl]')")
            return 0
        t = trl(args, model_dir)
        ratio = ours_hf["step_s"] / t["step_s"]
        print(f"TRL GRPOTrainer:    step {t['step_s'] * 1e3:.0f} ms, {t['tokens_per_s']:.0f} tokens/s")
        print(
            f"ours/TRL step-time ratio {ratio:.2f} (target <= {TARGET_RATIO}: {'met' if ratio <= TARGET_RATIO else 'NOT met'}); "
            f"tokens/s ratio {ours_hf['tokens_per_s'] / t['tokens_per_s']:.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
