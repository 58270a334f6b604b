"""HFEngine prefills each prompt once and repeats its KV cache to the K samples: the same tokens and log-probs
as the engine that repeated the prompts K times before the prefill.

``data/hf_engine_tiny.json`` and ``data/hf_engine_smollm2.json`` hold that engine's outputs, recorded with
it (4 uneven prompts x 4 samples on the tiny model of ``build_tiny(seed=0)``, ``<eos>`` the greedy first
token of ``9=`` so that rows end early and leave the batch; 2 chat prompts x 4 samples on the prepared
SmolLM2-135M-Instruct), one torch thread. Tokens must be identical; log-probs agree to the float rounding of
a prefill over G rows instead of B: measured 0 on the tiny model (float32, bfloat16, float64), 1.3e-5 on
SmolLM2 in float32 and 0 in bfloat16. The tolerances allow for another CPU's rounding: float32 4x the
SmolLM2 measurement, bfloat16 one rounding of a logit near 4 (0.02). (Recorded outputs are CPU-specific at
that level; ``test_engine.py`` compares the engine with ``model.generate`` on repeated prompts in the same run.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from posttrain.llm.rollout.engine import HFEngine, SamplingConfig

DATA = Path(__file__).parent / "data"
TINY = json.loads((DATA / "hf_engine_tiny.json").read_text())
SAMPLINGS = {
    "t1": ({"max_new_tokens": 8}, False),
    "t07": ({"max_new_tokens": 8, "temperature": 0.7}, False),
    "topk_topp": ({"max_new_tokens": 8, "temperature": 0.9, "top_k": 7, "top_p": 0.8}, False),
    "greedy": ({"max_new_tokens": 8}, True),
    "bf16": ({"max_new_tokens": 8}, False),
    "f64": ({"max_new_tokens": 8, "temperature": 0.8}, False),
}
DTYPES = {"bf16": torch.bfloat16, "f64": torch.float64}
LOGP_ATOL = {torch.float32: 5e-5, torch.float64: 1e-12, torch.bfloat16: 2e-2}


def _check(got: Any, want: dict[str, Any], atol: float) -> None:
    assert got.response_ids.tolist() == want["response_ids"]
    assert got.mask.tolist() == want["mask"]
    torch.testing.assert_close(got.logp.double(), torch.tensor(want["logp"], dtype=torch.float64), rtol=0, atol=atol)


@pytest.mark.parametrize("name", sorted(SAMPLINGS))
@pytest.mark.parametrize("every", [1, 3])
def test_same_tokens_and_logprobs_as_the_repeated_prefill(tiny: tuple[Any, Any], name: str, every: int) -> None:
    model, tok = tiny
    dtype = DTYPES.get(name, torch.float32)
    model = model.to(dtype)
    kwargs, greedy = SAMPLINGS[name]
    engine = HFEngine(
        model, pad_id=tok.pad_token_id, eos_id=TINY["eos_id"], sampling=SamplingConfig(**kwargs),
        stop_check_every=every,
    )  # fmt: skip
    prompts = [tok(p)["input_ids"] for p in TINY["prompts"]]
    with torch.random.fork_rng(devices=[]):
        torch.set_num_threads(1)
        got = engine.generate(prompts, n=TINY["n"], seed=TINY["seed"], greedy=greedy)
    want = TINY["outputs"][f"{name}/every{every}"]
    assert got.prompt_ids.tolist() == want["prompt_ids"] and got.prompt_mask.tolist() == want["prompt_mask"]
    _check(got, want, LOGP_ATOL[dtype])


@pytest.mark.slow
@pytest.mark.llm
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_smollm2_same_tokens_and_logprobs_as_the_repeated_prefill(dtype: str) -> None:
    from posttrain.llm.rollout.text import encode_prompts
    from posttrain.llm.tools.models import resolve_model_path

    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path("smollm2-135m-instruct")
    if path is None or not Path(path).is_dir():
        pytest.skip("SmolLM2-135M-Instruct is not prepared (posttrain models prepare smollm2-135m-instruct)")
    ref = json.loads((DATA / "hf_engine_smollm2.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    tok = AutoTokenizer.from_pretrained(path)
    prompts = encode_prompts(tok, ref["prompts"], chat_template=ref["chat_template"], system=None)
    engine = HFEngine(
        model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id,
        sampling=SamplingConfig(max_new_tokens=ref["max_new_tokens"]),
    )  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got = engine.generate(prompts, n=ref["n"], seed=ref["seed"])
    finally:
        torch.set_num_threads(threads)
    _check(got, ref["outputs"][dtype], LOGP_ATOL[getattr(torch, dtype)])
