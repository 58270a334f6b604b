"""``posttrain train`` and ``posttrain eval``: typer command functions registered in :mod:`posttrain.cli`.

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

__all__ = ["es_command", "eval_command", "resolve_checkpoint", "train_command"]

console = Console()


def _load_or_exit(config: Path, overrides: list[str]) -> Any:
    """The validated run config, or a red ``config error`` and exit code 2."""
    from posttrain.errors import PosttrainError
    from posttrain.llm.config import load_config

    try:
        return load_config(config, overrides)
    except PosttrainError as exc:
        console.print(f"[red]config error:[/red] {exc}")
        raise typer.Exit(2) from None


def train_command(
    config: Path = typer.Argument(..., exists=True, dir_okay=False, help="Run config (YAML)."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value: section.key=value (repeatable)."),
    out: Path = typer.Option(None, "--out", help="Run directory (default: runs/<config name>)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the latest complete checkpoint in --out."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Train a causal LM with an RL method from a YAML config; writes metrics.jsonl and checkpoints."""
    cfg = _load_or_exit(config, overrides)
    from posttrain.llm.run import train

    _quiet_transformers()
    run_dir = out or Path("runs") / config.stem
    history = train(cfg, run_dir, resume=resume, progress=False if quiet else None)
    if history:
        first, last = history[0], history[-1]
        console.print(
            f"steps {first['step']}..{last['step']}: reward_mean {first['reward_mean']:.3f} -> {last['reward_mean']:.3f}; "
            f"run directory {run_dir}"
        )


def es_command(
    config: Path = typer.Argument(..., exists=True, dir_okay=False, help="Run config (YAML) with an `es:` section."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value: section.key=value (repeatable)."),
    out: Path = typer.Option(None, "--out", help="Run directory (default: runs/<config name>)."),
) -> None:
    """Evolution-strategies fine-tuning in place (optionally after the config's RL steps: es.after_rl=true).

    Writes es_metrics.jsonl (one row per ES step) and the final model to OUT/es.
    """
    cfg = _load_or_exit(config, overrides)
    from posttrain.llm.run import es_from_config

    _quiet_transformers()
    run_dir = out or Path("runs") / config.stem
    rl_logs, es_logs = es_from_config(cfg, run_dir)
    if rl_logs:
        console.print(f"RL: {len(rl_logs)} steps, reward_mean {rl_logs[-1]['reward_mean']:.3f}")
    if es_logs:
        console.print(
            f"ES: {len(es_logs)} steps, population reward_mean {es_logs[0].reward_mean:.3f} -> "
            f"{es_logs[-1].reward_mean:.3f}; model in {run_dir / 'es'}"
        )


def _quiet_transformers() -> None:
    """No per-load progress bars from transformers (they interleave with ours and with --json)."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def resolve_checkpoint(path: Path) -> tuple[Path, Path | None]:
    """``(model_dir, run_dir)`` for a run directory, a checkpoint directory, or a model directory."""
    from posttrain.llm.train.checkpoint import latest_checkpoint

    if (path / "checkpoints").is_dir():
        ckpt = latest_checkpoint(path / "checkpoints")
        if ckpt is None:
            raise typer.BadParameter(f"{path} has no complete checkpoint")
        return ckpt / "model", path
    if (path / "model" / "config.json").is_file():
        return path / "model", path.parent.parent
    if (path / "config.json").is_file():
        return path, None
    raise typer.BadParameter(f"{path} is not a run directory, a checkpoint or a model directory")


def eval_command(
    checkpoint: Path = typer.Argument(..., exists=True, file_okay=False, help="Run dir, checkpoint dir or model dir."),
    k: str = typer.Option("1", "--k", help="Comma-separated k values for pass@k, e.g. 1,4,16."),
    n: int = typer.Option(None, "--n", help="Samples per prompt (default: the largest k)."),
    prompts: int = typer.Option(None, "--prompts", help="Held-out prompts (default: data.eval_prompts)."),
    config: Path = typer.Option(None, "--config", help="Config for the task (default: the run's config.yaml)."),
    json_out: bool = typer.Option(False, "--json", help="Print the metrics as JSON."),
) -> None:
    """Evaluate a checkpoint: unbiased pass@k / mean@k, greedy accuracy, response length, entropy."""
    from posttrain.llm.config import load_config
    from posttrain.llm.rollout.tasks import make_task
    from posttrain.llm.run import load_model
    from posttrain.llm.train.evaluate import evaluate

    try:
        ks = sorted({int(x) for x in k.split(",") if x.strip()})
    except ValueError:
        raise typer.BadParameter(f"--k: expected comma-separated integers, got {k!r}") from None
    _quiet_transformers()
    model_dir, run_dir = resolve_checkpoint(checkpoint)
    cfg_path = config or (run_dir / "config.yaml" if run_dir is not None else None)
    cfg = load_config(cfg_path if cfg_path is not None and cfg_path.is_file() else None)
    model, tokenizer = load_model(model_dir, cfg)
    metrics: dict[str, Any] = evaluate(
        model,
        tokenizer,
        make_task(cfg.data.task, **cfg.data.options),
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
