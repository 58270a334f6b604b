"""ES on the tiny causal LM: peak memory of an ES step vs an AdamW policy-gradient step, and 2-process throughput.

Run ``python -m benchmarks.bench_es``. Memory is the peak of live CPU allocations during one step
(``torch.profiler`` with ``profile_memory``: allocations and frees replayed in time order) plus the
weights, divided by the weights' bytes; the reference is an AdamW step of a policy-gradient loss
(:func:`~posttrain.estimators.clipped_ratio_loss`) on the same model and batch, in the same run.
Throughput is the wall time of ES steps (population evaluation + update) in one process vs two
gloo processes (members round-robin, rewards all-reduced), with and without lockstep restores.
A measurement, not a test: the exit status is 0 whatever the ratios.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile

__all__ = ["main", "memory_ratios", "peak_extra_bytes", "throughput"]


def peak_extra_bytes(fn: Callable[[], object]) -> int:
    """Peak of live CPU bytes allocated by ``fn`` above its starting point (profiler memory events)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted(prof.profiler.function_events, key=lambda e: e.time_range.start)  # type: ignore[union-attr]
    live = peak = 0
    for e in events:
        live += e.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def _model(hidden: int, layers: int) -> tuple[Any, Any]:
    from posttrain.llm.tiny import TinyConfig, char_tokenizer, tiny_model

    tok = char_tokenizer()
    cfg = TinyConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers)
    return tiny_model(cfg, len(tok), seed=0), tok


def _fitness(model: Any, ids: torch.Tensor) -> Callable[[int], float]:
    def fitness(step: int) -> float:
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[:, :-1], -1).gather(-1, ids[:, 1:, None])
        return float(logp.mean())

    return fitness


def memory_ratios(*, hidden: int = 128, layers: int = 2, population: int = 8, batch: int = 8) -> dict[str, float]:
    """(weights + peak extra) / weights for one ES step and one AdamW step on the same model and batch."""
    from posttrain.estimators import clipped_ratio_loss
    from posttrain.llm.es_trainer import EsTrainConfig, es_train, trainable_params

    model, _ = _model(hidden, layers)
    ids = torch.randint(4, 50, (batch, 24), generator=torch.Generator().manual_seed(0))
    params = trainable_params(model)
    weights = sum(p.numel() * p.element_size() for p in params.values())
    cfg = EsTrainConfig(population=population, sigma=1e-3, lr=5e-4, steps=1)
    es = peak_extra_bytes(lambda: es_train(params, _fitness(model, ids), cfg))
    machinery = peak_extra_bytes(lambda: es_train(params, lambda step: 0.0 * step, cfg))  # no forward pass

    opt = torch.optim.AdamW(params.values(), lr=1e-6)

    def adamw_step() -> None:
        logp = torch.log_softmax(model(ids).logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        adv = torch.randn(batch, generator=torch.Generator().manual_seed(1))
        loss, _ = clipped_ratio_loss(logp, logp.detach(), adv, torch.ones_like(logp, dtype=torch.bool))
        loss.mean().backward()
        opt.step()

    adamw = peak_extra_bytes(adamw_step)
    return {
        "weights_bytes": float(weights),
        "es": 1 + es / weights,
        "es_machinery": 1 + machinery / weights,
        "adamw": 1 + adamw / weights,
    }


def _worker(rank: int, world: int, init: str, hidden: int, layers: int, steps: int, lockstep: bool, out: str) -> None:
    from posttrain.llm.es_trainer import EsTrainConfig, es_train, trainable_params

    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    model, _ = _model(hidden, layers)
    ids = torch.randint(4, 50, (16, 32), generator=torch.Generator().manual_seed(0))
    cfg = EsTrainConfig(population=16, sigma=1e-3, lr=5e-4, steps=steps, lockstep=lockstep)
    if world > 1:
        dist.barrier()
    wall, cpu = time.perf_counter(), time.process_time()
    es_train(trainable_params(model), _fitness(model, ids), cfg)
    with open(f"{out}.{rank}", "w") as fh:
        fh.write(f"{time.perf_counter() - wall} {time.process_time() - cpu}")
    if world > 1:
        dist.destroy_process_group()


def throughput(*, hidden: int = 128, layers: int = 2, steps: int = 3) -> dict[str, float]:
    """Speed-up of 2 gloo processes over 1 for whole ES steps (lockstep on and off).

    Two numbers per setting: wall time, and CPU time of the busiest rank (robust to other load on a
    shared machine, but blind to communication waits).
    """
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for lockstep in (True, False):
            wall, cpu = {}, {}
            for world in (1, 2):
                path = os.path.join(tmp, f"t{world}{lockstep}")
                init = os.path.join(tmp, f"init{world}{lockstep}")
                if world == 1:
                    _worker(0, 1, init, hidden, layers, steps, lockstep, path)
                else:
                    mp.spawn(_worker, args=(world, init, hidden, layers, steps, lockstep, path), nprocs=world)
                runs = []
                for rank in range(world):
                    with open(f"{path}.{rank}") as fh:
                        runs.append([float(x) for x in fh.read().split()])
                wall[world], cpu[world] = max(r[0] for r in runs), max(r[1] for r in runs)
            out[f"wall-time speedup (lockstep={lockstep})"] = wall[1] / wall[2]
            out[f"busiest-rank CPU-time speedup (lockstep={lockstep})"] = cpu[1] / cpu[2]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_es", description=__doc__)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--no-throughput", action="store_true", help="memory only (no processes spawned)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    mem = memory_ratios(hidden=args.hidden, layers=args.layers)
    print(f"weights: {mem['weights_bytes'] / 2**20:.2f} MiB")
    print(f"ES step peak / weights:    {mem['es']:.3f}  (target <= 1.2; includes the fitness forward pass)")
    print(f"ES perturb/restore/update peak / weights (no forward): {mem['es_machinery']:.3f}")
    print(f"AdamW step peak / weights: {mem['adamw']:.3f}  (reference, same run)")
    if not args.no_throughput:
        for k, v in throughput(hidden=args.hidden, layers=args.layers).items():
            print(f"2 gloo processes vs 1, {k}: {v:.2f}x  (target >= 1.7)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
