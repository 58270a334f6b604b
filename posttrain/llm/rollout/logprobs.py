r"""Log-probs of response tokens under a model: one forward over prompt + response, temperature-scaled.

Every log-prob the trainer, the rollout stages and the method fillers recompute goes through here, so
they share one convention: the log-softmax of the temperature-scaled logits over the full
vocabulary, :math:`\log\mathrm{softmax}(z_t/\tau)`, computed in float32 or wider
(:func:`widened`), with position ids that skip left padding (:func:`position_ids`).
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from posttrain.estimators import token_entropy
from posttrain.llm.rollout.batch import RolloutBatch

__all__ = ["position_ids", "response_logits", "token_logprobs", "vocab_log_softmax", "widened"]


def position_ids(attention_mask: Tensor) -> Tensor:
    """Position ids that skip left padding (what ``generate`` uses for left-padded prompts)."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def widened(logits: Tensor) -> Tensor:
    """Half-precision logits (or hidden states) as float32; float32 and float64 ones unchanged (no copy)."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def response_logits(
    model: Any,
    prompt_ids: Int[Tensor, "B P"],
    prompt_mask: Bool[Tensor, "B P"],
    response_ids: Int[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    temperature: float = 1.0,
) -> Float[Tensor, "B T V"]:
    r"""Temperature-scaled logits :math:`z_t/\tau` predicting each response token (float32 or wider), one forward.

    Only the ``T + 1`` last positions get logits (``logits_to_keep``), so the prompt costs no
    ``V``-sized memory; gradient flows when called outside ``torch.no_grad``.
    """
    t = response_ids.shape[1]
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attn = torch.cat([prompt_mask, mask], dim=1).long()
    out = model(
        input_ids=input_ids, attention_mask=attn, position_ids=position_ids(attn), use_cache=False, logits_to_keep=t + 1
    )
    logits = out.logits[:, :-1]  # [B, T, V]: position P-1+t predicts response token t
    return widened(logits) / temperature


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
    logits = response_logits(model, prompt_ids, prompt_mask, response_ids, mask, temperature=temperature)
    logp = torch.log_softmax(logits, dim=-1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    logp = torch.where(mask, logp, zero)
    entropy = torch.where(mask, token_entropy(logits), zero) if with_entropy else None
    return logp, entropy


def vocab_log_softmax(model: Any, batch: RolloutBatch, *, temperature: float) -> Float[Tensor, "B T V"]:
    """Full-vocabulary log-probs :math:`\\log\\mathrm{softmax}(z_t/\\tau)` at every response position, one forward."""
    logits = response_logits(
        model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask, temperature=temperature
    )
    return torch.log_softmax(logits, dim=-1)
