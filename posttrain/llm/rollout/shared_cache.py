"""The model-side plumbing of a forward in passes (the prompt once per group, then the responses on top of it):
KV cache layers, the cache keyword of a model's forward, and position ids.

transformers' ``DynamicLayer`` appends what every forward writes. The layers here never grow: each pass
gets fresh ones that read the earlier passes' states, so that a recomputation (gradient checkpointing)
calling ``update`` again gets the same states back and gradient flows through all of them.

- `PromptLayer`: keeps the prompt pass's keys and values ``[G, H, P, D]``.
- `ReusedLayer`: joins the states of an earlier pass, read for each row of this one (each group's prompt
  expanded over its K samples as a stride-0 view, or the rows still running), with this pass's new states,
  in the one copy attention needs anyway.
- `position_ids`: positions that skip left padding, shared by every forward over prompt + response.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from posttrain.errors import ShapeError

__all__ = [
    "PromptLayer",
    "ReusedLayer",
    "cache_keyword",
    "cache_of",
    "cache_under_checkpointing",
    "checkpointed_layers",
    "dynamic_layer",
    "hf_model",
    "new_cache",
    "position_ids",
    "reentrant",
]


def position_ids(attention_mask: Tensor) -> Tensor:
    """Position ids that skip left padding (what ``generate`` uses for left-padded prompts)."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def hf_model(model: Any) -> Any:
    """The transformers model inside DDP and peft wrappers (whose config and forward signature count)."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module
    return model.get_base_model() if hasattr(model, "get_base_model") else model


_CACHE_KEYWORDS: dict[type, str | None] = {}


def cache_keyword(model: Any) -> str | None:
    """The keyword passing a KV cache to ``model``'s forward, inspected once per model class.

    ``cache`` where the forward names it (transformers 5.2x, which deprecates ``past_key_values``),
    else ``past_key_values``; looked up on the transformers model inside DDP and peft wrappers (whose
    own forward takes ``**kwargs``). None for a forward that takes neither.
    """
    inner = hf_model(model)
    kind = type(inner)
    if kind not in _CACHE_KEYWORDS:
        params = inspect.signature(inner.forward).parameters
        _CACHE_KEYWORDS[kind] = next((k for k in ("cache", "past_key_values") if k in params), None)
    return _CACHE_KEYWORDS[kind]


def dynamic_layer() -> type:
    """transformers' ``DynamicLayer`` (the full-attention layer of a ``DynamicCache``)."""
    from transformers.cache_utils import DynamicLayer

    return DynamicLayer


def new_cache(config: Any) -> Any:
    """A ``DynamicCache`` with the layers ``config`` implies."""
    from transformers import DynamicCache

    return DynamicCache(config=config)


def cache_of(config: Any, layers: list[Any]) -> Any:
    """A ``DynamicCache`` for ``config`` holding ``layers``."""
    cache = new_cache(config)
    cache.layers = layers
    return cache


class PromptLayer(dynamic_layer()):  # type: ignore[misc]
    """One layer's cache in the prompt pass: ``update`` keeps the prompt's states and returns them (no append)."""

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        self.keys, self.values = key_states, value_states
        self.device, self.dtype, self.is_initialized = key_states.device, key_states.dtype, True
        return key_states, value_states


class ReusedLayer(dynamic_layer()):  # type: ignore[misc]
    """One layer's cache in a later pass: an earlier pass's states ``[N, H, L, D]``, read for each row of this one.

    ``rows=None``: row ``r`` reads state ``r // group_size`` (all K samples of every group, a stride-0 view);
    else row ``r`` reads state ``rows[r]``. ``update(new [R, H, S, D])`` returns ``[R, H, L + S, D]`` and
    keeps it in ``joined`` (what the next pass reads); the earlier states are not changed.
    """

    def __init__(self, keys: Tensor, values: Tensor, *, rows: Tensor | None, group_size: int = 1) -> None:
        super().__init__()
        self.keys, self.values, self.rows, self.group_size = keys, values, rows, group_size
        self.device, self.dtype, self.is_initialized = keys.device, keys.dtype, True
        self.joined: tuple[Tensor, Tensor] | None = None

    def _join(self, past: Tensor, new: Tensor) -> Tensor:
        n, h, length, d = past.shape
        s = new.shape[-2]
        if self.rows is not None:
            return torch.cat([past.index_select(0, self.rows), new], dim=-2)
        k = self.group_size
        if new.shape[0] != n * k:
            raise ShapeError(f"key_states: expected {n * k} rows (G={n} groups x K={k}), got {new.shape[0]}")
        joined = torch.cat([past.unsqueeze(1).expand(n, k, h, length, d), new.reshape(n, k, h, s, d)], dim=-2)
        return joined.view(n * k, h, length + s, d)

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        self.joined = (self._join(self.keys, key_states), self._join(self.values, value_states))
        return self.joined


def checkpointed_layers(model: Any) -> list[torch.nn.Module]:
    """The layers a forward now would run with gradient checkpointing (none without grad or in eval mode)."""
    if not (torch.is_grad_enabled() and model.training):
        return []
    return [m for m in model.modules() if getattr(m, "gradient_checkpointing", False) is True and m.training]


def reentrant(layer: torch.nn.Module) -> bool:
    """Whether a checkpointed layer uses reentrant checkpointing (or one whose mode cannot be read)."""
    func = getattr(layer, "_gradient_checkpointing_func", None)
    return getattr(func, "keywords", {}).get("use_reentrant", True) is not False


@contextmanager
def cache_under_checkpointing(layers: list[torch.nn.Module]) -> Iterator[None]:
    """Let checkpointed ``layers`` keep the KV cache argument (``_can_checkpoint_with_cache``), then restore them.

    transformers drops the cache of a checkpointed layer because a recomputation would write a
    ``DynamicLayer`` twice; `PromptLayer` and `ReusedLayer` write nothing a recomputation changes.
    """
    for layer in layers:
        setattr(layer, "_can_checkpoint_with_cache", True)  # noqa: B010 (an instance attribute over the class's)
    try:
        yield
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache
