"""HFEngine passes its KV cache under the keyword the model's forward names: no deprecation warning."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch

from posttrain.llm.rollout.engine import HFEngine, SamplingConfig, _cache_keyword


def test_cache_keyword_follows_the_forward_signature(tiny: tuple[Any, Any]) -> None:
    model, _ = tiny
    params = inspect.signature(type(model).forward).parameters
    assert _cache_keyword(model) == ("cache" if "cache" in params else "past_key_values")

    class Old(torch.nn.Module):  # an older transformers' forward
        def forward(self, input_ids: Any = None, past_key_values: Any = None, **kwargs: Any) -> None: ...

    assert _cache_keyword(Old()) == "past_key_values"


def test_no_future_warning_and_same_tokens_as_generate(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    prompts = [tok(p)["input_ids"] for p in ["1+2=", "12+345="]]
    engine = HFEngine(
        model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, sampling=SamplingConfig(max_new_tokens=6)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # transformers' "past_key_values is deprecated" is one
        warnings.simplefilter("error", DeprecationWarning)
        ours = engine.generate(prompts, n=2, seed=5, greedy=True)
    ids = torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(p[::-1]) for p in prompts for _ in range(2)], batch_first=True, padding_value=tok.pad_token_id
    ).flip(1)
    attn = (ids != tok.pad_token_id).long()
    with torch.no_grad():
        ref = model.generate(
            input_ids=ids, attention_mask=attn, max_new_tokens=6, do_sample=False,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        )  # fmt: skip
    assert torch.equal(ours.response_ids, ref[:, ids.shape[1] :])
