r"""Log-probs of response tokens under a model, temperature-scaled.

Every log-prob the trainer, the rollout stages and the method fillers recompute goes through here, so
they share one convention: the log-softmax of the temperature-scaled logits over the full
vocabulary, $\log\mathrm{softmax}(z_t/\tau)$, computed in float32 or wider
(`widened`), with position ids that skip left padding (`position_ids`).

With ``group_size`` K (the K samples of a prompt in consecutive rows) each prompt is computed once and
the LM head runs only where a response token is predicted
(`posttrain.llm.rollout.shared_prefix.shared_prompt_forward`); without it, or where sharing cannot
serve (the reason is logged), one forward runs over prompt + response.

The sampled-token log-prob and the entropy (`sampled_logprobs`) never build the
``[B, T, V]`` float32 log-softmax: blocks of at most ``chunk`` positions are widened, and each
gives $\log\pi_t(y_t) = z_{t,y_t}/\tau - \operatorname{logsumexp}_v z_{t,v}/\tau$ and
$H_t = -\sum_v \pi_t(v)\log\pi_t(v)$. Backward
recomputes each block's softmax from the saved logsumexp, so autograd keeps only the logits
themselves (the model's output) and two ``[B, T]`` vectors: the extra memory is one block,
``chunk x V`` float32, whatever ``B x T``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators import zero_off_mask
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.shared_cache import position_ids
from posttrain.llm.rollout.shared_prefix import (
    RowFacts,
    SharedLogits,
    log_fallback,
    note_groups,
    row_facts,
    shared_prompt_forward,
    why_not_shared,
    worth_sharing,
)

__all__ = [
    "CHUNK_POSITIONS",
    "position_ids",
    "response_logits",
    "sampled_logprobs",
    "token_logprobs",
    "vocab_log_softmax",
    "widened",
]

CHUNK_POSITIONS = 256
"""Positions widened at once by `sampled_logprobs` (``256 x 151,936`` float32 is 156 MB)."""


def widened(logits: Tensor) -> Tensor:
    """Half-precision logits (or hidden states) as float32; float32 and float64 ones unchanged (no copy)."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def _blocks(rows: int, length: int, chunk: int) -> Iterator[tuple[slice, slice]]:
    """``(rows, positions)`` slices tiling ``[rows, length]`` with at most ``chunk`` positions each."""
    if length <= chunk:
        step = chunk // max(length, 1)
        for b in range(0, rows, step):
            yield slice(b, min(b + step, rows)), slice(0, length)
    else:
        for b in range(rows):
            for t in range(0, length, chunk):
                yield slice(b, b + 1), slice(t, min(t + chunk, length))


def _scaled_log_softmax(block: Tensor, wide: torch.dtype, tau: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(z, lse [..], lse [.., 1])`` of one block: ``z`` a fresh widened copy scaled by ``1/tau`` (callers may overwrite it)."""
    z = block.to(wide, copy=True)
    if tau != 1.0:
        z.div_(tau)
    lse = torch.logsumexp(z, dim=-1)
    return z, lse, lse.unsqueeze(-1)


class _SampledLogprobs(torch.autograd.Function):
    """``(logp [B, T], entropy [B, T])`` from logits ``[B, L >= T, V]``; backward recomputes each block."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, logits: Tensor, targets: Tensor, temperature: float, chunk: int, entropy_grad: bool
    ) -> tuple[Tensor, Tensor]:
        rows, t = targets.shape
        wide = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
        low = torch.finfo(wide).min
        logp = torch.empty(rows, t, dtype=wide, device=logits.device)
        entropy = torch.empty_like(logp)
        lse = torch.empty_like(logp)
        for rb, tb in _blocks(rows, t, chunk):
            z, block_lse, lse_col = _scaled_log_softmax(logits[rb, tb], wide, temperature)
            lse[rb, tb] = block_lse
            logp[rb, tb] = z.gather(-1, targets[rb, tb].unsqueeze(-1)).squeeze(-1) - block_lse
            logq = z.sub_(lse_col).clamp_(min=low)  # in place: z is not needed any more
            entropy[rb, tb] = -(logq.exp() * logq).sum(-1)  # -inf logits add 0
        ctx.save_for_backward(logits, targets, lse, entropy)
        ctx.temperature, ctx.chunk = temperature, chunk
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, g_logp: Tensor | None, g_ent: Tensor | None) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        logits, targets, lse, entropy = ctx.saved_tensors
        tau = ctx.temperature
        wide = lse.dtype
        low = torch.finfo(wide).min
        grad = torch.zeros_like(logits)  # positions past T (the model's extra last one) get 0
        rows, t = targets.shape
        if g_logp is None:
            g_logp = torch.zeros_like(lse)
        for rb, tb in _blocks(rows, t, ctx.chunk):
            gl = g_logp[rb, tb].unsqueeze(-1)
            z, _, lse_col = _scaled_log_softmax(logits[rb, tb], wide, tau)
            if g_ent is None:  # d logp_y / dz_v = 1[v = y] - p_v
                gz = z.sub_(lse_col).exp_().mul_(gl.neg())
            else:  # and dH/dz_v = -p_v (log p_v + H): gz = -p (g_logp + g_H (log p + H))
                logq = z.sub_(lse_col).clamp_(min=low)
                p = logq.exp()
                gz = logq.add_(entropy[rb, tb].unsqueeze(-1)).mul_(g_ent[rb, tb].unsqueeze(-1)).add_(gl).mul_(p).neg_()
            gz.scatter_add_(-1, targets[rb, tb].unsqueeze(-1), gl)
            if tau != 1.0:
                gz.div_(tau)
            grad[rb, tb] = gz
        return grad, None, None, None, None


def sampled_logprobs(
    logits: Float[Tensor, "B L V"],
    targets: Int[Tensor, "B T"],
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk: int = CHUNK_POSITIONS,
) -> tuple[Float[Tensor, "B T"], Float[Tensor, "B T"] | None]:
    r"""Log-probs $\log\mathrm{softmax}(z_t/\tau)_{y_t}$ of ``targets`` and entropies, in blocks over positions.

    Position ``t < T`` of ``logits`` predicts ``targets[:, t]`` (``L >= T``: later positions are
    ignored and get zero gradient, so the model's output can be passed without slicing a copy).
    Computed in float32 from half-precision logits (float64 stays float64); the extra memory, in
    forward and in backward, is a block of ``chunk`` positions times ``V``, not ``B x T x V``.

    Args:
        logits: ``[B, L, V]`` raw (unscaled) logits, any float dtype.
        targets: ``[B, T]`` token ids, ``T <= L``.
        temperature: $\tau > 0$.
        with_entropy: also return $H_t = -\sum_v \pi_t(v)\log\pi_t(v)$.
        entropy_grad: let gradient flow through the entropy (only when it is in the loss; a logged
            entropy is detached).
        chunk: positions per block, positive.

    Returns:
        ``(logp [B, T], entropy [B, T] or None)``.
    """
    if (
        logits.ndim != 3
        or targets.ndim != 2
        or targets.shape[0] != logits.shape[0]
        or targets.shape[1] > logits.shape[1]
    ):
        raise ShapeError(
            f"logits, targets: expected [B, L, V] and [B, T] with T <= L, got {tuple(logits.shape)} and {tuple(targets.shape)}"
        )
    if not logits.is_floating_point():
        raise DomainError(f"logits: expected a float tensor, got {logits.dtype}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise DomainError(f"chunk: expected a positive integer, got {chunk!r}")
    if not temperature > 0:
        raise DomainError(f"temperature: expected > 0, got {temperature!r}")
    logp, entropy = _SampledLogprobs.apply(logits, targets.long(), float(temperature), chunk, entropy_grad)
    if not (with_entropy and entropy_grad):
        entropy = entropy.detach()
    return logp, entropy if with_entropy else None


def _model_logits(
    model: Any, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, mask: Tensor
) -> Float[Tensor, "B T+1 V"]:
    """The model's raw logits at the ``T + 1`` last positions (``logits_to_keep``); position ``t < T`` predicts token ``t``."""
    t = response_ids.shape[1]
    input_ids = torch.cat([prompt_ids, response_ids], dim=1)
    attn = torch.cat([prompt_mask, mask], dim=1).long()
    out = model(
        input_ids=input_ids, attention_mask=attn, position_ids=position_ids(attn), use_cache=False, logits_to_keep=t + 1
    )
    return out.logits


def _shared(
    model: Any, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, mask: Tensor, group_size: int | None
) -> SharedLogits | None:
    """The prompt-shared logits (`shared_prompt_forward`), or None where they cannot serve (reason logged); the
    path taken is noted for `posttrain.llm.rollout.shared_prefix.recorded_groups`."""
    if group_size is None:
        return None
    facts = row_facts(model, prompt_ids, prompt_mask, mask, group_size=group_size)  # one host sync
    shared = _shared_or_none(model, prompt_ids, prompt_mask, response_ids, mask, group_size, facts)
    note_groups(prompt_ids.shape[0] // group_size, shared=shared is not None)
    return shared


def _shared_or_none(
    model: Any,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    response_ids: Tensor,
    mask: Tensor,
    group_size: int,
    facts: RowFacts,
) -> SharedLogits | None:
    """`_shared` once the batch's `RowFacts` are read."""
    reason = why_not_shared(model, prompt_ids, prompt_mask, group_size=group_size, facts=facts)
    if reason is None and not worth_sharing(model, facts, group_size=group_size):
        return None  # the prompts cost less than the extra forward call: not a fallback
    if reason is None:
        try:
            return shared_prompt_forward(
                model, prompt_ids, prompt_mask, response_ids, mask, group_size=group_size, facts=facts
            )
        except RuntimeError as exc:
            reason = str(exc)
    if group_size > 1:
        log_fallback(reason)
    return None


def _shared_logprobs(
    shared: SharedLogits, response_ids: Tensor, options: dict[str, Any]
) -> tuple[Tensor, Tensor | None]:
    """`sampled_logprobs` of each pass of `shared_prompt_forward`, placed at their ``[B, T]`` positions (0 elsewhere)."""
    b, k = response_ids.shape[0], shared.group_size
    logp0, ent0 = sampled_logprobs(shared.first_per_row(), response_ids[:, 0].reshape(b // k, k), **options)
    logp = logp0.new_zeros(response_ids.shape)
    entropy = None if ent0 is None else logp0.new_zeros(response_ids.shape)
    logp[:, 0] = logp0.reshape(b)
    if entropy is not None and ent0 is not None:
        entropy[:, 0] = ent0.reshape(b)
    for c in shared.chunks:
        n = c.logits.shape[1]
        if n == 0:
            continue
        cols = slice(c.start + 1, c.start + 1 + n)
        rows = slice(None) if c.rows is None else c.rows
        lp, ent = sampled_logprobs(c.logits, response_ids[rows, cols], **options)
        logp[rows, cols] = lp
        if entropy is not None and ent is not None:
            entropy[rows, cols] = ent
    return shared.tie(logp), entropy


def _padded(x: Tensor, width: int) -> Tensor:
    """``x [B, S, ...]`` with zero columns appended up to ``width``."""
    if x.shape[1] == width:
        return x
    return torch.cat([x, x.new_zeros(x.shape[0], width - x.shape[1], *x.shape[2:])], dim=1)


def response_logits(
    model: Any,
    prompt_ids: Int[Tensor, "B P"],
    prompt_mask: Bool[Tensor, "B P"],
    response_ids: Int[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    temperature: float = 1.0,
    group_size: int | None = None,
) -> Float[Tensor, "B T V"]:
    r"""Temperature-scaled logits $z_t/\tau$ predicting each response token (float32 or wider), one forward.

    Only the positions predicting response tokens get logits, so the prompt costs no ``V``-sized
    memory; gradient flows when called outside ``torch.no_grad``. With ``group_size`` K (rows
    ``g*K .. g*K+K-1`` share a prompt) each prompt is computed once (`shared_prompt_forward`; the
    trailing columns off every row's mask are then 0).
    """
    shared = _shared(model, prompt_ids, prompt_mask, response_ids, mask, group_size)
    if shared is not None:
        logits = _padded(shared.full(), response_ids.shape[1])
    else:
        logits = _model_logits(model, prompt_ids, prompt_mask, response_ids, mask)[:, :-1]
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
    entropy_grad: bool = False,
    group_size: int | None = None,
) -> tuple[Float[Tensor, "B T"], Float[Tensor, "B T"] | None]:
    r"""Log-probs $\log\mathrm{softmax}(z_t/\tau)_{y_t}$ of the response tokens under ``model``.

    Gradient flows into ``logp`` when called outside ``torch.no_grad``, into the entropy only with
    ``entropy_grad`` (when it is in the loss). Only the positions predicting response tokens get
    logits, and the log-softmax is never built over ``[B, T, V]`` (see `sampled_logprobs`).

    With ``group_size`` K (the K samples of prompt g in rows ``g*K .. g*K+K-1``), each prompt runs once
    and the K samples run on its shared KV cache (`shared_prompt_forward`): the same values and
    gradients up to float rounding, for about ``P / (P + T)`` less work. Where sharing cannot serve
    (`why_not_shared`) one forward runs over prompt + response, and the reason is logged; where the
    prompts cost less than the extra forward call (`worth_sharing`, a tiny model) too, without a log.
    None: the unshared forward.

    Returns:
        ``(logp [B, T], entropy [B, T] or None)``; both are 0 off the mask.
    """
    shared = _shared(model, prompt_ids, prompt_mask, response_ids, mask, group_size)
    options: dict[str, Any] = {"temperature": temperature, "with_entropy": with_entropy, "entropy_grad": entropy_grad}
    if shared is None:
        logits = _model_logits(model, prompt_ids, prompt_mask, response_ids, mask)
        logp, entropy = sampled_logprobs(logits, response_ids, **options)
    else:
        logp, entropy = _shared_logprobs(shared, response_ids, options)
    logp = zero_off_mask(logp, mask)
    entropy = zero_off_mask(entropy, mask) if entropy is not None else None
    return logp, entropy


def vocab_log_softmax(model: Any, batch: RolloutBatch, *, temperature: float) -> Float[Tensor, "B T V"]:
    """Full-vocabulary log-probs $\\log\\mathrm{softmax}(z_t/\\tau)$ at every response position, each prompt
    computed once per group (`response_logits` with ``batch.group_size``)."""
    logits = response_logits(
        model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask, temperature=temperature,
        group_size=batch.group_size,
    )  # fmt: skip
    return torch.log_softmax(logits, dim=-1)
