"""The trainer's optimizer and learning-rate schedule, built from the config (``optim``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from posttrain.llm.train.muon import MuonWithAdamW

if TYPE_CHECKING:  # annotations only: config checks optimizer options against these classes, so no import back
    from posttrain.llm.config import RunConfig

__all__ = ["MODEL_OPTIMIZERS", "make_optimizer", "make_scheduler", "module_parameters"]

MODEL_OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {"MuonWithAdamW": MuonWithAdamW}
"""Optimizers built from the model (they need parameter names): ``optim.name`` -> class."""


def make_optimizer(
    cfg: RunConfig, model: torch.nn.Module, *, modules: tuple[torch.nn.Module, ...] = ()
) -> torch.optim.Optimizer:
    """``torch.optim.<optim.name>(trainable params, lr=optim.lr, **optim.options)`` (AdamW by default), or
    an optimizer of `MODEL_OPTIMIZERS` built from the model, e.g. ``MuonWithAdamW`` (Muon on hidden
    matrices, AdamW on the rest; ``options: {adamw_lr: ...}``). The trainable parameters of ``modules``
    (an algorithm's own, e.g. a learned log-partition) form a second parameter group."""
    if cfg.optim.name in MODEL_OPTIMIZERS:
        optimizer: torch.optim.Optimizer = MODEL_OPTIMIZERS[cfg.optim.name](model, lr=cfg.optim.lr, **cfg.optim.options)
    else:
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = getattr(torch.optim, cfg.optim.name)(params, lr=cfg.optim.lr, **cfg.optim.options)
    extra = module_parameters(modules)
    if extra:
        optimizer.add_param_group({"params": extra})
    return optimizer


def module_parameters(modules: tuple[torch.nn.Module, ...]) -> list[torch.nn.Parameter]:
    """The trainable parameters of an algorithm's own modules (e.g. a learned log-partition)."""
    return [p for m in modules for p in m.parameters() if p.requires_grad]


def make_scheduler(cfg: RunConfig, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup_steps`` optimizer steps, then constant, linear or cosine decay to 0."""
    total = cfg.optim.steps * cfg.optim.updates_per_batch
    warm, kind = cfg.optim.warmup_steps, cfg.optim.scheduler
    shapes: dict[str, Callable[[float], float]] = {
        "constant": lambda f: 1.0,
        "linear": lambda f: 1.0 - f,
        "cosine": lambda f: 0.5 * (1.0 + math.cos(math.pi * f)),
    }
    shape = shapes[kind]

    def factor(i: int) -> float:
        if i < warm:
            return (i + 1) / warm
        return shape(min((i - warm) / max(total - warm, 1), 1.0))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
