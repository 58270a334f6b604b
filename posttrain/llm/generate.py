"""Rollout engines behind one Protocol, and the trainer's log-prob recomputation.

An engine turns G prompts (token id lists) into B = G*K sampled responses with the behaviour
log-prob of every sampled token. Two implementations: :class:`HFEngine` (``model.generate``,
batched, KV cache) here and ``VLLMEngine`` in :mod:`posttrain.llm.generate_vllm`.

Log-prob convention (both engines and :func:`token_logprobs`): the log-softmax of the
temperature-scaled logits over the full vocabulary, :math:`\\log\\mathrm{softmax}(z/\\tau)_{y_t}`.
With ``top_p < 1`` or ``top_k > 0`` the sampler draws from a truncated distribution; the
log-probs stay the full-vocabulary ones (vLLM's ``processed_logprobs`` instead renormalises over
the kept tokens), so keep ``top_p = 1, top_k = 0`` when the importance ratio must be exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import token_entropy
from posttrain.validate import check_positive

__all__ = ["HFEngine", "RolloutEngine", "Rollouts", "SamplingConfig", "left_pad", "response_mask", "token_logprobs"]


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

    Example:
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

    Example:
        >>> response_mask(torch.tensor([[5, 3, 0], [5, 6, 7]]), eos_id=3).tolist()
        [[True, True, False], [True, True, True]]
    """
    is_eos = (response_ids == eos_id).long()
    return (is_eos.cumsum(dim=1) - is_eos) == 0


def _positions(attention_mask: Tensor) -> Tensor:
    """Position ids that skip left padding (what ``generate`` uses for left-padded prompts)."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def token_logprobs(
    model: Any,
    prompt_ids: Int[Tensor, "B P"],
    prompt_mask: Bool[Tensor, "B P"],
    response_ids: Int[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[Float[Tensor, "B T"], Float[Tensor, "B T"] | None]:
    r"""Log-probs :math:`\log\mathrm{softmax}(z_t/\tau)_{y_t}` of the response tokens under ``model``, one forward.

    Gradient flows when called outside ``torch.no_grad``. Only the ``T + 1`` last positions get
    logits (``logits_to_keep``), so the prompt costs no ``V``-sized memory.

    Returns:
        ``(logp [B, T], entropy [B, T] or None)``; both are 0 off the mask.
    """
    t = response_ids.shape[1]
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attn = torch.cat([prompt_mask, mask], dim=1).long()
    out = model(
        input_ids=input_ids, attention_mask=attn, position_ids=_positions(attn), use_cache=False, logits_to_keep=t + 1
    )
    logits = out.logits[:, :-1]  # [B, T, V]: position P-1+t predicts response token t
    logits = (logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits) / temperature
    logp = torch.log_softmax(logits, dim=-1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    logp = torch.where(mask, logp, zero)
    entropy = torch.where(mask, token_entropy(logits), zero) if with_entropy else None
    return logp, entropy


class HFEngine:
    """Rollouts with transformers' ``model.generate`` (batched, KV cache) on the training model itself.

    Sampling noise comes from the global torch RNG inside a ``fork_rng`` seeded with ``seed``, so a
    call is reproducible and leaves the caller's RNG untouched. ``synced_gpus=True`` (an FSDP2-sharded
    model, whose every forward is a collective) keeps each rank stepping until all ranks are done, so
    ranks whose responses end at different lengths do not deadlock (transformers >= 5 also turns it on by
    itself for modules ``fully_shard`` marks; the flag makes it explicit).
    """

    def __init__(
        self,
        model: Any,
        *,
        pad_id: int,
        eos_id: int,
        sampling: SamplingConfig | None = None,
        synced_gpus: bool = False,
    ) -> None:
        self.model = model
        self.pad_id = int(pad_id)
        self.eos_id = int(eos_id)
        self.sampling = sampling or SamplingConfig()
        self.synced_gpus = synced_gpus

    def sync_weights(self, model: Any) -> None:
        """The engine samples from the training model object, so there is nothing to copy."""
        self.model = model

    def generate(self, prompts: Sequence[Sequence[int]], *, n: int, seed: int, greedy: bool = False) -> Rollouts:
        s = self.sampling
        ids, pmask = left_pad(prompts, self.pad_id)
        ids, pmask = ids.repeat_interleave(n, dim=0), pmask.repeat_interleave(n, dim=0)
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        options: dict[str, Any] = (
            {"do_sample": False}
            if greedy
            else {"do_sample": True, "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k or None}
        )
        if self.synced_gpus:
            options["synced_gpus"] = True
        try:
            with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                torch.manual_seed(seed)
                out = self.model.generate(
                    input_ids=ids.to(device),
                    attention_mask=pmask.long().to(device),
                    max_new_tokens=s.max_new_tokens,
                    pad_token_id=self.pad_id,
                    eos_token_id=self.eos_id,
                    return_dict_in_generate=True,
                    output_logits=True,
                    **options,
                )
        finally:
            self.model.train(was_training)
        response = out.sequences[:, ids.shape[1] :]
        logits = torch.stack(out.logits, dim=1).float() / (1.0 if greedy else s.temperature)  # [B, T, V]
        mask = response_mask(response, self.eos_id)
        logp = torch.log_softmax(logits, dim=-1).gather(-1, response.unsqueeze(-1)).squeeze(-1)
        logp = torch.where(mask, logp, torch.zeros((), dtype=logp.dtype, device=logp.device))
        return Rollouts(ids.to(device), pmask.to(device), response, mask, logp, group_size=n)
