"""Rollout engines behind one Protocol, their sampling options and prompt padding.

An engine turns G prompts (token id lists) into B = G*K sampled responses with the behaviour
log-prob of every sampled token. Two implementations: `HFEngine` (the transformers model's
forward with its KV cache in a batched sampling loop that draws what ``model.generate`` draws) here
and ``VLLMEngine`` in `posttrain.llm.rollout.vllm`.

Log-prob convention (both engines and `token_logprobs`): the log-softmax of the
temperature-scaled logits over the full vocabulary, $\\log\\mathrm{softmax}(z/\\tau)_{y_t}$.
With ``top_p < 1`` or ``top_k > 0`` the sampler draws from a truncated distribution; the
log-probs stay the full-vocabulary ones (vLLM's ``processed_logprobs`` instead renormalises over
the kept tokens), so keep ``top_p = 1, top_k = 0`` when the importance ratio must be exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist
from jaxtyping import Bool, Float, Int
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import zero_off_mask
from posttrain.llm.rollout.logprobs import position_ids, widened
from posttrain.llm.rollout.shared_cache import cache_keyword
from posttrain.validate import check_positive

__all__ = [
    "HFEngine",
    "RolloutEngine",
    "Rollouts",
    "SamplingConfig",
    "left_pad",
    "response_mask",
]


@dataclass(frozen=True)
class SamplingConfig:
    """How responses are sampled: ``temperature > 0``, ``top_p in (0, 1]``, ``top_k = 0`` for no cut."""

    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        check_positive("max_new_tokens", self.max_new_tokens)
        check_positive("temperature", self.temperature)
        if not 0.0 < self.top_p <= 1.0:
            raise DomainError(f"top_p: expected a value in (0, 1], got {self.top_p!r}")
        if self.top_k < 0:
            raise DomainError(f"top_k: expected >= 0 (0 = no cut), got {self.top_k!r}")


@dataclass(frozen=True)
class Rollouts:
    """What an engine returns: B = G*K responses, the K samples of prompt g in rows ``g*K .. g*K+K-1``.

    ``prompt_ids``/``prompt_mask`` are ``[B, P]`` (left-padded), ``response_ids``/``mask``/``logp``
    are ``[B, T]`` (right-padded; ``mask`` covers the response up to and including ``<eos>``;
    ``logp`` is 0 off the mask).
    """

    prompt_ids: Int[Tensor, "B P"]
    prompt_mask: Bool[Tensor, "B P"]
    response_ids: Int[Tensor, "B T"]
    mask: Bool[Tensor, "B T"]
    logp: Float[Tensor, "B T"]
    group_size: int


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples K responses per prompt with behaviour log-probs; follows the trainer's weights."""

    def generate(self, prompts: Sequence[Sequence[int]], *, n: int, seed: int, greedy: bool = False) -> Rollouts:
        """K = ``n`` responses for each prompt; ``seed`` fixes the sampling noise of this call."""
        ...

    def sync_weights(self, model: Any) -> None:
        """Make the engine sample from ``model``'s current weights (a no-op when it shares them)."""
        ...


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[Int[Tensor, "G P"], Bool[Tensor, "G P"]]:
    """Left-pad token id lists into ``([G, P] ids, [G, P] mask)``.

    Examples:
        >>> ids, m = left_pad([[5, 6], [7]], pad_id=0)
        >>> ids.tolist(), m.tolist()
        ([[5, 6], [0, 7]], [[True, True], [False, True]])
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise DomainError("prompts: expected a non-empty list of non-empty token id lists")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.bool)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
        mask[row, width - len(p) :] = True
    return ids, mask


def response_mask(response_ids: Int[Tensor, "B T"], eos_id: int) -> Bool[Tensor, "B T"]:
    """True up to and including the first ``eos_id`` of each row (the whole row if there is none).

    Examples:
        >>> response_mask(torch.tensor([[5, 3, 0], [5, 6, 7]]), eos_id=3).tolist()
        [[True, True, False], [True, True, True]]
    """
    is_eos = (response_ids == eos_id).long()
    return (is_eos.cumsum(dim=1) - is_eos) == 0


def _truncated(z: Float[Tensor, "B V"], *, top_k: int, top_p: float) -> Float[Tensor, "B V"]:
    """``z`` with the logits outside the ``top_k`` largest, then outside the ``top_p`` nucleus, set to ``-inf``.

    The rules of transformers' ``TopKLogitsWarper`` and ``TopPLogitsWarper`` (ties at the k-th
    logit are kept; the nucleus is the smallest set of largest probabilities whose mass exceeds
    ``1 - top_p``, never empty), so sampling equals ``model.generate``'s for the same seed.
    ``top_k = 0`` and ``top_p = 1`` cut nothing.

    Examples:
        >>> _truncated(torch.tensor([[0.0, 1.0, 2.0]]), top_k=2, top_p=1.0).tolist()
        [[-inf, 1.0, 2.0]]
    """
    if top_k:
        kth = torch.topk(z, min(top_k, z.shape[-1]), dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, -torch.inf)
    if top_p < 1.0:
        ascending, order = torch.sort(z, dim=-1)
        drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1.0 - top_p
        drop[..., -1] = False
        z = z.masked_fill(drop.scatter(-1, order, drop), -torch.inf)
    return z


def _cache_keyword(model: Any) -> str:
    """The keyword passing a KV cache to ``model``'s forward (`cache_keyword`; ``past_key_values`` if it names none)."""
    return cache_keyword(model) or "past_key_values"


def _full_attention(cache: Any) -> bool:
    """Whether every layer of a ``DynamicCache`` built from a config is a plain full-attention ``DynamicLayer``."""
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in cache.layers)


class HFEngine:
    """Rollouts from the training model itself: its forward with a KV cache (``DynamicCache``) in a batched sampling loop.

    The loop samples exactly what transformers' ``model.generate(do_sample=True, temperature, top_k,
    top_p)`` samples for the same seed on CPU (same warpers, same ``multinomial`` draws, rows that hit
    ``<eos>`` continue with ``<pad>``, stop when every row is done or at ``max_new_tokens``), but
    keeps only the ``[B]`` log-probs of each step's sampled tokens instead of ``[B, V]`` logits
    per step (``generate``'s ``output_logits``: ``B x T x V`` floats at the end), skips
    ``generate``'s per-call configuration and per-step processor machinery, and ignores the
    model's ``generation_config`` (a checkpoint's default repetition penalty or top-p would change
    the sampling distribution behind the trainer's back). Each prompt is prefilled once and its KV cache
    and last logits repeated to its ``n`` samples (``generate`` prefills every row). ``greedy`` takes the
    argmax. Log-probs and
    sampling use the model's precision, at least float32 (``generate`` rounds float64 logits to
    float32), so a float64 model's behaviour log-probs match `token_logprobs` to float64 precision.

    Sampling noise comes from a ``torch.Generator`` seeded with ``seed`` (a call is reproducible and
    leaves the global RNG untouched). It runs under ``torch.inference_mode`` (no autograd bookkeeping
    on the many small decode ops), except with ``synced_gpus``: an FSDP2-sharded model, whose every
    forward is a collective and whose gathered parameters are later trained (``no_grad`` there);
    each rank then keeps stepping until all ranks are done (one all-reduce per token), so ranks whose
    responses end at different lengths do not deadlock. The returned tensors are ordinary ones,
    usable in a training forward.
    """

    COMPACT_BELOW = 0.75
    """Finished rows leave the model's batch when fewer than this fraction of it still runs."""

    def __init__(
        self,
        model: Any,
        *,
        pad_id: int,
        eos_id: int,
        sampling: SamplingConfig | None = None,
        synced_gpus: bool = False,
        stop_check_every: int | None = None,
        compile_decode: bool = False,
    ) -> None:
        """``stop_check_every``: tokens between stop tests (host syncs); None: 1 on CPU, where a sync
        is free and a wasted forward is not, and 8 on an accelerator.

        ``compile_decode``: the one-token decode forward runs through ``torch.compile`` with a
        static KV cache (``StaticCache``: fixed shapes, so one compiled graph serves every step; the
        prefill stays eager). Rows are then never compacted. The compile (tens of seconds, again
        at the first new batch size or prompt width, after which the shapes are marked dynamic)
        pays back only over many rollouts: measured numbers are in ``docs/performance.md``.
        """
        if stop_check_every is not None:
            check_positive("stop_check_every", stop_check_every)
        if compile_decode and synced_gpus:
            raise DomainError(
                "compile_decode: not supported with synced_gpus (a sharded model's forward is a collective)"
            )
        self.stop_check_every = stop_check_every
        self.compile_decode = bool(compile_decode)
        self._compiled: tuple[Any, Any] | None = None  # (model, its compiled forward)
        self.model = model
        self.pad_id = int(pad_id)
        self.eos_id = int(eos_id)
        self.sampling = sampling or SamplingConfig()
        self.synced_gpus = synced_gpus

    def sync_weights(self, model: Any) -> None:
        """The engine samples from the training model object, so there is nothing to copy."""
        self.model = model

    def generate(self, prompts: Sequence[Sequence[int]], *, n: int, seed: int, greedy: bool = False) -> Rollouts:
        check_positive("n", n)
        ids, pmask = left_pad(prompts, self.pad_id)
        device = next(self.model.parameters()).device
        ids, pmask = ids.to(device), pmask.to(device)
        generator = torch.Generator(device=device).manual_seed(seed)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad() if self.synced_gpus else torch.inference_mode():
                response, logp = self._sample(ids, pmask, n, generator, greedy=greedy)
        finally:
            self.model.train(was_training)
        response, logp = response.clone(), logp.clone()  # ordinary tensors (autograd may save them)
        mask = response_mask(response, self.eos_id)
        logp = zero_off_mask(logp, mask)
        ids, pmask = ids.repeat_interleave(n, dim=0), pmask.repeat_interleave(n, dim=0)
        return Rollouts(ids, pmask, response, mask, logp, group_size=n)

    def _sample(
        self, ids: Int[Tensor, "G P"], pmask: Bool[Tensor, "G P"], n: int, generator: torch.Generator, *, greedy: bool
    ) -> tuple[Int[Tensor, "B T"], Float[Tensor, "B T"]]:
        """Token ids and log-probs $\\log\\mathrm{softmax}(z_t/\\tau)_{y_t}$ of up to ``max_new_tokens`` steps, ``n``
        samples of each of the G prompts (rows ``g*n .. g*n+n-1``).

        Each prompt is prefilled once and its KV cache and last logits repeated to its ``n`` samples
        (`_prefill`). The attention mask and the positions of every step are allocated once (each step passes a
        view); the stop test (a host sync) runs every `stop_check_every` tokens, the steps taken
        past the end are cut off at the end (one sync). At a stop test, once fewer than
        `COMPACT_BELOW` of the rows in the model's batch still run, the finished rows leave it
        (their KV cache rows too); every row is still sampled, from its last logits, so the
        sampler consumes the same random numbers as ``generate`` (``multinomial`` draws one
        exponential per entry of ``[B, V]``) and the tokens are unchanged.
        """
        s, rows, width = self.sampling, ids.shape[0] * n, ids.shape[1]
        tau = 1.0 if greedy else s.temperature
        attn = torch.ones(rows, width + s.max_new_tokens, dtype=torch.long, device=ids.device)
        attn[:, :width] = pmask.repeat_interleave(n, dim=0)
        positions = position_ids(attn[:, :width])
        future = positions[:, -1:] + torch.arange(1, s.max_new_tokens + 1, device=ids.device)  # [B, T] positions
        keyword, static = _cache_keyword(self.model), self.compile_decode
        cache, logits = self._prefill(ids, attn[::n, :width], positions[::n], n, keyword)
        batch: Tensor | None = None  # the rows in the model's batch (None: all, in order)
        running = torch.ones(rows, dtype=torch.bool, device=ids.device)
        tokens = torch.full((rows, s.max_new_tokens), self.pad_id, dtype=torch.long, device=ids.device)
        logps: Tensor | None = None
        alive = torch.zeros(s.max_new_tokens, dtype=torch.bool, device=ids.device)
        every = self.stop_check_every or (1 if ids.device.type == "cpu" else 8)
        taken = s.max_new_tokens
        for step in range(s.max_new_tokens):
            z = widened(logits) / tau  # [B, V]
            if greedy:
                y = z.argmax(dim=-1)
            else:
                probs = _truncated(z, top_k=s.top_k, top_p=s.top_p).softmax(dim=-1)
                y = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            y = torch.where(running, y, self.pad_id)
            tokens[:, step] = y
            lp = torch.log_softmax(z, dim=-1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
            if logps is None:
                logps = lp.new_zeros(rows, s.max_new_tokens)
            logps[:, step] = lp
            running = running & (y != self.eos_id)
            alive[step] = running.any()
            if step + 1 == s.max_new_tokens:
                break
            if (step + 1) % every == 0:
                if not self._any_running(running):
                    taken = step + 1
                    break
                if not (self.synced_gpus or static):
                    batch, attn, future = self._compact(cache, running, batch, attn, future)
            rows_in = y if batch is None else y[batch]
            # static: fixed shapes, so the whole mask (the causal mask hides the unwritten cache slots)
            out = (self._decode_forward() if static else self.model)(
                input_ids=rows_in.unsqueeze(-1),
                attention_mask=attn if static else attn[:, : width + step + 1],
                position_ids=future[:, step : step + 1],
                **{keyword: cache},
                use_cache=True,
                **({"cache_position": torch.full((1,), width + step, device=ids.device)} if static else {}),
            )
            if batch is None:
                logits = out.logits[:, -1]
            else:
                logits = logits.index_copy(0, batch, out.logits[:, -1])
        assert logps is not None
        # generate stops after the step at which the last row ended: keep that many steps (one sync)
        keep = min(taken, int(alive[:taken].sum()) + 1)
        return tokens[:, :keep], logps[:, :keep]

    def _prefill(
        self, ids: Int[Tensor, "G P"], attn: Int[Tensor, "G P"], positions: Int[Tensor, "G P"], n: int, keyword: str
    ) -> tuple[Any, Float[Tensor, "B V"]]:
        """The KV cache and last logits of the B = G*n rows after one forward over the G prompts.

        The prompts' ``DynamicCache`` is repeated to their ``n`` samples (``batch_repeat_interleave``);
        with `compile_decode` its states are written into a ``StaticCache`` of ``P + max_new_tokens``
        positions (the states a prefill of the B rows writes), or, for a model whose cache has other
        than full-attention layers, the B rows are prefilled into it directly.
        """
        from transformers import DynamicCache, StaticCache

        cache = DynamicCache(config=self.model.config)
        length = ids.shape[1] + self.sampling.max_new_tokens
        if self.compile_decode and not _full_attention(cache):
            static = StaticCache(config=self.model.config, max_cache_len=length)
            rows = torch.arange(ids.shape[0], device=ids.device).repeat_interleave(n)
            out = self.model(
                input_ids=ids[rows], attention_mask=attn[rows], position_ids=positions[rows], **{keyword: static},
                use_cache=True, logits_to_keep=1, cache_position=torch.arange(ids.shape[1], device=ids.device),
            )  # fmt: skip
            return static, out.logits[:, -1]
        out = self.model(
            input_ids=ids, attention_mask=attn, position_ids=positions, **{keyword: cache}, use_cache=True,
            logits_to_keep=1,
        )  # fmt: skip
        logits = out.logits[:, -1].repeat_interleave(n, dim=0)  # [B, V]
        if not self.compile_decode:
            cache.batch_repeat_interleave(n)
            return cache, logits
        static = StaticCache(config=self.model.config, max_cache_len=length)
        for i, layer in enumerate(cache.layers):  # full-attention layers (`_full_attention`)
            keys, values = layer.keys, layer.values  # type: ignore[union-attr]
            assert keys is not None and values is not None  # the prefill filled every layer
            static.update(keys.repeat_interleave(n, dim=0), values.repeat_interleave(n, dim=0), i)
        return static, logits

    def _decode_forward(self) -> Any:
        """The model's forward through ``torch.compile``, compiled once per model object."""
        if self._compiled is None or self._compiled[0] is not self.model:
            self._compiled = (self.model, torch.compile(self.model.forward))
        return self._compiled[1]

    def _compact(
        self, cache: Any, running: Tensor, batch: Tensor | None, attn: Tensor, future: Tensor
    ) -> tuple[Tensor | None, Tensor, Tensor]:
        """Drop the finished rows from the model's batch once fewer than `COMPACT_BELOW` of it run."""
        inside = running if batch is None else running[batch]
        still = inside.nonzero().squeeze(-1)
        if still.numel() == 0 or still.numel() >= self.COMPACT_BELOW * inside.numel():
            return batch, attn, future
        cache.batch_select_indices(still)
        rows = still if batch is None else batch[still]
        return rows, attn[still], future[still]

    def _any_running(self, running: Bool[Tensor, " B"]) -> bool:
        """Whether a row still samples, on any rank with ``synced_gpus`` (one host sync per token)."""
        flag = running.any().to(torch.int32)
        if self.synced_gpus:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag)
