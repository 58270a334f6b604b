"""The prompt-shared training forward on SmolLM2-135M-Instruct (30 layers, vocabulary 49,152).

4 chat prompts of different lengths (34 to 48 tokens: left padding) x 2 samples, 12 response tokens of ragged
lengths. Errors: max abs log-prob difference; gradients: the largest difference of a tensor relative to its
largest entry.

- float64 with the RMS norms in float64 too (`exact_norms`): the shared forward equals the unshared one to 1e-10
  (measured 1.1e-13 log-probs, 8.1e-14 gradients). With transformers' norms, which compute in float32 in a
  float64 model (forward and backward), the two agree only to float32 rounding (1.4e-6 measured on gradients):
  the shared forward sums a group's K gradients at the prompt before the norm's float32 backward rounds them.
- float32 and bfloat16 against that float64 truth, shared vs unshared: float32 2.6e-5 vs 2.9e-5 (log-probs),
  3.4e-5 vs 2.9e-5 (gradients); bfloat16 0.34 vs 0.29 and 0.42 vs 0.36. Bounds: float32 2x the unshared error,
  bfloat16 1.5x (an error of the shared forward itself is of order 1).

With fewer than 4 groups the first response token's LM-head backward is a ``[G, V] x [V, d]`` product with
G < 4 rows, for which this CPU's BLAS accumulates each 49,152-term sum with ~10x the rounding of the GEMM the
unshared forward's ``[B (T + 1), V]`` product uses (1.1e-5 vs 1.1e-6 relative, measured on random data): 2
prompts x 4 samples measured 1.9e-4 vs 2.0e-5 on float32 gradients. A BLAS property, not a sharing error (float64
agrees to 1e-13 there too), so the bounds are tested at G = 4.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.llm.rollout.test_shared_prefix import EXACT, exact_norms, forward_backward, relative

pytestmark = [pytest.mark.slow, pytest.mark.llm]
pytest.importorskip("transformers", reason="needs the [llm] extra")
K = 2
PROMPTS = [
    "What is 3+4? Answer briefly.",
    "Name a prime number larger than 10, please.",
    "Spell cat.",
    "Is 91 prime? Say yes or no, then why in one short sentence.",
]


@pytest.fixture(scope="module")
def smollm2() -> tuple[Path, Any]:
    from transformers import AutoTokenizer

    from posttrain.llm.tools.models import resolve_model_path

    path = resolve_model_path("smollm2-135m-instruct")
    if path is None or not Path(path).is_dir():
        pytest.skip("SmolLM2-135M-Instruct is not prepared (posttrain models prepare smollm2-135m-instruct)")
    return Path(path), AutoTokenizer.from_pretrained(path)


def _batch(tok: Any) -> tuple[torch.Tensor, ...]:
    from posttrain.llm.rollout.engine import left_pad
    from posttrain.llm.rollout.text import encode_prompts

    ids, pm = left_pad(encode_prompts(tok, PROMPTS, chat_template=True), int(tok.pad_token_id))
    ids, pm = ids.repeat_interleave(K, 0), pm.repeat_interleave(K, 0)
    g = torch.Generator().manual_seed(0)
    resp = torch.randint(0, 49152, (ids.shape[0], 12), generator=g)
    lengths = torch.randint(2, 13, (ids.shape[0],), generator=g)
    return ids, pm, resp, torch.arange(12) < lengths[:, None]


def _errors(got: tuple[Any, ...], truth: tuple[Any, ...]) -> tuple[float, float]:
    return float((got[0] - truth[0]).abs().max()), relative(got[2], truth[2])


def test_float64_equal_and_low_precision_as_accurate(smollm2: tuple[Path, Any]) -> None:
    from transformers import AutoModelForCausalLM

    path, tok = smollm2
    batch = _batch(tok)
    assert len(set(batch[1].sum(1).tolist())) == len(PROMPTS)  # prompts of different lengths
    exact = exact_norms(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)).train()
    truth = forward_backward(exact, batch, None)
    shared64 = forward_backward(exact, batch, K)
    del exact
    torch.testing.assert_close(shared64[0], truth[0], rtol=0, atol=EXACT)
    torch.testing.assert_close(shared64[1], truth[1], rtol=0, atol=EXACT)
    assert relative(shared64[2], truth[2]) <= EXACT
    for dtype, factor in ((torch.float32, 2.0), (torch.bfloat16, 1.5)):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).train()
        shared = _errors(forward_backward(model, batch, K), truth)
        plain = _errors(forward_backward(model, batch, None), truth)
        assert shared[0] <= factor * plain[0] and shared[1] <= factor * plain[1], (dtype, shared, plain)
