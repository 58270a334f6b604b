"""Validation of the trainer's methods on a real pretrained model (SmolLM2-135M-Instruct) on CPU.

Each method trains from the same base checkpoint with the same config (``examples/smollm2_cpu.yaml``,
shrunk by the options below), then the base and every trained model are scored on the same held-out
prompts (an RNG stream the training data never uses): accuracy of ``--samples`` sampled answers per
prompt (mean@1) and of the greedy answer, unbiased pass@k, each with a 95% confidence interval over
prompts, and the paired change against the base (per-prompt difference, its mean and 95% interval).
Every method runs in its own subprocess, so its wall time and peak resident memory are its own.

Methods: GRPO, Dr.GRPO, RLOO, GSPO and CISPO (sequence/clipped-IS ratio losses), SIS, OPD (teacher: the
GRPO-trained checkpoint of this run; student: the base; reverse-KL to the teacher on the student's
own samples, no task reward) and ES (``posttrain es``: population fitness from greedy rewards).

    python -m benchmarks.validate_real_model [--steps 8] [--eval-prompts 48] [--samples 4]
        [--methods grpo,drgrpo,...] [--out runs/validation] [--report docs/validation.md]

Needs ``posttrain models prepare smollm2-135m-instruct`` first. Writes the report (Markdown), a PNG
of the reward curves beside it, and ``results.json`` in ``--out``. A measurement: exit status 0
whatever the numbers say.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "smollm2_cpu.yaml"
METHODS = ("grpo", "drgrpo", "rloo", "gspo", "cispo", "sis", "opd", "es")
"""Run order: OPD needs the GRPO checkpoint."""


def _overrides(method: str, args: argparse.Namespace, out: Path) -> list[str]:
    """``--set`` overrides of the example config for one method."""
    common = [
        f"optim.steps={args.steps}",
        f"data.prompts_per_step={args.prompts_per_step}",
        f"rollout.group_size={args.group_size}",
        f"rollout.engine={args.engine}",
        "logging.progress=false",
        "logging.eval_every=0",
        "checkpoint.every=0",
        "checkpoint.keep=1",
    ]
    if method == "opd":
        teacher = _final_model(Path(args.teacher_run) if args.teacher_run else out / "grpo")
        return [*common, "algorithm.method=opd_then_rl", f"algorithm.options={{switch_step: {args.steps}}}",
                f"model.teacher={teacher}"]  # fmt: skip
    if method == "es":
        return [*common, f"es.steps={args.steps}", f"es.population={args.es_population}",
                f"es.prompts_per_step={args.es_prompts}", f"es.sigma={args.es_sigma}", f"es.lr={args.es_lr}"]  # fmt: skip
    return [*common, f"algorithm.method={method}"]


def _final_model(run: Path) -> Path:
    from posttrain.llm.train.checkpoint import latest_checkpoint

    if (run / "es" / "config.json").is_file():
        return run / "es"
    ckpt = latest_checkpoint(run / "checkpoints")
    if ckpt is None:
        raise FileNotFoundError(f"{run} has no checkpoint")
    return ckpt / "model"


def per_prompt_scores(model_dir: Path, cfg: Any, *, n_prompts: int, samples: int) -> dict[str, list[float]]:
    """Per held-out prompt: fraction of ``samples`` sampled answers correct, and the greedy answer's reward."""
    from posttrain.llm.rollout.engine import HFEngine
    from posttrain.llm.rollout.tasks import make_task
    from posttrain.llm.rollout.text import encode_prompts, score_responses
    from posttrain.llm.run import load_model
    from posttrain.llm.train.evaluate import HELD_OUT_OFFSET, held_out_problems

    model, tokenizer = load_model(model_dir, cfg)
    task = make_task(cfg.data.task, **cfg.data.options)
    problems = held_out_problems(task, cfg.seed, n_prompts)
    prompts = encode_prompts(tokenizer, [p.prompt for p in problems], chat_template=cfg.model.chat_template,
                             system=cfg.model.system_prompt)  # fmt: skip
    engine = HFEngine(
        model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, sampling=cfg.rollout.sampling()
    )
    sampled = engine.generate(prompts, n=samples, seed=cfg.seed + HELD_OUT_OFFSET)
    rewards, texts = score_responses(tokenizer, task, problems, sampled.response_ids, sampled.mask, samples)
    greedy = engine.generate(prompts, n=1, seed=cfg.seed, greedy=True)
    g_rewards, g_texts = score_responses(tokenizer, task, problems, greedy.response_ids, greedy.mask, 1)
    hits = (np.array(rewards).reshape(n_prompts, samples) >= 1.0).sum(axis=1)
    cut = float((sampled.mask.sum(dim=1) >= sampled.mask.shape[1]).float().mean()) if sampled.mask.numel() else 0.0
    return {
        "correct": [float(c) for c in hits],
        "greedy": [float(r >= 1.0) for r in g_rewards],
        "response_len": float(sampled.mask.sum(dim=1).float().mean()),
        "cut_at_max": cut,
        "examples": [t for t in g_texts[:3]] + [t for t in texts[:3]],
    }


def _child(method: str, args: argparse.Namespace) -> None:
    """Train (or, for ``base``, only score) one method and print one JSON line."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    from posttrain.llm.config import load_config
    from posttrain.llm.tools.models import resolve_model_path

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    out = Path(args.out)
    run = out / method
    cfg = load_config(EXAMPLE, [] if method == "base" else _overrides(method, args, out))
    start = time.perf_counter()
    history: list[dict[str, Any]] = []
    if method == "base":
        model_dir = Path(str(resolve_model_path(cfg.model.path)))
    elif method == "es":
        from posttrain.llm.run import es_from_config

        _, es_logs = es_from_config(cfg, run)
        history = [{"step": e.step + 1, "reward_mean": float(e.reward_mean)} for e in es_logs]
        model_dir = run / "es"
    else:
        from posttrain.llm.run import train

        keys = ("step", "reward_mean", "gen_time_s", "step_time_s")
        history = [{k: m[k] for k in keys} for m in train(cfg, run, progress=False)]
        model_dir = _final_model(run)
    train_s = time.perf_counter() - start
    start = time.perf_counter()
    scores = per_prompt_scores(model_dir, cfg, n_prompts=args.eval_prompts, samples=args.samples)
    record = {
        "method": method,
        "steps": len(history),
        "train_s": train_s,
        "eval_s": time.perf_counter() - start,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "history": history,
        **scores,
    }
    print("RESULT " + json.dumps(record), flush=True)


def _pass_at_k(n: int, c: np.ndarray, k: int) -> np.ndarray:
    from posttrain.estimators import pass_at_k

    return np.asarray(pass_at_k(n, c, k), dtype=np.float64)


def _ci(x: np.ndarray) -> tuple[float, float]:
    """Mean and 95% normal half-width over prompts."""
    return float(x.mean()), float(1.96 * x.std(ddof=1) / math.sqrt(len(x))) if len(x) > 1 else 0.0


def _fmt(mean: float, half: float) -> str:
    return f"{mean:.3f} ± {half:.3f}"


def _report(results: dict[str, dict[str, Any]], args: argparse.Namespace, report: Path, elapsed: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = results["base"]
    n = args.samples
    ks = sorted({1, min(4, n), n})
    b_mean1 = np.array(base["correct"]) / n
    rows = []
    for method, r in results.items():
        c = np.array(r["correct"])
        mean1 = c / n
        d_mean, d_half = _ci(mean1 - b_mean1)
        silent = sum(h["reward_mean"] == 0.0 for h in r["history"]) if method != "es" else None
        row = [method, f"{r['steps']}" + (f" ({silent})" if silent is not None and r["steps"] else ""), _fmt(*_ci(mean1)), _fmt(d_mean, d_half) if method != "base" else "",
               _fmt(*_ci(np.array(r["greedy"])))]  # fmt: skip
        row += [f"{_pass_at_k(n, c, k).mean():.3f}" for k in ks[1:]]
        steps = [h for h in r["history"] if "step_time_s" in h]
        per_step = (
            f"{np.median([h['step_time_s'] for h in steps]):.0f} ({np.median([h['gen_time_s'] for h in steps]):.0f})"
            if steps
            else ""
        )
        row += [
            f"{r['cut_at_max']:.2f}",
            per_step,
            f"{r['train_s']:.0f}",
            f"{r['eval_s']:.0f}",
            f"{r['peak_rss_mib']:.0f}",
        ]
        rows.append(row)
    header = ["method", "steps (all rewards 0)", "accuracy (mean@1)", "change vs base (paired)", "greedy accuracy"]
    header += [f"pass@{k}" for k in ks[1:]] + ["cut at max", "s/step (generation)", "train s", "eval s", "peak RSS MiB"]

    png = report.with_name(report.stem + "_curves.png")
    fig, ax = plt.subplots(figsize=(7, 4))
    for method, r in results.items():
        if r["history"]:
            ax.plot(
                [h["step"] for h in r["history"]], [h["reward_mean"] for h in r["history"]], marker="o", label=method
            )
    ax.set_xlabel("step")
    ax.set_ylabel("training reward (mean over the batch)")
    ax.set_title("SmolLM2-135M-Instruct, training reward per step")
    ax.legend(fontsize=8)
    fig.tight_layout()
    report.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)

    cfg_line = (f"steps {args.steps}, G={args.prompts_per_step} prompts x K={args.group_size} samples per step, "
                f"engine {args.engine}, {args.threads} torch thread(s); held-out: {args.eval_prompts} prompts x "
                f"{args.samples} samples + 1 greedy; ES: population {args.es_population}, sigma {args.es_sigma}, "
                f"lr {args.es_lr}, {args.es_prompts} prompts per step; {args.jobs} method(s) trained at once")  # fmt: skip
    load = os.getloadavg()
    lines = [
        "# Validation on a real model: SmolLM2-135M-Instruct on CPU",
        "",
        "Produced by `python -m benchmarks.validate_real_model "
        + " ".join(
            f"--{k.replace('_', '-')} {v}"
            for k, v in sorted(vars(args).items())
            if k
            not in {"child", "report", "out", "methods", "merge", "report_only", "skip_base", "teacher_run", "jobs"}
        )
        + f"` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average at the end {load[0]:.1f}; "
        + (
            f"whole run {elapsed / 60:.1f} min)."
            if not args.report_only
            else f"sum of the methods' train + eval times {sum(r['train_s'] + r['eval_s'] for r in results.values()) / 60:.0f} min)."
        )
        + "",
        "",
        *(
            [
                f"**Not run** (did not fit in the time available): {', '.join(m for m in METHODS if m not in results)}. "
                "Run them with `--methods` (and `--merge` to join the report)."
            ]
            if any(m not in results for m in METHODS)
            else []
        ),
        "",
        f"Config: `examples/smollm2_cpu.yaml` with {cfg_line}.",
        "",
        "Accuracy is the fraction of sampled answers that are correct (mean over held-out prompts, 95% normal "
        "interval over prompts); the change is paired (the same prompts and sampling seed for every model); "
        "pass@k is the unbiased estimator over the samples of each prompt. 'cut at max' is the fraction of sampled "
        "answers that reached `max_new_tokens` without `<|im_end|>`.",
        "",
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---" for _ in header) + " |",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        f"![training reward per step]({png.name})",
        "",
        "## What this does not show",
        "",
        "- These are short runs sized to fit a shared 2-core machine: a few optimizer steps per method, a few "
        "dozen held-out prompts. A change whose interval covers 0 is not evidence either way; nothing here ranks "
        "the methods against each other.",
        "- One seed per method: the spread across training seeds is not measured.",
        "- The weights are SmolLM2-135M-Instruct's Q4_1 GGUF file dequantised to float32, not the original bf16 "
        "checkpoint; absolute accuracies differ from that model's.",
        "- Wall times were measured on a machine shared with other jobs (see the load average above); they "
        "bound the cost from above and are not a benchmark of the methods' speed.",
        "- OPD's teacher is the GRPO checkpoint of this same short run, so OPD can at best recover what GRPO gained.",
        "- A step whose groups all have reward 0 has zero advantages, so a zero policy gradient: the model does not "
        "move (the count is in the steps column). With few prompts per step on a task where most prompts have no "
        "correct sample, short runs mostly consist of such steps.",
        "- Only the task of the example (two-digit + one-digit addition with a short-answer format) is measured.",
        "",
        "## Sample greedy answers after training (first 3 held-out prompts)",
        "",
        *(f"- {m}: " + " | ".join(repr(t) for t in r["examples"][:3]) for m, r in results.items()),
        "",
    ]
    report.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--eval-prompts", type=int, default=48)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--engine", default="hf")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--es-population", type=int, default=8)
    parser.add_argument("--es-sigma", type=float, default=1e-3)
    parser.add_argument("--es-lr", type=float, default=5e-4)
    parser.add_argument("--es-prompts", type=int, default=16, help="ES: prompts per step (fitness of each member).")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--jobs", type=int, default=1, help="Methods trained at once (each in its own process).")
    parser.add_argument("--out", default="runs/validation")
    parser.add_argument("--report", default="docs/validation.md")
    parser.add_argument("--teacher-run", default="", help="OPD's teacher: this GRPO run folder (default: OUT/grpo).")
    parser.add_argument("--skip-base", action="store_true", help="Do not score the base model (another --out has it).")
    parser.add_argument(
        "--merge", default="", help="Comma-separated other --out folders whose results.json join the report."
    )
    parser.add_argument("--report-only", action="store_true", help="Write the report from the results.json files only.")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args)
        return 0
    methods = [m for m in args.methods.split(",") if m]
    if "opd" in methods and "grpo" not in methods and not args.teacher_run:
        parser.error("--methods: opd needs grpo (its teacher is the GRPO checkpoint)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    start = time.perf_counter()
    passthrough = list(argv if argv is not None else sys.argv[1:])
    pending = [] if args.report_only else ([] if args.skip_base else ["base"]) + methods
    running: dict[str, subprocess.Popen[str]] = {}
    finished: set[str] = set()
    while pending or running:
        ready = [m for m in pending if m != "opd" or "grpo" in finished or args.teacher_run]
        while ready and len(running) < args.jobs:
            method = ready.pop(0)
            pending.remove(method)
            print(f"[validate] {method} ...", flush=True)
            cmd = [sys.executable, "-m", "benchmarks.validate_real_model", *passthrough, "--child", method]
            running[method] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(2)
        for method, proc in list(running.items()):
            if proc.poll() is None:
                continue
            del running[method]
            finished.add(method)
            stdout, stderr = proc.communicate()
            line = next((x for x in stdout.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                print(f"[validate] {method} failed (exit {proc.returncode}):\n{stderr[-3000:]}", flush=True)
                continue
            results[method] = r = json.loads(line[len("RESULT ") :])
            print(f"[validate] {method}: steps {r['steps']}, accuracy {np.mean(r['correct']) / args.samples:.3f}, "
                  f"train {r['train_s']:.0f} s, eval {r['eval_s']:.0f} s", flush=True)  # fmt: skip
            (out / "results.json").write_text(json.dumps(results, indent=1))
        if "opd" in pending and "grpo" in finished and "grpo" not in results:
            pending.remove("opd")  # its teacher failed
    for folder in [str(out), *(f for f in args.merge.split(",") if f)]:
        saved = Path(folder) / "results.json"
        if saved.is_file():
            for method, record in json.loads(saved.read_text()).items():
                results.setdefault(method, record)
    results = {m: results[m] for m in ["base", *METHODS] if m in results}
    if "base" in results:
        _report(results, args, Path(args.report), time.perf_counter() - start)
        print(f"[validate] report in {args.report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
