r"""Each group's prompt computed once: one forward over the G prompts, whose KV cache the K samples share.

The B = G*K rows of a rollout batch repeat each prompt K times (rows ``g*K .. g*K+K-1``). A forward over
prompt + response computes every prompt K times, forward and backward. `shared_prompt_forward` runs

1. the **prompt pass**: the G distinct prompts ``[G, P]`` with a KV cache, the LM head at their last
   position only (``logits_to_keep=1``: those logits predict the first response token of all K samples);
2. the **response passes**: the responses on top of the prompt cache, each layer's prompt states
   expanded to the K samples of their group by a stride-0 view and joined to the new ones in the one
   copy attention needs anyway (`posttrain.llm.rollout.shared_cache.ReusedLayer`). The last token a row
   needs is not fed (it predicts nothing), and the columns run in chunks (`posttrain.llm.rollout.chunks`)
   from which rows whose responses have ended drop out, so the layers and the LM head run only where a
   row still needs a log-prob (up to the padding inside a chunk).

Gradient flows from the responses back through the shared prompt (the expand's backward sums the K
samples' contributions), so log-probs and gradients equal those of one forward over prompt + response up
to float rounding. Leading prompt columns that are padding in every row are not computed either.

Sharing needs transformers' cache classes: `why_not_shared` names what prevents it (rows of a group with
different prompts, reentrant gradient checkpointing, a sliding-window or recurrent layer, prompt-learning
adapters, a forward without a cache argument) and the callers fall back to the unshared forward, logging
the reason once (`log_fallback`). Non-reentrant gradient checkpointing (what ``model.gradient_checkpointing``
turns on) is supported: the cache layers are pure, so the layers may keep it (`cache_under_checkpointing`).

Data parallel: under DDP the earlier passes call the wrapped module and the last one the DDP wrapper, so
that DDP sees one forward per backward (each parameter's gradient is still complete: autograd sums all
its uses before DDP's hook fires). Under FSDP2 every forward is a collective: every rank runs one prompt
pass and one response pass (no chunks), and a group that cannot share on one rank makes all fall back.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from jaxtyping import Bool, Float, Int
from torch import Tensor

from posttrain.errors import ShapeError
from posttrain.llm.rollout.chunks import plan_chunks
from posttrain.llm.rollout.shared_cache import (
    PromptLayer,
    ReusedLayer,
    cache_keyword,
    cache_of,
    cache_under_checkpointing,
    checkpointed_layers,
    dynamic_layer,
    hf_model,
    new_cache,
    position_ids,
    reentrant,
)

__all__ = [
    "Chunk",
    "RowFacts",
    "SharedLogits",
    "log_fallback",
    "note_groups",
    "recorded_groups",
    "row_facts",
    "shared_prompt_forward",
    "why_not_shared",
    "worth_sharing",
]

logger = logging.getLogger(__name__)
_LOGGED: set[str] = set()
_RECORD: ContextVar[list[bool] | None] = ContextVar("shared_prefix_record", default=None)

SHARE_MIN_FLOPS = 2e9
"""Sharing runs one forward call more (the prompt pass): it is taken when the prompt work it saves, in FLOPs,
is at least this (about 20 ms of a CPU's per-call dispatch, forward and backward). Below it (a tiny model)
the unshared forward is used, without a log: a choice of cost, not a fallback."""
CHUNK_OVERHEAD_FLOPS = 2e9
"""The cost of one more response pass, in FLOPs of token work: about 20 ms of a CPU's per-call dispatch, forward
and backward (so a model whose tokens cost little, like the tiny test model, never splits its responses)."""
CHUNK_OVERHEAD_SHARE = {"cpu": 0.02}
"""The cost of one more response pass is also at least this share of one pass over all rows and columns, by device
type; 0.25 elsewhere (an accelerator's pass is short, and its fixed cost, the kernel launches, relatively large)."""


def log_fallback(reason: str) -> None:
    """Log (once per process and reason, at WARNING) that a forward does not share its prompts, and why."""
    if reason not in _LOGGED:
        _LOGGED.add(reason)
        logger.warning("prompts computed once per sample, not once per group: %s", reason)


@contextmanager
def recorded_groups() -> Iterator[list[bool]]:
    """Record which path the grouped forwards run inside took: the yielded list gets, per forward call (in call
    order) and per group of its batch, True where the group's prompt was computed once, False where it ran once
    per sample (a fallback, or prompts cheaper than the prompt pass). What the trainer's FLOP count reads."""
    record: list[bool] = []
    token = _RECORD.set(record)
    try:
        yield record
    finally:
        _RECORD.reset(token)


def note_groups(groups: int, *, shared: bool) -> None:
    """Add ``groups`` entries ``shared`` to the innermost `recorded_groups` list, if one is open."""
    record = _RECORD.get()
    if record is not None:
        record.extend([shared] * groups)


def _sharded(model: Any) -> bool:
    """True for a module that FSDP2's ``fully_shard`` was applied to."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch build without distributed support
        return False
    return isinstance(model, FSDPModule)


@dataclass(frozen=True)
class RowFacts:
    """What the host needs to know of a batch's rows, read from the device in one transfer (one host sync).

    Attributes:
        same_prompts: every group's rows hold one prompt (under FSDP2: on every rank).
        start: the first prompt column some row uses (the columns before are padding in every row).
        widths: per row, the last column on its response mask + 1 (0: an empty mask).
        prompt_tokens: the real tokens of the G distinct prompts (one row per group).
    """

    same_prompts: bool
    start: int
    widths: tuple[int, ...]
    prompt_tokens: int = 0


def row_facts(
    model: Any,
    prompt_ids: Int[Tensor, "B P"],
    prompt_mask: Bool[Tensor, "B P"],
    mask: Bool[Tensor, "B T"] | None,
    *,
    group_size: int,
) -> RowFacts:
    """The `RowFacts` of a batch whose K = ``group_size`` samples of a prompt are consecutive rows.

    Under FSDP2 ``same_prompts`` is all-reduced (every rank must run as many forwards: all share or none).

    Raises:
        ShapeError: ``B`` not a multiple of ``group_size``.
    """
    b, k = prompt_ids.shape[0], group_size
    if isinstance(k, bool) or not isinstance(k, int) or k < 1 or b % k:
        raise ShapeError(f"group_size: expected a positive divisor of B={b}, got {k!r}")
    grouped, masks = prompt_ids.reshape(b // k, k, -1), prompt_mask.reshape(b // k, k, -1)
    same = (((grouped == grouped[:, :1]) | ~masks).all() & (masks == masks[:, :1]).all()).long().reshape(1)
    if _sharded(model):
        dist.all_reduce(same, op=dist.ReduceOp.MIN)
    start = prompt_mask.any(dim=0).long().argmax().reshape(1)
    if mask is None or mask.shape[1] == 0:
        widths = torch.zeros(b, dtype=torch.long, device=prompt_mask.device)
    else:
        widths = (mask * torch.arange(1, mask.shape[1] + 1, device=mask.device)).amax(dim=1)
    tokens = prompt_mask[::k].sum().long().reshape(1)
    facts = torch.cat([same, start, tokens, widths.long()]).tolist()
    return RowFacts(bool(facts[0]), int(facts[1]), tuple(int(w) for w in facts[3:]), int(facts[2]))


def why_not_shared(
    model: Any,
    prompt_ids: Int[Tensor, "B P"],
    prompt_mask: Bool[Tensor, "B P"],
    *,
    group_size: int,
    facts: RowFacts | None = None,
) -> str | None:
    """Why `shared_prompt_forward` cannot serve this call (None: it can), from the model and the prompts.

    ``facts``: the batch's `row_facts` if already read. Under FSDP2 the answer is the same on every rank.

    Raises:
        ShapeError: ``B`` not a multiple of ``group_size``.
    """
    facts = facts or row_facts(model, prompt_ids, prompt_mask, None, group_size=group_size)
    if group_size == 1:
        return "one sample per prompt (group_size 1)"
    peft_config = getattr(model, "active_peft_config", None)
    if peft_config is not None and getattr(peft_config, "is_prompt_learning", False):
        return "a prompt-learning adapter (it owns the KV cache)"
    inner = hf_model(model)
    config = getattr(inner, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return f"{type(inner).__name__} is not a decoder-only transformers model"
    if cache_keyword(model) is None:
        return f"{type(inner).__name__}.forward takes no KV cache"
    if any(reentrant(layer) for layer in checkpointed_layers(model)):
        return "reentrant gradient checkpointing (the prompt's keys and values would carry no gradient)"
    layers = new_cache(config).layers
    if not layers:
        return f"no cache layers follow from the config of {type(inner).__name__}"
    other = sorted({type(layer).__name__ for layer in layers if type(layer) is not dynamic_layer()})
    if other:
        return f"cache layers of type {', '.join(other)} (only full-attention DynamicLayer caches are shared)"
    if not facts.same_prompts:
        return "the rows of a group hold different prompts" + (" (on some rank)" if _sharded(model) else "")
    return None


@dataclass(frozen=True)
class Chunk:
    """Logits of one response pass: ``logits [R, C, V]`` at columns ``start .. start + C - 1`` of ``rows``
    (None: all B rows), predicting their tokens ``start + 1 .. start + C``."""

    rows: Int[Tensor, " R"] | None
    start: int
    logits: Float[Tensor, "R C V"]


@dataclass(frozen=True)
class SharedLogits:
    """Raw logits predicting the response tokens, from one prompt pass per group and chunked response passes.

    Attributes:
        first: ``[G, V]``, at the last prompt position of each group: predicts token 0 of its K samples.
        chunks: the response passes; a position no chunk covers is after its row's last needed token.
        group_size: K.
        width: S, the response columns some row uses (trailing columns off every row's mask are left out).
    """

    first: Float[Tensor, "G V"]
    chunks: tuple[Chunk, ...]
    group_size: int
    width: int

    def first_per_row(self) -> Float[Tensor, "G K V"]:
        """``first`` expanded to each group's K samples (a stride-0 view, no copy)."""
        g, v = self.first.shape
        return self.first.unsqueeze(1).expand(g, self.group_size, v)

    def tie(self, x: Tensor) -> Tensor:
        """``x`` (+ 0) depending on the passes whose logits are all unused (none predict a token): under FSDP2
        every pass's backward must run on every rank, since each is a collective."""
        unused = [c.logits.sum() for c in self.chunks if c.logits.shape[1] == 0]
        return x if not unused else x + torch.stack(unused).sum().to(x.dtype) * 0

    def full(self) -> Float[Tensor, "B S V"]:
        """All ``[B, S, V]`` logits (position ``t`` predicts token ``t``; 0 where no chunk computed them)."""
        g, v = self.first.shape
        out = self.first.new_zeros(g * self.group_size, self.width, v)
        out[:, 0] = self.first_per_row().reshape(-1, v)
        for c in self.chunks:
            cols = slice(c.start + 1, c.start + 1 + c.logits.shape[1])
            if c.rows is None:
                out[:, cols] = c.logits
            else:
                out[c.rows, cols] = c.logits
        return self.tie(out)


def _flops_per_token(model: Any) -> float:
    """Forward FLOPs of one token: twice the parameters of the transformers model (LM head included)."""
    return 2.0 * sum(p.numel() for p in hf_model(model).parameters())


def worth_sharing(model: Any, facts: RowFacts, *, group_size: int) -> bool:
    """Whether the prompt work sharing saves, ``(K - 1)`` times the distinct prompts' tokens, is worth the
    prompt pass's extra forward call (`SHARE_MIN_FLOPS`); always under FSDP2 (every rank decides alike)."""
    if _sharded(model):
        return True
    return (group_size - 1) * facts.prompt_tokens * _flops_per_token(model) >= SHARE_MIN_FLOPS


def _plan(model: Any, fed: list[int], device: torch.device) -> list[int]:
    """Chunk boundaries over the fed response columns (one chunk under FSDP2; see `CHUNK_OVERHEAD_FLOPS`)."""
    top = max(fed)
    if _sharded(model):
        return [0, max(top, 1)]
    share = CHUNK_OVERHEAD_SHARE.get(device.type, 0.25)
    return plan_chunks(fed, overhead=max(CHUNK_OVERHEAD_FLOPS / _flops_per_token(model), share * len(fed) * top))


def shared_prompt_forward(
    model: Any,
    prompt_ids: Int[Tensor, "B P"],
    prompt_mask: Bool[Tensor, "B P"],
    response_ids: Int[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    group_size: int,
    facts: RowFacts | None = None,
) -> SharedLogits:
    """The logits predicting every needed response token, each group's prompt computed once (see the module).

    Call `why_not_shared` first (``facts``: the batch's `row_facts`, if already read); this raises
    `RuntimeError` (after the prompt pass) if the model did not fill its KV cache. Gradient flows when
    called outside ``torch.no_grad``.
    """
    k, b = group_size, prompt_ids.shape[0]
    facts = facts or row_facts(model, prompt_ids, prompt_mask, mask, group_size=k)
    prompt_ids, prompt_mask = prompt_ids[:, facts.start :], prompt_mask[:, facts.start :]  # drop all-padding columns
    p, widths = prompt_ids.shape[1], facts.widths
    fed = [max(w - 1, 0) for w in widths]
    bounds = _plan(model, fed, mask.device)
    inner, keyword = hf_model(model), cache_keyword(model)
    assert keyword is not None  # checked by why_not_shared
    attn = torch.cat([prompt_mask, mask[:, : bounds[-1]]], dim=1).long()
    positions = position_ids(attn)
    passes = len(bounds) - 1
    layers = [PromptLayer() for _ in range(len(new_cache(inner.config).layers))]
    chunks: list[Chunk] = []
    with cache_under_checkpointing(checkpointed_layers(model)):
        call = model if passes == 0 else getattr(model, "module", model)  # DDP: the last pass through the wrapper
        out = call(
            input_ids=prompt_ids[::k], attention_mask=attn[::k, :p], position_ids=positions[::k, :p],
            **{keyword: cache_of(inner.config, layers)}, use_cache=False, logits_to_keep=1,
        )  # fmt: skip
        first = out.logits[:, -1]
        if any(layer.get_seq_length() != p for layer in layers):
            raise RuntimeError(f"{type(inner).__name__} did not fill its KV cache with the {p} prompt positions")
        states = [(layer.keys, layer.values) for layer in layers]
        before: Tensor | None = None  # the rows of the previous response pass (None: all)
        for j, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            alive = None if _sharded(model) or min(fed) > lo else _rows_over(fed, lo, mask.device)
            rows, per_state = _reads(alive, before, first=j == 0, group_size=k, b=b)
            reused = [ReusedLayer(keys, values, rows=rows, group_size=per_state) for keys, values in states]
            pick = slice(None) if alive is None else alive
            call = model if j == passes - 1 else getattr(model, "module", model)
            out = call(
                input_ids=response_ids[pick, lo:hi], attention_mask=attn[pick, : p + hi],
                position_ids=positions[pick, p + lo : p + hi], **{keyword: cache_of(inner.config, reused)},
                use_cache=False, logits_to_keep=hi - lo,
            )  # fmt: skip
            chunks.append(Chunk(alive, lo, out.logits[:, : max(min(hi, max(fed)) - lo, 0)]))
            states, before = [_joined(layer) for layer in reused], alive
    return SharedLogits(first, tuple(chunks), k, max(max(widths), 1))


def _joined(layer: ReusedLayer) -> tuple[Tensor, Tensor]:
    """The states a pass joined in ``layer`` (every layer of the model reads and writes its cache)."""
    if layer.joined is None:
        raise RuntimeError("a response pass left a cache layer unread: the model did not use its KV cache")
    return layer.joined


def _reads(
    alive: Tensor | None, before: Tensor | None, *, first: bool, group_size: int, b: int
) -> tuple[Tensor | None, int]:
    """Which earlier state each row of a response pass reads (``rows``, ``group_size`` of `ReusedLayer`).

    The first pass reads the prompt states (one per group); a later one the previous pass's, one per row
    of it (``before``; None: all B rows), among which are the rows still running (``alive``; None: all).
    """
    if first:
        return (None, group_size) if alive is None else (alive // group_size, 1)
    if alive is None:
        return None, 1
    return (alive if before is None else _positions(before, b)[alive]), 1


def _rows_over(fed: list[int], column: int, device: torch.device) -> Tensor:
    """The rows that need a column past ``column`` fed."""
    return torch.tensor([f > column for f in fed]).nonzero()[:, 0].to(device)


def _positions(rows: Tensor, b: int) -> Tensor:
    """Row ``r`` of the batch -> its index among ``rows`` (``-1`` if absent)."""
    out = torch.full((b,), -1, dtype=torch.long, device=rows.device)
    out[rows] = torch.arange(rows.numel(), device=rows.device)
    return out
