"""Data parallel on CPU: 2 gloo processes produce the gradients of 1 process on the same global batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from posttrain.llm.algorithm import build_algorithm
from posttrain.llm.config import config_from_dict
from tests.llm.fakes import FixedEngine, TableTask

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")

G, K = 4, 2
RESPONSES = [[5 + (i % 7)] * (1 + i % 4) + [3] for i in range(G * K)]
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _global_batch_and_grads(tiny_dir: Path, mode: str, world: int, rank: int) -> tuple[float, list[torch.Tensor]]:
    """Loss and gradients on this rank's share of the fixed global batch (the whole batch when world=1)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.llm.trainer import Trainer

    model = AutoModelForCausalLM.from_pretrained(tiny_dir).double()
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    cfg = config_from_dict(
        {
            "data": {"prompts_per_step": G},
            "rollout": {"group_size": K, "max_new_tokens": 6},
            "algorithm": {"method": "grpo", "aggregation": mode},
            "optim": {"micro_batch_size": K, "max_grad_norm": None},
        }
    )
    alg = build_algorithm(method="grpo", horizon=6, aggregation=mode)
    wrapped = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    trainer = Trainer(
        cfg, model=wrapped, tokenizer=tok, task=TableTask(), engine=FixedEngine(model, RESPONSES), algorithm=alg
    )
    trainer.rank, trainer.world = 0, 1  # the fixed engine returns the global batch; this rank keeps its groups below
    batch, _ = trainer.rollout()
    trainer.rank, trainer.world = rank, world
    share = batch.batch_size // world
    local = batch.rows(rank * share, (rank + 1) * share)
    stats = trainer.accumulate_gradients(local)
    return stats["loss"], [p.grad.detach().clone() for p in model.parameters()]


def _worker(rank: int, tiny_dir: str, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        results = {mode: _global_batch_and_grads(Path(tiny_dir), mode, 2, rank) for mode in MODES}
        losses = {m: torch.tensor(r[0], dtype=torch.float64) for m, r in results.items()}
        for t in losses.values():
            dist.all_reduce(t)  # each rank's loss is its share of the global loss
        if rank == 0:
            torch.save({m: (float(losses[m]), r[1]) for m, r in results.items()}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_processes_equal_one(tiny_dir: Path, tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    out = tmp_path / "ddp.pt"
    mp.spawn(_worker, args=(str(tiny_dir), str(tmp_path / "init"), str(out)), nprocs=2, join=True)
    ddp: dict[str, Any] = torch.load(out, weights_only=True)
    for mode in MODES:
        loss, grads = _global_batch_and_grads(tiny_dir, mode, 1, 0)
        assert ddp[mode][0] == pytest.approx(loss, rel=1e-10), mode
        for a, b in zip(ddp[mode][1], grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
