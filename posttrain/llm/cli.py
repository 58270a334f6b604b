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
    """The validated run config; a bad one raises ``DomainError``, which the ``posttrain`` command turns into one
    red line and exit code 2 (``posttrain --debug`` shows the traceback)."""
    from posttrain.llm.config import load_config

    return load_config(config, overrides)


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
    cfg = _load_or_exit(config, overrides)
    from posttrain.llm.run import train

    _quiet_transformers()
    run_dir = out or Path("runs") / config.stem
    history = train(cfg, run_dir, resume=resume, overwrite=overwrite, progress=False if quiet else None)
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
    cfg = _load_or_exit(config, overrides)

    _quiet_transformers()
    run_dir = out or Path("runs") / config.stem
    console.print(
        f"ES: {cfg.es.steps} steps x population {cfg.es.population} x "
        f"{cfg.es.prompts_per_step or cfg.data.prompts_per_step} prompts (greedy generations), model from {run_dir}"
    )
    rl_logs, es_logs = _es_with_progress(cfg, run_dir, overwrite=overwrite, show=not quiet)
    if rl_logs:
        console.print(f"RL: {len(rl_logs)} steps, reward_mean {rl_logs[-1]['reward_mean']:.3f}")
    if es_logs:
        console.print(
            f"ES: {len(es_logs)} steps, population reward_mean {es_logs[0].reward_mean:.3f} -> "
            f"{es_logs[-1].reward_mean:.3f}; model in {run_dir / 'es'}"
        )


def _es_with_progress(cfg: Any, run_dir: Path, *, overwrite: bool, show: bool) -> Any:
    """`es_from_config` with a rich progress bar over the ES steps."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from posttrain.llm.run import es_from_config

    if not show:
        return es_from_config(cfg, run_dir, overwrite=overwrite)
    with Progress(
        TextColumn("[bold]es"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
        console=console,
    ) as bar:  # fmt: skip
        job = bar.add_task("es", total=cfg.es.steps, info="building the model (and the SFT warm-up, if any)")

        def on_step(log: Any) -> None:
            info = f"reward {log.reward_mean:.3f} +- {log.reward_std:.3f}" + (
                "  (no-op: all equal)" if log.noop else ""
            )
            bar.update(job, completed=log.step + 1, info=info)

        result = es_from_config(cfg, run_dir, on_step=on_step, overwrite=overwrite)
    console.print(f"es {len(result[1])}/{cfg.es.steps} steps done")
    return result


def _quiet_transformers() -> None:
    """No per-load progress bars from transformers (they interleave with ours and with --json)."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def _run_of(model_dir: Path) -> Path | None:
    """The run directory above a model directory (``RUN/initial``, ``RUN/checkpoints/step_N/model``, ``RUN/es``):
    the nearest of its parents, up to three levels, with a ``config.yaml``."""
    for parent in list(model_dir.absolute().parents)[:3]:
        if (parent / "config.yaml").is_file():
            return parent
    return None


def resolve_checkpoint(path: Path) -> tuple[Path, Path | None]:
    """``(model_dir, run_dir)`` for a run directory (its newest intact checkpoint), a checkpoint directory, or a
    model directory (``run_dir``: the run around it, or None)."""
    from posttrain.errors import DomainError
    from posttrain.llm.train.checkpoint import intact_checkpoint

    if (path / "checkpoints").is_dir():
        ckpt = intact_checkpoint(path / "checkpoints")
        if ckpt is None:
            raise DomainError(f"CHECKPOINT: {path} has no complete, intact checkpoint")
        return ckpt / "model", path
    if any((path / "model" / name).is_file() for name in ("config.json", "adapter_config.json")):  # LoRA: adapter
        return path / "model", _run_of(path / "model")
    if (path / "config.json").is_file():
        return path, _run_of(path)
    raise DomainError(f"CHECKPOINT: {path} is not a run directory, a checkpoint or a model directory")


def eval_command(
    checkpoint: Path = typer.Argument(..., exists=True, file_okay=False, help="Run dir, checkpoint dir or model dir."),
    k: str = typer.Option("1", "--k", help="Comma-separated k values for pass@k, e.g. 1,4,16."),
    n: int = typer.Option(None, "--n", help="Samples per prompt (default: the largest k)."),
    prompts: int = typer.Option(None, "--prompts", help="Held-out prompts (default: data.eval_prompts)."),
    config: Path = typer.Option(None, "--config", help="Config for the task (default: the run's config.yaml)."),
    json_out: bool = typer.Option(False, "--json", help="Print the metrics as JSON."),
) -> None:
    """Evaluate a checkpoint: unbiased pass@k / mean@k, greedy accuracy, response length, entropy."""
    from posttrain.errors import DomainError
    from posttrain.llm.config import load_config
    from posttrain.llm.rollout.reward_fn import with_reward_function
    from posttrain.llm.rollout.tasks import make_task
    from posttrain.llm.run import load_model
    from posttrain.llm.train.evaluate import evaluate

    try:
        ks = sorted({int(x) for x in k.split(",") if x.strip()})
    except ValueError:
        raise DomainError(f"--k: expected comma-separated integers, got {k!r}") from None
    _quiet_transformers()
    model_dir, run_dir = resolve_checkpoint(checkpoint)
    cfg_path = config or (run_dir / "config.yaml" if run_dir is not None else None)
    if cfg_path is None:  # the task would silently be the default one
        raise DomainError(f"--config: {checkpoint} is not inside a run directory (no config.yaml); pass --config")
    cfg = load_config(cfg_path)
    model, tokenizer = load_model(model_dir, cfg)
    metrics: dict[str, Any] = evaluate(
        model,
        tokenizer,
        with_reward_function(make_task(cfg.data.task, **cfg.data.options), cfg.data.reward),
        n_prompts=prompts or cfg.data.eval_prompts,
        n_samples=n or max(ks),
        ks=ks,
        seed=cfg.seed,
        sampling=cfg.rollout.sampling(),
        chat_template=cfg.model.chat_template,
        system=cfg.model.system_prompt,
    )
    record = {"checkpoint": str(model_dir), **metrics}
    if run_dir is not None:
        with open(run_dir / "eval.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
    if json_out:
        print(json.dumps(record))
        return
    table = Table(title=f"eval {model_dir}")
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    for key, value in metrics.items():
        table.add_row(key, f"{value:.4f}")
    console.print(table)


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
    cfg = _load_or_exit(config, overrides)
    from posttrain.llm.run_pairs import design_from_config

    _quiet_transformers()
    run_dir = out or Path("runs") / config.stem
    log = design_from_config(cfg, run_dir, overwrite=overwrite)
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
    cfg = _load_or_exit(config, overrides)
    from posttrain.llm.run_pairs import dpo_from_config

    _quiet_transformers()
    run_dir = out or Path("runs") / config.stem
    history = dpo_from_config(cfg, run_dir, overwrite=overwrite)
    if history:
        first, last = history[0], history[-1]
        console.print(
            f"steps 1..{last['step']}: loss {first['loss']:.4f} -> {last['loss']:.4f}, reward_accuracy "
            f"{_fmt(first['reward_accuracy'])} -> {_fmt(last['reward_accuracy'])}; run directory {run_dir}"
        )
