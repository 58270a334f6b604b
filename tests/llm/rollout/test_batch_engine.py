"""tiny model + tokenizer, RolloutBatch validation, HF engine log-probs vs recomputation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from posttrain.errors import DomainError, ShapeError
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.engine import HFEngine, RolloutEngine, SamplingConfig, response_mask
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.tools.tiny import ALPHABET, TinyConfig, build_tiny

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")


def test_tiny_roundtrip_through_auto_classes(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    ids = tok(ALPHABET)["input_ids"]
    assert ids == list(range(4, 4 + len(ALPHABET)))  # one token per character, no specials added
    assert tok.decode(ids) == ALPHABET
    assert model.config.hidden_size // model.config.num_attention_heads == 32  # vLLM CPU needs head_dim 32
    assert model.config.vocab_size == len(tok)


def test_tiny_llama_arch_and_seed(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(build_tiny(tmp_path / "a", TinyConfig(arch="llama"), seed=3))
    b = AutoModelForCausalLM.from_pretrained(build_tiny(tmp_path / "b", TinyConfig(arch="llama"), seed=3))
    assert type(a).__name__ == "LlamaForCausalLM"
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    with pytest.raises(DomainError, match="arch"):
        build_tiny(tmp_path / "c", TinyConfig(arch="gpt9"))


def _batch(**over: Any) -> RolloutBatch:
    fields: dict[str, Any] = dict(
        prompt_ids=torch.ones(4, 3, dtype=torch.long),
        prompt_mask=torch.ones(4, 3, dtype=torch.bool),
        response_ids=torch.ones(4, 2, dtype=torch.long),
        mask=torch.tensor([[True, True], [True, False], [True, True], [True, False]]),
        rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]),
        group_size=2,
    )
    fields.update(over)
    return RolloutBatch(**fields)


def test_rollout_batch_validation() -> None:
    b = _batch(logp_old=torch.full((4, 2), -1.0))
    assert b.grouped_rewards().tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert b.rows(2, 4).rewards.tolist() == [0.0, 1.0]
    # NaN off the mask is fine, on the mask it is not
    ok = torch.tensor([[-1.0, -1.0], [-1.0, float("nan")], [-1.0, -1.0], [-1.0, float("nan")]])
    _batch(logp_old=ok)
    with pytest.raises(DomainError, match="logp_old"):
        _batch(logp_old=ok.flip(1))
    with pytest.raises(ShapeError, match="group_size"):
        _batch(group_size=3)
    with pytest.raises(ShapeError, match="rewards"):
        _batch(rewards=torch.zeros(3))
    with pytest.raises(ShapeError, match="mask"):
        _batch(mask=torch.ones(4, 2))
    with pytest.raises(ShapeError, match="logp_ref"):
        _batch(logp_ref=torch.zeros(4, 3))
    with pytest.raises(ShapeError, match="response_ids"):
        _batch(response_ids=torch.ones(4, 2))
    with pytest.raises(DomainError, match="rows"):
        b.rows(1, 3)
    with pytest.raises(DomainError, match="prompt_mask"):
        _batch(prompt_mask=torch.zeros(4, 3, dtype=torch.bool))
    ctx_ids, ctx_mask = torch.ones(4, 5, dtype=torch.long), torch.ones(4, 5, dtype=torch.bool)
    assert _batch(context_ids=ctx_ids, context_mask=ctx_mask).rows(0, 2).context_ids.shape == (2, 5)
    with pytest.raises(DomainError, match="context_ids, context_mask"):
        _batch(context_ids=ctx_ids)
    with pytest.raises(ShapeError, match="context_ids"):
        _batch(context_ids=ctx_ids[:3], context_mask=ctx_mask[:3])
    with pytest.raises(ShapeError, match="context_mask"):
        _batch(context_ids=ctx_ids, context_mask=ctx_mask[:, :4])
    with pytest.raises(DomainError, match="context_mask"):
        _batch(context_ids=ctx_ids, context_mask=torch.zeros(4, 5, dtype=torch.bool))


def test_response_mask_stops_after_first_eos() -> None:
    ids = torch.tensor([[3, 3, 5], [5, 5, 5], [5, 3, 5]])
    assert response_mask(ids, eos_id=3).tolist() == [[True, False, False], [True, True, True], [True, True, False]]


def test_hf_engine_logp_equals_recomputation(tiny: tuple[Any, Any]) -> None:
    """Behaviour log-probs from generate (KV cache, left padding) == one full forward, float32."""
    model, tok = tiny
    engine = HFEngine(
        model,
        pad_id=tok.pad_token_id,
        eos_id=tok.eos_token_id,
        sampling=SamplingConfig(max_new_tokens=6, temperature=0.7),
    )
    assert isinstance(engine, RolloutEngine)
    prompts = [tok(p)["input_ids"] for p in ["1+2=", "12+345=", "9="]]
    r = engine.generate(prompts, n=3, seed=5)
    assert r.response_ids.shape[0] == 9 and r.group_size == 3
    assert torch.equal(r.prompt_ids[0], r.prompt_ids[2]) and not torch.equal(r.prompt_ids[0], r.prompt_ids[3])
    again = engine.generate(prompts, n=3, seed=5)
    assert torch.equal(r.response_ids, again.response_ids)  # same seed, same samples
    with torch.no_grad():
        logp, entropy = token_logprobs(
            model, r.prompt_ids, r.prompt_mask, r.response_ids, r.mask, temperature=0.7, with_entropy=True
        )
    torch.testing.assert_close(logp, r.logp, rtol=0, atol=1e-5)  # float32 KV-cache vs full forward
    assert entropy is not None and bool((entropy[r.mask] > 0).all())
    # greedy picks the argmax: its log-prob is the max over the vocabulary
    g = engine.generate(prompts, n=1, seed=0, greedy=True)
    with torch.no_grad():
        out = model(
            input_ids=torch.cat([g.prompt_ids, g.response_ids[:, :1]], 1),
            attention_mask=torch.cat([g.prompt_mask, g.mask[:, :1]], 1).long(),
            position_ids=(torch.cat([g.prompt_mask, g.mask[:, :1]], 1).long().cumsum(1) - 1).clamp(min=0),
        )
    assert torch.equal(out.logits[:, -2].argmax(-1), g.response_ids[:, 0])
