"""HFEngine's sampling loop against transformers' ``model.generate`` (the reference), same seed."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.llm.rollout.engine import HFEngine, SamplingConfig, _truncated, left_pad

SAMPLINGS = [
    (SamplingConfig(max_new_tokens=8), False),
    (SamplingConfig(max_new_tokens=8, temperature=0.7), False),
    (SamplingConfig(max_new_tokens=8, temperature=1.3, top_k=5), False),
    (SamplingConfig(max_new_tokens=8, top_p=0.6), False),
    (SamplingConfig(max_new_tokens=8, temperature=0.9, top_k=7, top_p=0.8), False),
    (SamplingConfig(max_new_tokens=8), True),
]


@pytest.mark.parametrize("sampling,greedy", SAMPLINGS)
def test_engine_samples_what_generate_samples(tiny: tuple[Any, Any], sampling: SamplingConfig, greedy: bool) -> None:
    """Same tokens as ``model.generate`` seeded alike; log-probs = log-softmax of its raw logits / tau."""
    model, tok = tiny
    prompts = [tok(p)["input_ids"] for p in ["1+2=", "12+345=", "9="]]  # uneven lengths: left padding
    ids, pmask = left_pad(prompts, tok.pad_token_id)
    ids, pmask = ids.repeat_interleave(4, dim=0), pmask.repeat_interleave(4, dim=0)
    with torch.no_grad():  # <eos> := the greedy first token of a prompt, so some rows stop early
        eos = int(model(input_ids=ids[-1:], attention_mask=pmask[-1:].long()).logits[0, -1].argmax())
    engine = HFEngine(model, pad_id=tok.pad_token_id, eos_id=eos, sampling=sampling)
    rng = torch.get_rng_state()
    ours = engine.generate(prompts, n=4, seed=3, greedy=greedy)
    assert torch.equal(torch.get_rng_state(), rng)  # the global RNG is untouched

    s = sampling
    options: dict[str, Any] = (
        {"do_sample": False}
        if greedy
        else {"do_sample": True, "temperature": s.temperature, "top_k": s.top_k or None, "top_p": s.top_p}
    )
    torch.manual_seed(3)
    with torch.no_grad():
        ref = model.generate(
            input_ids=ids,
            attention_mask=pmask.long(),
            max_new_tokens=s.max_new_tokens,
            pad_token_id=tok.pad_token_id,
            eos_token_id=eos,
            return_dict_in_generate=True,
            output_logits=True,
            **options,
        )
    response = ref.sequences[:, ids.shape[1] :]
    assert torch.equal(ours.response_ids, response)
    assert bool((~ours.mask).any())  # some rows ended at <eos> and were padded
    z = torch.stack(ref.logits, dim=1).float() / (1.0 if greedy else s.temperature)
    logp = torch.log_softmax(z, dim=-1).gather(-1, response.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(ours.logp, torch.where(ours.mask, logp, 0.0), rtol=0, atol=1e-6)
    assert torch.equal(ours.prompt_ids, ids) and torch.equal(ours.prompt_mask, pmask)


@settings(max_examples=40, deadline=None)
@given(
    z=st.lists(st.floats(-5, 5), min_size=2, max_size=12),
    top_p=st.floats(0.05, 0.99),
    top_k=st.integers(0, 14),
)
def test_truncation_keeps_the_smallest_nucleus_within_the_top_k(z: list[float], top_p: float, top_k: int) -> None:
    """Kept set: at most ``top_k`` (plus ties) largest logits; its probability mass reaches ``top_p``,
    and without its least likely member it would not (the nucleus is minimal), all renormalised over the
    top-k survivors."""
    logits = torch.tensor([z], dtype=torch.float64)
    only_k = _truncated(logits, top_k=top_k, top_p=1.0)
    kept = torch.isfinite(_truncated(logits, top_k=top_k, top_p=top_p))[0]
    survivors = torch.isfinite(only_k)[0]
    if top_k:
        kth = torch.sort(logits[0], descending=True).values[min(top_k, len(z)) - 1]
        assert torch.equal(survivors, logits[0] >= kth)
    else:
        assert bool(survivors.all())
    p = only_k.softmax(dim=-1)[0]
    assert bool(kept.any()) and bool((kept <= survivors).all())
    mass = float(p[kept].sum())
    assert mass >= top_p - 1e-9
    assert mass - float(p[kept].min()) < top_p + 1e-9
    # every kept token is at least as likely as every dropped survivor
    dropped = survivors & ~kept
    if bool(dropped.any()):
        assert float(p[kept].min()) >= float(p[dropped].max())


def test_float64_model_behaviour_logp_is_float64_exact(tiny: tuple[Any, Any]) -> None:
    """A float64 model samples and scores in float64: the engine's log-probs equal one full forward's."""
    from posttrain.llm.rollout.logprobs import token_logprobs

    model, tok = tiny
    model = model.double()
    engine = HFEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, sampling=SamplingConfig(6, 0.8))
    r = engine.generate([tok(p)["input_ids"] for p in ["1+2=", "12+345="]], n=3, seed=0)
    assert r.logp.dtype == torch.float64
    with torch.no_grad():
        logp, _ = token_logprobs(model, r.prompt_ids, r.prompt_mask, r.response_ids, r.mask, temperature=0.8)
    torch.testing.assert_close(r.logp, logp, rtol=0, atol=1e-10)
