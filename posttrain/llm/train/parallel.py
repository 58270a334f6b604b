"""Data-parallel wrappers: DDP (every rank holds the whole model) or FSDP2 (``fully_shard``).

``distributed.strategy`` picks one when ``torch.distributed`` is initialised (e.g. under
``torchrun``); without a process group the model is used as is. FSDP2 shards each decoder layer,
then the root module (embeddings, final norm, LM head), so a rank holds ~1/world of the weights,
gradients and optimizer state and all-gathers one layer at a time in forward and backward.

Both strategies average gradients over ranks (DDP's all-reduce, FSDP2's reduce-scatter divide by
the world size), so the trainer's ``loss * world`` normalisation is the same for both. Under FSDP2
parameters and gradients are ``DTensor`` shards: `full_tensor` gathers one,
`full_state_dict` gathers the model's (collective: every rank calls it). Forward-only models
(reference, teacher) are sharded the same way by `wrap_frozen`.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist

from posttrain.errors import DomainError

__all__ = [
    "STRATEGIES",
    "average_gradients",
    "clip_gradients",
    "full_optimizer_state",
    "full_state_dict",
    "full_tensor",
    "gradient_sync",
    "is_sharded",
    "load_full_optimizer_state",
    "load_full_state_dict",
    "rank_and_world",
    "set_gradient_sync",
    "synced_engine",
    "wrap_frozen",
    "wrap_model",
]


STRATEGIES = ("ddp", "fsdp")
"""``distributed.strategy``: the wrappers of this module."""


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

    ``ddp`` returns a ``DistributedDataParallel`` wrapper that syncs the weights and buffers from rank 0
    once, at construction, but not the buffers in forward (``broadcast_buffers = False``): a causal LM holds
    no trained buffers (e.g. rotary ``inv_freq`` is a function of the config, equal on every rank), so its
    forwards need no collective and ranks may run different numbers of micro-batch forwards per update
    (each rank's own replayed groups, `posttrain.llm.rollout.replay`); gradients are still all-reduced
    once per update. (With the default, DDP broadcasts rank 0's buffers in the first forward after each
    gradient-synchronised one: once per update in torch 2.13, a private detail not relied on.)
    ``fsdp`` applies ``fully_shard`` in place to every decoder layer and then to the root, and returns the
    same (now sharded) module.
    """
    if strategy not in STRATEGIES:
        raise DomainError(f"distributed.strategy: unknown name {strategy!r}; valid: {', '.join(STRATEGIES)}")
    if not (dist.is_available() and dist.is_initialized()):
        return model
    if strategy == "ddp":
        ddp = torch.nn.parallel.DistributedDataParallel(model)  # syncs the weights and buffers from rank 0
        ddp.broadcast_buffers = False  # but not the buffers in every forward (torch 2.13: forward_sync_buffers)
        return ddp
    return _shard(model)


def _shard(model: torch.nn.Module) -> torch.nn.Module:
    """``fully_shard`` every decoder layer, then the root (in place)."""
    from torch.distributed.fsdp import fully_shard

    for layer in _decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)
    return model


def wrap_frozen(model: torch.nn.Module, strategy: str) -> torch.nn.Module:
    """A forward-only model (reference, teacher) in eval mode without gradients, placed like the policy.

    Under ``fsdp`` (with a process group) it is sharded like the policy, so a reference as large as
    a policy that does not fit one device does not have to either; its forwards are then collectives
    (every rank calls them, as the loop's fillers do once per step). Otherwise (one process, or
    ``ddp``: nothing to synchronise without gradients) the model is returned as is.
    """
    if strategy not in STRATEGIES:
        raise DomainError(f"distributed.strategy: unknown name {strategy!r}; valid: {', '.join(STRATEGIES)}")
    model.eval().requires_grad_(False)
    if strategy == "fsdp" and dist.is_available() and dist.is_initialized():
        return _shard(model)
    return model


def is_sharded(model: Any) -> bool:
    """True for a module that ``fully_shard`` was applied to."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def set_gradient_sync(model: Any, enabled: bool) -> None:
    """FSDP2's ``no_sync``: skip (``enabled=False``) or do the gradient reduce-scatter of the next backward."""
    model.set_requires_gradient_sync(enabled)


def gradient_sync(model: Any, enabled: bool) -> contextlib.AbstractContextManager[Any]:
    """Do (``enabled``) or skip the gradient reduction of the backward passes inside: DDP's ``no_sync``
    when skipping, FSDP2's reduce-scatter switch (`set_gradient_sync`); nothing for a bare model."""
    if is_sharded(model):
        set_gradient_sync(model, enabled)
    elif not enabled and hasattr(model, "no_sync"):
        return model.no_sync()  # type: ignore[no-any-return]
    return contextlib.nullcontext()


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a ``DTensor`` shard (collective); a plain tensor is returned unchanged."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def full_state_dict(model: Any) -> dict[str, Any]:
    """The unsharded model state dict on CPU (collective: every rank calls it; only rank 0 gets the tensors)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def _owner(model: Any, modules: tuple[torch.nn.Module, ...]) -> Any:
    """The module that names every parameter of the optimizer: the model, or the model beside ``modules``.

    ``torch.distributed.checkpoint`` keys optimizer state by parameter name and fails on a parameter the
    model does not own, such as those of an algorithm's own modules (a second parameter group).
    """
    if not modules:
        return model
    return torch.nn.ModuleDict({"policy": model, "algorithm_modules": torch.nn.ModuleList(modules)})


def full_optimizer_state(
    model: Any, optimizer: torch.optim.Optimizer, *, modules: tuple[torch.nn.Module, ...] = ()
) -> dict[str, Any]:
    """The unsharded optimizer state on CPU (collective, like `full_state_dict`), including the
    state of the parameters of ``modules`` (unsharded modules whose parameters the optimizer also holds)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(_owner(model, modules), optimizer, options=options)  # type: ignore[no-any-return]


def load_full_state_dict(model: Any, weights: dict[str, Any]) -> Any:
    """Load full weights into a sharded model (every rank keeps its shards); returns missing/unexpected keys."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    return set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=False))


def load_full_optimizer_state(
    model: Any, optimizer: torch.optim.Optimizer, state: dict[str, Any], *, modules: tuple[torch.nn.Module, ...] = ()
) -> None:
    """Load a full optimizer state (`full_optimizer_state`'s output, same ``modules``) into a sharded
    model's optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(_owner(model, modules), optimizer, state, options=StateDictOptions(full_state_dict=True))


def rank_and_world() -> tuple[int, int]:
    """``(rank, world size)`` of the default process group; ``(0, 1)`` without one."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)


def synced_engine(model: Any, tokenizer: Any, sampling: Any) -> Any:
    """For a sharded ``model``, an HF engine that keeps ranks in step (every forward is a collective); else None."""
    if not is_sharded(model):
        return None
    from posttrain.llm.rollout.engine import HFEngine

    tok = tokenizer
    return HFEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, sampling=sampling, synced_gpus=True)


def average_gradients(params: list[torch.nn.Parameter], world: int) -> None:
    """All-reduce (mean over ``world`` ranks) the gradients of parameters no DDP/FSDP wrapper owns."""
    if world == 1:
        return
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= world


def clip_gradients(
    policy_params: list[torch.nn.Parameter], module_params: list[torch.nn.Parameter], max_norm: float | None
) -> float:
    r"""Clip the policy's and an algorithm's own modules' gradients *together* by their global 2-norm.

    $\|g\| = \sqrt{\|g_{policy}\|^2 + \|g_{modules}\|^2}$; when it exceeds ``max_norm`` every
    gradient is scaled by $\text{max\_norm} / (\|g\| + 10^{-6})$ (as ``clip_grad_norm_``). Without
    modules this is ``clip_grad_norm_`` on the policy. Under FSDP2 the policy's norm is gathered from its
    ``DTensor`` shards (every rank calls this); module gradients are whole on every rank. Returns the norm
    before clipping (NaN when ``max_norm`` is None: nothing is computed).
    """
    if max_norm is None:
        return float("nan")
    if not module_params:
        return float(full_tensor(torch.nn.utils.clip_grad_norm_(policy_params, max_norm)))
    grads = [[p.grad for p in ps if p.grad is not None] for ps in (policy_params, module_params)]
    parts = [float(full_tensor(torch.nn.utils.get_total_norm(g))) if g else 0.0 for g in grads]
    total = (parts[0] ** 2 + parts[1] ** 2) ** 0.5
    coef = max_norm / (total + 1e-6)
    if coef < 1.0:
        for g in (*grads[0], *grads[1]):
            g.mul_(coef)
    return total
