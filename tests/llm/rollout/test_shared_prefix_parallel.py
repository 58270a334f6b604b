"""The prompt-shared training forward under data parallel: 2 gloo processes (DDP or FSDP2), each with micro-batches
of one group, give the gradients of one process running the unshared forward on the whole batch (float64 with
float64 norms: agreement to 1e-10 relative).

Under FSDP2 every forward is a collective, so ranks must agree on the number of forwards: a rank whose responses
are all one token long still runs the response pass, and a group that cannot share on one rank makes every rank
fall back (a mismatch would hang; `_spawn` fails the test after its timeout)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posttrain.llm.rollout import shared_prefix
from posttrain.llm.rollout.logprobs import token_logprobs
from tests.llm.rollout.test_shared_prefix import EXACT, PROMPTS, f64, relative, rollout
from tests.llm.train.test_parallel import _spawn

pytestmark = pytest.mark.slow
K = 2


def _weights(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def _batch(tiny_dir: Path, variant: str) -> tuple[torch.Tensor, ...]:
    """The global batch: 4 groups of 2 (``K = 2``, rows of 1 to 6 tokens); ``one_token``: rank 0's responses are one token long; ``differ``: a
    sample of rank 1's last group has another prompt."""
    from transformers import AutoTokenizer

    ids, pm, resp, mask = rollout(AutoTokenizer.from_pretrained(tiny_dir), PROMPTS, K, 7)
    if variant == "one_token":
        mask = mask.clone()
        mask[:4, 1:] = False
    if variant == "differ":
        ids = ids.clone()
        ids[-1, -1] = 9
    return ids, pm, resp, mask


def _worker(rank: int, tiny_dir: str, out: str, strategy: str, variant: str) -> None:
    from posttrain.llm.train.parallel import full_tensor, gradient_sync, wrap_model

    shared_prefix.SHARE_MIN_FLOPS = 0.0  # share the tiny model's prompts too
    if variant == "chunked":  # response passes split at every row end (under DDP; FSDP2 runs one)
        shared_prefix.CHUNK_OVERHEAD_FLOPS, shared_prefix.CHUNK_OVERHEAD_SHARE = 0.0, {"cpu": 0.0}
    model = f64(Path(tiny_dir))
    wrapped = wrap_model(model, strategy)
    batch = _batch(Path(tiny_dir), variant)
    w = _weights(tuple(batch[2].shape))
    share = batch[0].shape[0] // 2
    mine = slice(rank * share, (rank + 1) * share)
    reasons = []
    for i, start in enumerate(range(mine.start, mine.stop, K)):  # micro-batches of one group
        part = [x[start : start + K] for x in batch]
        reasons.append(shared_prefix.why_not_shared(wrapped, *part[:2], group_size=K))
        with gradient_sync(wrapped, i == share // K - 1):
            logp, _ = token_logprobs(wrapped, *part, group_size=K)
            (logp * w[start : start + K]).sum().backward()
    grads = [full_tensor(p.grad).detach().clone() for p in model.parameters()]  # type: ignore[arg-type]
    torch.save({"grads": grads, "reasons": reasons}, f"{out}.{rank}")


CASES = [("ddp", "plain"), ("ddp", "chunked"), ("fsdp", "plain"), ("fsdp", "chunked"), ("fsdp", "one_token"),
         ("fsdp", "differ")]  # fmt: skip


@pytest.mark.parametrize("strategy,variant", CASES)
def test_two_processes_sharing_equal_one_unshared(tiny_dir: Path, tmp_path: Path, strategy: str, variant: str) -> None:
    out = tmp_path / "grads.pt"
    _spawn(tmp_path, _worker, str(tiny_dir), str(out), strategy, variant, timeout=300)
    got = [torch.load(f"{out}.{rank}", weights_only=True) for rank in range(2)]
    if variant == "differ":  # rank 1's second group differs: that micro-batch falls back on both ranks
        assert got[0]["reasons"][0] is None and got[1]["reasons"][0] is None
        assert "different prompts" in got[0]["reasons"][1] and got[0]["reasons"][1] == got[1]["reasons"][1]
    else:
        assert got[0]["reasons"] == got[1]["reasons"] == [None, None]  # every micro-batch shared its prompt
    model = f64(tiny_dir)
    batch = _batch(tiny_dir, variant)
    logp, _ = token_logprobs(model, *batch)
    (logp * _weights(tuple(batch[2].shape))).sum().backward()
    mean = [p.grad / 2 for p in model.parameters()]  # DDP and FSDP2 average over the 2 ranks
    assert relative(got[0]["grads"], mean) < EXACT
