"""Metric sinks beside ``metrics.jsonl``: training curves, TensorBoard and Weights & Biases.

The curves (``curves.png``, `posttrain.llm.train.curves`) are always drawn on rank 0: at every checkpoint
(``checkpoint.every`` steps) and when the run ends (also when it stops on an error or an interrupt).

``logging.tensorboard: true`` writes every numeric metric of a step (``step`` is the x axis) as a
scalar under ``<run>/tensorboard/`` (``tensorboard`` from the ``[dev]`` extra); ``logging.wandb_project``
logs each step's row to a W&B run under ``<run>/wandb/`` (``wandb`` from the ``[wandb]`` extra;
``WANDB_MODE=offline`` keeps it local). Only rank 0 writes. A sink whose package is missing is
skipped with a message; ``metrics.jsonl`` is always written by the trainer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from posttrain.llm.config import RunConfig, config_to_dict

__all__ = ["metric_sinks"]

Sink = Callable[[dict[str, Any]], None]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _tensorboard(out: Path, stack: contextlib.ExitStack) -> Sink | None:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        print("logging.tensorboard: tensorboard is not installed; writing metrics.jsonl only")
        return None
    writer = SummaryWriter(str(out / "tensorboard"))
    stack.callback(writer.close)

    def to_tensorboard(m: dict[str, Any]) -> None:
        for key, value in m.items():
            if key != "step" and _is_number(value):
                writer.add_scalar(key, float(value), m["step"])

    return to_tensorboard


def _curves(cfg: RunConfig, out: Path, stack: contextlib.ExitStack) -> Sink:
    from posttrain.llm.train import curves

    every = cfg.checkpoint.every
    stack.callback(lambda: curves.draw_curves(out))  # at the end, whatever the ending

    def to_curves(m: dict[str, Any]) -> None:
        if every and m["step"] % every == 0:
            curves.draw_curves(out)

    return to_curves


def _wandb(cfg: RunConfig, out: Path, stack: contextlib.ExitStack) -> Sink | None:
    try:
        import wandb
    except ImportError:
        print("logging.wandb_project: wandb is not installed; writing metrics.jsonl only")
        return None
    run = wandb.init(project=cfg.logging.wandb_project, config=config_to_dict(cfg), dir=str(out))
    stack.callback(run.finish)
    return lambda m: run.log(m, step=m["step"])


@contextlib.contextmanager
def metric_sinks(cfg: RunConfig, out: Path, *, rank: int = 0) -> Iterator[Sink]:
    """A callable that sends a step's metrics to every sink ``cfg.logging`` asks for; the sinks are flushed
    and closed when the context exits."""
    with contextlib.ExitStack() as stack:
        sinks: list[Sink | None] = []
        if rank == 0:
            sinks.append(_curves(cfg, out, stack))
        if rank == 0 and cfg.logging.tensorboard:
            sinks.append(_tensorboard(out, stack))
        if rank == 0 and cfg.logging.wandb_project:
            sinks.append(_wandb(cfg, out, stack))
        active = [s for s in sinks if s is not None]

        def to_sinks(m: dict[str, Any]) -> None:
            for sink in active:
                sink(m)

        yield to_sinks
