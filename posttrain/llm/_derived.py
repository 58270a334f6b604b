"""Building a trainer subclass (replay, branching, SIS) on the parts of an assembled :class:`Trainer`."""

from __future__ import annotations

from typing import Any, TypeVar

from posttrain.llm.trainer import Trainer

__all__ = ["rebuild_as"]

T = TypeVar("T", bound=Trainer)


def rebuild_as(cls: type[T], trainer: Trainer, **options: Any) -> T:
    """``cls`` on ``trainer``'s config, model, tokenizer, task, engine, algorithm, run directory and fillers.

    The optimizer and scheduler are new (built by ``Trainer.__init__``); ``options`` are ``cls``'s own.
    """
    return cls(
        trainer.cfg, model=trainer.model, tokenizer=trainer.tokenizer, task=trainer.task, engine=trainer.engine,
        algorithm=trainer.algorithm, out_dir=trainer.out_dir, fillers=trainer.fillers, **options,
    )  # fmt: skip
