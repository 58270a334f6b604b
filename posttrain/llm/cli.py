"""``posttrain train`` and ``posttrain eval``: typer command functions registered in `posttrain.cli`.

Module-level imports stay light (typer, rich); torch/transformers load inside the commands so
``posttrain --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

__all__ = [
    "dpo_command",
    "es_command",
    "eval_command",
    "pairs_command",
    "resolve_checkpoint",
    "train_command",
    "tune_malloc",
]

console = Console()

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 * 2**20
"""glibc's largest mmap threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``): smaller blocks come from the heap."""
TRIM_THRESHOLD = 2**30


def tune_malloc() -> bool:
    """Keep large tensors on glibc's heap: mmap threshold 32 MiB, trim threshold 1 GiB (``mallopt``).

    glibc serves blocks above its mmap threshold (128 KiB, raised dynamically up to 32 MiB) with a
    fresh ``mmap`` and unmaps them on free, so every large CPU temporary (logits, per-token losses)
    pays a page fault per 4 KiB page on first touch. The same as ``MALLOC_MMAP_THRESHOLD_=33554432
    MALLOC_TRIM_THRESHOLD_=1073741824``; left alone when either variable is set (the user's choice)
    and where ``mallopt`` is missing (not glibc). Returns whether both settings took effect.
    """
    import ctypes
    import os

    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    ok_mmap = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    return ok_mmap and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1


def _load_or_exit(config: Path, overrides: list[str]) -> Any:
    """The checked run (`posttrain.llm.config.RunPlan`: the config and the method built once); a bad config
    raises ``DomainError`` before anything is built or written, which the ``posttrain`` command turns into one
    red line and exit code 2 (``posttrain --debug`` shows the traceback)."""
    from posttrain.llm.config import load_run

    return load_run(config, overrides)


def train_command(
    config: Path = typer.Argument(..., exists=True, dir_okay=False, help="Run config (YAML)."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value: section.key=value (repeatable)."),
    out: Path = typer.Option(None, "--out", help="Run directory (default: runs/<config name>)."),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue the run in --out from its newest intact checkpoint (same config but "
        "optim.steps, checkpoint.*, logging.progress/tensorboard/wandb_project).",
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the run in --out (its files are removed)."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Train a causal LM with an RL method from a YAML config; writes metrics.jsonl and checkpoints.

    --out must be a new directory unless --resume or --overwrite is given.
    """
    tune_malloc()
    plan = _load_or_exit(config, overrides)
    from posttrain.llm.run import train

    _quiet_transformers()
    run_dir = out or Path("runs") / config.stem
    history = train(plan, run_dir, resume=resume, overwrite=overwrite, progress=False if quiet else None)
    if history:
        first, last = history[0], history[-1]
        console.print(
            f"steps {first['step']}..{last['step']}: reward_mean {_fmt(first['reward_mean'])} -> "
            f"{_fmt(last['reward_mean'])}; run directory {run_dir}"
        )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def es_command(
    config: Path = typer.Argument(..., exists=True, dir_okay=False, help="Run config (YAML) with an `es:` section."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value: section.key=value (repeatable)."),
    out: Path = typer.Option(None, "--out", help="Run directory (default: runs/<config name>)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the run in --out (its files are removed)."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Evolution-strategies fine-tuning in place (optionally after the config's RL steps: es.after_rl=true).

    Writes es_metrics.jsonl (one row per ES step) and the final model to OUT/es; a progress bar shows the
    population's mean reward. examples/es_tiny_cpu.yaml is sized for a CPU (the paper's population 32 x
    500 steps, the defaults, take hours there).
    """
    plan = _load_or_exit(config, overrides)
    cfg = plan.config
    _quiet_transformers()
    run_dir = out or Path("runs") / config.stem
    console.print(
        f"ES: {cfg.es.steps} steps x population {cfg.es.population} x "
        f"{cfg.es.prompts_per_step or cfg.data.prompts_per_step} prompts (greedy generations), model from {run_dir}"
    )
    rl_logs, es_logs = _es_with_progress(plan, run_dir, overwrite=overwrite, show=not quiet)
    if rl_logs:
        console.print(f"RL: {len(rl_logs)} steps, reward_mean {rl_logs[-1]['reward_mean']:.3f}")
    if es_logs:
        console.print(
            f"ES: {len(es_logs)} steps, population reward_mean {es_logs[0].reward_mean:.3f} -> "
            f"{es_logs[-1].reward_mean:.3f}; model in {run_dir / 'es'}"
        )


def _es_with_progress(plan: Any, run_dir: Path, *, overwrite: bool, show: bool) -> Any:
    """`es_from_config` with its progress (`posttrain.llm.train.progress`: a bar on a terminal, plain lines in a
    log) over the ES steps, then the run's curves (curves.png)."""
    from posttrain.llm.run import es_from_config
    from posttrain.llm.train.curves import draw_curves
    from posttrain.llm.train.progress import RunProgress

    cfg = plan.config
    with RunProgress(console=console, show=show) as progress:
        progress.declare("es", cfg.es.steps)

        def on_step(log: Any) -> None:
            noop = "  (no-op: all equal)" if log.noop else ""
            progress.step("es", log.step + 1, f"reward {log.reward_mean:.3f} +- {log.reward_std:.3f}{noop}")

        result = es_from_config(plan, run_dir, on_step=on_step, overwrite=overwrite)
    draw_curves(run_dir)
    if show:
        console.print(f"es {len(result[1])}/{cfg.es.steps} steps done")
    return result


def _quiet_transformers() -> None:
    """No per-load progress bars from transformers (they interleave with ours and with --json)."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def resolve_checkpoint(path: Path) -> tuple[Path, Path | None]:
    """``(model_dir, run_dir)`` for a run directory, a checkpoint or a model directory, verified
    (`posttrain.llm.train.eval_target.eval_target`)."""
    from posttrain.llm.train.eval_target import eval_target

    target = eval_target(path)
    return target.model_dir, target.run_dir


def format_metrics(metrics: dict[str, Any], *, title: str, samples: int | None = None, width: int | None = None) -> str:
    """The eval table as text (``width`` columns, default the terminal's): metric names never wrapped, an
    undefined value (NaN: nothing judged to average) as "-", then a note on unjudged samples."""
    import io
    import math

    from rich.text import Text

    out = Console(file=io.StringIO(), width=width or console.width, highlight=False, soft_wrap=False)
    out.print(Text(title, overflow="fold"))
    table = Table(show_header=True)
    table.add_column("metric", style="bold", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    for key, value in metrics.items():
        shown = "-" if isinstance(value, float) and math.isnan(value) else (
            str(value) if isinstance(value, int) else f"{value:.4f}"
        )  # fmt: skip
        table.add_row(key, shown)
    out.print(table)
    unjudged, total = int(metrics.get("unjudged", 0)), samples if samples is not None else "?"
    if unjudged and metrics.get("judged_prompts", 0) == 0:
        out.print(
            Text(f"no sampled completion was judged ({unjudged} of {total}): the reward could not be computed (a "
                 "reward function returned None, or a verifier ran out of time), so reward_mean, pass@k and mean@k "
                 "are undefined (-)", overflow="fold")
        )  # fmt: skip
    elif unjudged:
        out.print(
            Text(f"{unjudged} of {total} sampled completions were not judged (left out, never scored 0); pass@k and "
                 f"mean@k average the {metrics.get('judged_prompts')} prompts whose samples were all judged",
                 overflow="fold")
        )  # fmt: skip
    flat = metrics.get("zero_variance_prompts")
    if isinstance(flat, float) and flat == flat and flat >= 0.5:
        out.print(
            Text(f"{flat:.0%} of the judged prompts gave every sample the same reward: a group-baseline method (GRPO, "
                 "RLOO, ...) gets a zero advantage, hence no gradient, from each of them", overflow="fold")
        )  # fmt: skip
    return out.file.getvalue()  # type: ignore[attr-defined, no-any-return]


def eval_command(
    checkpoint: Path = typer.Argument(..., exists=True, file_okay=False, help="Run dir, checkpoint dir or model dir."),
    k: str = typer.Option("1", "--k", help="Comma-separated k values for pass@k, e.g. 1,4,16."),
    n: int = typer.Option(None, "--n", help="Samples per prompt (default: the largest k)."),
    prompts: int = typer.Option(None, "--prompts", help="Held-out prompts (default: data.eval_prompts)."),
    config: Path = typer.Option(None, "--config", help="Config for the task (default: the run's config.yaml)."),
    json_out: bool = typer.Option(False, "--json", metavar="", help="Print the metrics as JSON."),
) -> None:
    """Evaluate a run, a checkpoint or a model: unbiased pass@k / mean@k, greedy accuracy, response length, entropy.

    A run directory is evaluated from its ES endpoint, else its newest intact checkpoint, else initial/ (an
    interrupted run); whatever a run wrote is verified against its checksums first. The metrics are appended
    to the run's eval.jsonl.
    """
    from posttrain.errors import DomainError
    from posttrain.llm.config import load_config
    from posttrain.llm.rollout.reward_fn import with_reward_function
    from posttrain.llm.rollout.tasks import make_task
    from posttrain.llm.run import load_model
    from posttrain.llm.train.eval_target import eval_target
    from posttrain.llm.train.evaluate import evaluate
    from posttrain.llm.train.rundir import RunDirError, append_jsonl

    try:
        ks = sorted({int(x) for x in k.split(",") if x.strip()})
    except ValueError:
        raise DomainError(f"--k: expected comma-separated integers, got {k!r}") from None
    _quiet_transformers()
    target = eval_target(checkpoint)
    model_dir, run_dir = target.model_dir, target.run_dir
    if run_dir is not None and (run_dir / "eval.jsonl").is_symlink():  # refused before the work, not after
        raise RunDirError(f"{run_dir / 'eval.jsonl'} is a symbolic link; a run writes only inside its directory")
    if target.note:
        Console(stderr=True).print(f"evaluating {model_dir} ({target.note})", highlight=False, soft_wrap=True)
    cfg_path = config or (run_dir / "config.yaml" if run_dir is not None else None)
    if cfg_path is None:  # the task would silently be the default one
        raise DomainError(f"--config: {checkpoint} is not inside a run directory (no config.yaml); pass --config")
    cfg = load_config(cfg_path)
    model, tokenizer = load_model(model_dir, cfg)
    n_prompts, n_samples = prompts or cfg.data.eval_prompts, n or max(ks)
    metrics: dict[str, Any] = evaluate(
        model,
        tokenizer,
        with_reward_function(make_task(cfg.data.task, **cfg.data.options), cfg.data.reward),
        n_prompts=n_prompts,
        n_samples=n_samples,
        ks=ks,
        seed=cfg.seed,
        sampling=cfg.rollout.sampling(),
        **cfg.model.prompt_format().options(),
    )
    undefined = [k for k, v in metrics.items() if isinstance(v, float) and v != v]  # NaN: JSON null
    record = {"checkpoint": str(model_dir), **metrics, **dict.fromkeys(undefined)}
    if run_dir is not None:
        append_jsonl(run_dir / "eval.jsonl", record)
    if json_out:
        print(json.dumps(record))
        return
    console.print(format_metrics(metrics, title=f"eval {model_dir}", samples=n_prompts * n_samples), end="")


def pairs_command(
    config: Path = typer.Argument(..., exists=True, dir_okay=False, help="Run config (YAML) with a `pairs:` section."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value: section.key=value (repeatable)."),
    out: Path = typer.Option(None, "--out", help="Output directory (default: runs/<config name>)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the design in --out (its files are removed)."),
) -> None:
    """Design which DPO pairs to label (Han, Goyal, Ma 2026, arXiv:2606.19607): sample a pool from the SFT'd policy,
    solve the Frank-Wolfe design on its hidden-state features, label the drawn pairs by the task's reward.

    Writes OUT/pairs.jsonl (prompt, chosen, rejected, design weight q), OUT/pool_pairs.jsonl (every labelled pair of
    the pool), OUT/design.json (objective, Frank-Wolfe gap, prompts covered, pool sizes, ties) and OUT/initial (the
    reference model); `posttrain dpo` trains on the pairs file.
    """
    plan = _load_or_exit(config, overrides)
    from posttrain.llm.run_pairs import design_from_config

    _quiet_transformers()
    run_dir = out or Path("runs") / config.stem
    log = design_from_config(plan, run_dir, overwrite=overwrite)
    lab = log["labels"]
    console.print(
        f"{log['design']} design over {log['pool']['edges']} candidate pairs: objective {log['objective']:.4g} "
        f"(uniform {log['uniform_objective']:.4g}), {log['prompts_covered']:.1f} prompts covered; drew {lab['drawn']}, "
        f"{lab['ties']} ties, wrote {lab['written']} pairs to {run_dir / 'pairs.jsonl'}"
    )


def dpo_command(
    config: Path = typer.Argument(..., exists=True, dir_okay=False, help="Run config (YAML) with a `dpo:` section."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value: section.key=value (repeatable)."),
    out: Path = typer.Option(None, "--out", help="Run directory (default: runs/<config name>)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the run in --out (its files are removed)."),
) -> None:
    """Train with DPO on the labelled pairs of dpo.pairs (JSONL: prompt, chosen, rejected) against a frozen reference.

    The policy is model.path (null: the initial/ model beside the pairs file, as `posttrain pairs` writes it), the
    reference model.reference (null: the same model). Writes metrics.jsonl (loss, implicit-reward accuracy, margin)
    and checkpoints.
    """
    plan = _load_or_exit(config, overrides)
    from posttrain.llm.run_pairs import dpo_from_config

    _quiet_transformers()
    run_dir = out or Path("runs") / config.stem
    history = dpo_from_config(plan, run_dir, overwrite=overwrite)
    if history:
        first, last = history[0], history[-1]
        console.print(
            f"steps 1..{last['step']}: loss {first['loss']:.4f} -> {last['loss']:.4f}, reward_accuracy "
            f"{_fmt(first['reward_accuracy'])} -> {_fmt(last['reward_accuracy'])}; run directory {run_dir}"
        )
