"""Data-parallel wrappers: DDP (every rank holds the whole model) or FSDP2 (``fully_shard``).

``distributed.strategy`` picks one when ``torch.distributed`` is initialised (e.g. under
``torchrun``); without a process group the model is used as is. FSDP2 shards each decoder layer,
then the root module (embeddings, final norm, LM head), so a rank holds ~1/world of the weights,
gradients and optimizer state and all-gathers one layer at a time in forward and backward.

Both strategies average gradients over ranks (DDP's all-reduce, FSDP2's reduce-scatter divide by
the world size), so the trainer's ``loss * world`` normalisation is the same for both. Under FSDP2
parameters and gradients are ``DTensor`` shards: :func:`full_tensor` gathers one,
:func:`full_state_dict` gathers the model's (collective: every rank calls it).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from posttrain.errors import DomainError

__all__ = ["STRATEGIES", "full_state_dict", "full_tensor", "is_sharded", "set_gradient_sync", "wrap_model"]

STRATEGIES = ("ddp", "fsdp")


def _decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The ``ModuleList`` of transformer blocks of an HF causal LM (``model.model.layers``)."""
    layers = getattr(getattr(model, "model", model), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise DomainError(
            f"distributed.strategy='fsdp': cannot find the decoder layers of {type(model).__name__} "
            "(expected a ModuleList at model.model.layers)"
        )
    return layers


def wrap_model(model: torch.nn.Module, strategy: str) -> torch.nn.Module:
    """The model for training under ``strategy`` (the model itself when ``torch.distributed`` is not initialised).

    ``ddp`` returns a ``DistributedDataParallel`` wrapper; ``fsdp`` applies ``fully_shard`` in place
    to every decoder layer and then to the root, and returns the same (now sharded) module.
    """
    if strategy not in STRATEGIES:
        raise DomainError(f"distributed.strategy: unknown name {strategy!r}; valid: {', '.join(STRATEGIES)}")
    if not (dist.is_available() and dist.is_initialized()):
        return model
    if strategy == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for layer in _decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)
    return model


def is_sharded(model: Any) -> bool:
    """True for a module that ``fully_shard`` was applied to."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def set_gradient_sync(model: Any, enabled: bool) -> None:
    """FSDP2's ``no_sync``: skip (``enabled=False``) or do the gradient reduce-scatter of the next backward."""
    model.set_requires_gradient_sync(enabled)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a ``DTensor`` shard (collective); a plain tensor is returned unchanged."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def full_state_dict(model: Any) -> dict[str, Any]:
    """The unsharded model state dict on CPU (collective: every rank calls it; only rank 0 gets the tensors)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
