"""Chunked sampled-token log-probs and entropy against the plain float64 log-softmax path."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from posttrain.errors import DomainError, ShapeError
from posttrain.llm.rollout.logprobs import sampled_logprobs, token_logprobs


def _plain(logits: torch.Tensor, targets: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: full log-softmax in float64 over [B, T, V], first T positions."""
    z = logits[:, : targets.shape[1]].double() / tau
    logq = torch.log_softmax(z, dim=-1)
    logp = logq.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp, -(logq.exp() * logq).sum(-1)


def _case(dtype: torch.dtype, *, b: int = 3, length: int = 9, t: int = 8, v: int = 1000, seed: int = 0) -> Any:
    g = torch.Generator().manual_seed(seed)
    logits = (3.0 * torch.randn(b, length, v, generator=g)).to(dtype).requires_grad_(True)
    targets = torch.randint(0, v, (b, t), generator=g)
    weights = torch.randn(b, t, generator=g, dtype=torch.float64)
    return logits, targets, weights


@pytest.mark.parametrize("chunk", [1, 5, 8, 20, 1000])  # blocks smaller than T, a row, several rows, everything
@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_fp32_value_and_gradient_match_float64_plain(chunk: int, tau: float) -> None:
    logits, targets, w = _case(torch.float32)
    logp, ent = sampled_logprobs(logits, targets, temperature=tau, with_entropy=True, entropy_grad=True, chunk=chunk)
    wide = logits.detach().double().requires_grad_(True)  # the reference's gradient is not rounded to float32
    ref_logp, ref_ent = _plain(wide, targets, tau)
    assert logp.dtype == torch.float32 and ent is not None
    torch.testing.assert_close(logp.double(), ref_logp.detach(), rtol=0, atol=2e-6)
    torch.testing.assert_close(ent.double(), ref_ent.detach(), rtol=0, atol=2e-6)
    (g_ours,) = torch.autograd.grad((logp.double() * w).sum() + (ent.double() * w.flip(0)).sum(), logits)
    (g_ref,) = torch.autograd.grad((ref_logp * w).sum() + (ref_ent * w.flip(0)).sum(), wide)
    assert g_ours.dtype == torch.float32
    torch.testing.assert_close(g_ours.double(), g_ref, rtol=1e-6, atol=1e-6)
    assert float(g_ours[:, 8:].abs().max()) == 0.0  # the extra last position gets no gradient


def test_float64_logits_stay_float64_and_match_to_1e12() -> None:
    logits, targets, w = _case(torch.float64)
    logp, _ = sampled_logprobs(logits, targets, chunk=7)
    ref, _ = _plain(logits, targets, 1.0)
    assert logp.dtype == torch.float64
    torch.testing.assert_close(logp, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(
        torch.autograd.grad((logp * w).sum(), logits)[0],
        torch.autograd.grad((ref * w).sum(), logits)[0],
        rtol=0,
        atol=1e-12,
    )


def test_bf16_logits_within_stated_tolerance() -> None:
    """bf16 logits are widened exactly, so only float32 rounding is left: same bound as float32 logits."""
    logits, targets, w = _case(torch.bfloat16)
    logp, ent = sampled_logprobs(logits, targets, with_entropy=True, chunk=4)
    wide = logits.detach().double().requires_grad_(True)  # the same bf16 values, exactly
    ref_logp, ref_ent = _plain(wide, targets, 1.0)
    assert logp.dtype == torch.float32 and ent is not None
    torch.testing.assert_close(logp.double(), ref_logp.detach(), rtol=0, atol=2e-6)
    torch.testing.assert_close(ent.double(), ref_ent.detach(), rtol=0, atol=2e-6)
    (g,) = torch.autograd.grad((logp.double() * w).sum(), logits)
    (g_ref,) = torch.autograd.grad((ref_logp * w).sum(), wide)
    assert g.dtype == torch.bfloat16  # the gradient is rounded to the logits' dtype: bf16 relative error 2^-8
    torch.testing.assert_close(g.double(), g_ref, rtol=2**-8, atol=1e-6)


def test_logged_entropy_carries_no_gradient() -> None:
    logits, targets, _ = _case(torch.float32)
    logp, ent = sampled_logprobs(logits, targets, with_entropy=True)
    assert ent is not None and not ent.requires_grad and logp.requires_grad
    _, ent_grad = sampled_logprobs(logits, targets, with_entropy=True, entropy_grad=True)
    assert ent_grad is not None and ent_grad.requires_grad
    (g,) = torch.autograd.grad(ent_grad.sum(), logits)
    assert float(g.abs().max()) > 0


def test_masked_vocabulary_entries_add_nothing() -> None:
    logits, targets, _ = _case(torch.float32, v=50)
    masked = logits.detach().clone()
    masked[..., 40:] = float("-inf")
    targets = targets % 40
    logp, ent = sampled_logprobs(masked.requires_grad_(True), targets, with_entropy=True, entropy_grad=True, chunk=3)
    ref_logp, _ = _plain(masked[..., :40], targets, 1.0)
    assert ent is not None and bool(torch.isfinite(ent).all())
    torch.testing.assert_close(logp.double(), ref_logp.detach(), rtol=0, atol=2e-6)
    (g,) = torch.autograd.grad(logp.sum() + ent.sum(), masked)
    assert bool(torch.isfinite(g).all()) and float(g[..., 40:].abs().max()) == 0.0


def test_bad_input_raises() -> None:
    logits, targets, _ = _case(torch.float32)
    with pytest.raises(ShapeError, match="logits"):
        sampled_logprobs(logits[:, :4], targets)
    with pytest.raises(DomainError, match="chunk"):
        sampled_logprobs(logits, targets, chunk=0)
    with pytest.raises(DomainError, match="temperature"):
        sampled_logprobs(logits, targets, temperature=0.0)


def test_token_logprobs_matches_the_plain_path_on_the_tiny_model(tiny: tuple[Any, Any]) -> None:
    model, _ = tiny
    model = model.double()
    g = torch.Generator().manual_seed(1)
    v = model.config.vocab_size
    prompt, response = torch.randint(4, v, (2, 5), generator=g), torch.randint(4, v, (2, 6), generator=g)
    pmask = torch.ones_like(prompt, dtype=torch.bool)
    pmask[0, :2] = False
    mask = torch.ones_like(response, dtype=torch.bool)
    mask[1, 4:] = False
    logp, ent = token_logprobs(model, prompt, pmask, response, mask, temperature=0.8, with_entropy=True)
    attn = torch.cat([pmask, mask], 1).long()
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    z = model(input_ids=torch.cat([prompt, response], 1), attention_mask=attn, position_ids=pos).logits[:, 4:-1] / 0.8
    ref = torch.log_softmax(z, -1).gather(-1, response.unsqueeze(-1)).squeeze(-1)
    ref_ent = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    assert ent is not None
    torch.testing.assert_close(logp, torch.where(mask, ref, 0.0), rtol=0, atol=1e-10)
    torch.testing.assert_close(ent, torch.where(mask, ref_ent, 0.0).detach(), rtol=0, atol=1e-10)
    assert float(logp.detach()[1, 4:].abs().max()) == 0.0
