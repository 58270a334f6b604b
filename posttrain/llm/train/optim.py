"""The trainer's optimizers by name and its learning-rate schedule, built from values (``optim``).

``optim.name`` is a ``torch.optim`` optimizer class or one of `MODEL_OPTIMIZERS` (built from the model:
they need parameter names). `check_optimizer` checks ``optim.options`` when the config loads: names and
types against the class's keyword parameters (`posttrain.llm.typed.check_options`), and a torch optimizer
is built once on a one-element parameter so its own range checks (``betas`` in [0, 1), ``eps >= 0``, ...)
fail there, without the device-dependent options.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from posttrain.errors import DomainError
from posttrain.llm.train.muon import MuonWithAdamW
from posttrain.llm.typed import check_options

__all__ = [
    "MODEL_OPTIMIZERS",
    "SCHEDULERS",
    "check_optimizer",
    "make_optimizer",
    "make_scheduler",
    "module_parameters",
    "optimization",
    "optimizer_class",
    "optimizer_names",
]

MODEL_OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {"MuonWithAdamW": MuonWithAdamW}
"""Optimizers built from the model (they need parameter names): ``optim.name`` -> class."""

SCHEDULERS: dict[str, Callable[[float], float]] = {
    "constant": lambda f: 1.0,
    "linear": lambda f: 1.0 - f,
    "cosine": lambda f: 0.5 * (1.0 + math.cos(math.pi * f)),
}
"""``optim.scheduler``: the learning-rate factor after warm-up as a function of the fraction of decay done."""

_DEVICE_OPTIONS = ("fused", "capturable", "foreach", "differentiable")
"""Options whose validity depends on the parameters' device: left out of the load-time trial build."""


def optimizer_names() -> list[str]:
    """Every ``optim.name``: the ``torch.optim`` optimizer classes and `MODEL_OPTIMIZERS`."""
    torch_names = [
        n
        for n, c in vars(torch.optim).items()
        if isinstance(c, type) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer
    ]
    return sorted({*torch_names, *MODEL_OPTIMIZERS})


def optimizer_class(name: str) -> Callable[..., torch.optim.Optimizer]:
    """The class of ``optim.name``."""
    if name in MODEL_OPTIMIZERS:
        return MODEL_OPTIMIZERS[name]
    if name not in optimizer_names():
        raise DomainError(f"optim.name: unknown name {name!r}; valid: {', '.join(optimizer_names())}")
    return getattr(torch.optim, name)  # type: ignore[no-any-return]


def check_optimizer(name: str, lr: float, options: Mapping[str, Any], where: str = "optim.options") -> None:
    """Refuse options the optimizer ``name`` would reject (see the module docstring), naming ``where``."""
    cls = optimizer_class(name)
    parsed = check_options(where, cls, options, skip=("params", "lr", "model"))
    if name in MODEL_OPTIMIZERS:  # typed and limited in its own signature
        return
    trial = {k: v for k, v in parsed.items() if k not in _DEVICE_OPTIONS}
    try:
        cls([torch.zeros(1, requires_grad=True)], lr=lr, **trial)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise DomainError(f"{where}: {str(exc).splitlines()[0]}") from None


def make_optimizer(
    name: str,
    model: torch.nn.Module,
    *,
    lr: float,
    options: Mapping[str, Any],
    modules: tuple[torch.nn.Module, ...] = (),
) -> torch.optim.Optimizer:
    """``torch.optim.<name>(trainable params, lr=lr, **options)`` (AdamW by default), or an optimizer of
    `MODEL_OPTIMIZERS` built from the model, e.g. ``MuonWithAdamW`` (Muon on hidden matrices, AdamW on the
    rest; ``options: {adamw_lr: ...}``). The trainable parameters of ``modules`` (an algorithm's own, e.g. a
    learned log-partition) form a second parameter group."""
    cls = optimizer_class(name)
    if name in MODEL_OPTIMIZERS:
        optimizer = cls(model, lr=lr, **options)
    else:
        optimizer = cls([p for p in model.parameters() if p.requires_grad], lr=lr, **options)
    extra = module_parameters(modules)
    if extra:
        optimizer.add_param_group({"params": extra})
    return optimizer


def module_parameters(modules: tuple[torch.nn.Module, ...]) -> list[torch.nn.Parameter]:
    """The trainable parameters of an algorithm's own modules (e.g. a learned log-partition)."""
    return [p for m in modules for p in m.parameters() if p.requires_grad]


def make_scheduler(
    optimizer: torch.optim.Optimizer, *, kind: str, total: int, warmup_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup_steps`` optimizer steps, then the `SCHEDULERS` shape ``kind`` to the end of
    ``total`` optimizer steps."""
    shape = SCHEDULERS[kind]

    def factor(i: int) -> float:
        if i < warmup_steps:
            return (i + 1) / warmup_steps
        return shape(min((i - warmup_steps) / max(total - warmup_steps, 1), 1.0))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def optimization(
    optim: Any, model: torch.nn.Module, *, modules: tuple[torch.nn.Module, ...] = ()
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The optimizer and schedule of the config's ``optim`` section (`posttrain.llm.config.schema.OptimConfig`):
    ``steps * updates_per_batch`` optimizer steps in all."""
    optimizer = make_optimizer(optim.name, model, lr=optim.lr, options=optim.options, modules=modules)
    total = optim.steps * optim.updates_per_batch
    return optimizer, make_scheduler(optimizer, kind=optim.scheduler, total=total, warmup_steps=optim.warmup_steps)
