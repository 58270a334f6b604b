"""ES on the tiny causal LM: peak memory of an ES step vs an AdamW policy-gradient step, and 2-process throughput.

Run ``python -m benchmarks.bench_es``. Memory is the peak of live CPU allocations during one step
(``torch.profiler`` with ``profile_memory``: allocations and frees replayed in time order) plus the
weights, divided by the weights' bytes; the reference is an AdamW step of a policy-gradient loss
(:func:`~posttrain.estimators.clipped_ratio_loss`) on the same model and batch, in the same run.
ES's own temporaries are chunk-sized (:data:`~posttrain.estimators.es.NOISE_CHUNK`); the rest of an
ES step's peak is the fitness evaluation's activations, so the step is measured with the fitness
batch in one forward and in micro-batches (same reward).
Throughput is the wall time of ES steps (population evaluation + update) in one process vs two
gloo processes (members round-robin, rewards all-reduced), with and without lockstep, one thread
per process, the median of several back-to-back repeats; :func:`speedup_bound` gives the speed-up
the measured costs allow (the update is done whole by every rank, so it caps the ratio below 2).
Noise reuse (:func:`noise_reuse`): the CPU time of ES's noise work with the step's
:class:`~posttrain.estimators.es.NoiseCache` against regenerating the noise at every use, timed
alternately in one process: on check 05's bandit (perturbed members and update of 10 seeds) and
for the in-place perturb/restore/update of the tiny model (the trainer's default budget, and
everything kept). A measurement, not a test: the exit status is 0 whatever the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile

from benchmarks._timing import load_average

__all__ = ["main", "memory_ratios", "noise_reuse", "peak_extra_bytes", "speedup_bound", "throughput"]


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
    from posttrain.llm.tools.tiny import TinyConfig, char_tokenizer, tiny_model

    tok = char_tokenizer()
    cfg = TinyConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers)
    return tiny_model(cfg, len(tok), seed=0), tok


def _fitness(model: Any, ids: torch.Tensor, micro_batch: int | None = None) -> Callable[[int], float]:
    """Mean teacher-forced log-probability of ``ids``, ``micro_batch`` sequences per forward (all at once if None).

    The value does not depend on ``micro_batch`` (up to float rounding); the activations' memory does.
    """
    rows = ids.split(micro_batch or ids.shape[0])

    def fitness(step: int) -> float:
        total = 0.0
        with torch.no_grad():
            for part in rows:
                logits = model(part, use_cache=False).logits[:, :-1]
                total += float(torch.log_softmax(logits, -1).gather(-1, part[:, 1:, None]).sum())
        return total / ids[:, 1:].numel()

    return fitness


def memory_ratios(
    *, hidden: int = 128, layers: int = 2, population: int = 8, batch: int = 8, micro_batch: int = 1
) -> dict[str, float]:
    """(weights + peak extra) / weights for one ES step and one AdamW step on the same model and batch.

    ES is measured with the fitness batch in one forward (``es``) and in forwards of ``micro_batch``
    sequences (``es_micro``: same reward, activations of ``micro_batch`` sequences), with greedy
    generation as the fitness (``es_generate``: :func:`~posttrain.llm.es.trainer.generation_fitness`,
    ``batch`` addition prompts, 16 new tokens, ``micro_batch`` prompts per ``generate``), and with no
    forward at all (``es_machinery``: perturb, restore and update only). AdamW is measured on the whole
    batch (``adamw``) and with gradient accumulation over ``micro_batch``-sequence slices (``adamw_micro``).
    """
    from posttrain.estimators import clipped_ratio_loss
    from posttrain.llm.es.trainer import EsTrainConfig, es_train, generation_fitness, trainable_params
    from posttrain.llm.rollout.tasks import make_task

    model, tok = _model(hidden, layers)
    ids = torch.randint(4, 50, (batch, 24), generator=torch.Generator().manual_seed(0))
    params = trainable_params(model)
    weights = sum(p.numel() * p.element_size() for p in params.values())
    cfg = EsTrainConfig(population=population, sigma=1e-3, lr=5e-4, steps=1)
    gen = generation_fitness(model, tok, make_task("addition"), prompts_per_step=batch, micro_batch=micro_batch)
    out = {
        "weights_bytes": float(weights),
        "es": peak_extra_bytes(lambda: es_train(params, _fitness(model, ids), cfg)),
        "es_micro": peak_extra_bytes(lambda: es_train(params, _fitness(model, ids, micro_batch), cfg)),
        "es_generate": peak_extra_bytes(lambda: es_train(params, gen, cfg)),
        "es_machinery": peak_extra_bytes(lambda: es_train(params, lambda step: 0.0 * step, cfg)),
    }
    adv = torch.randn(batch, generator=torch.Generator().manual_seed(1))

    def adamw_step(size: int) -> None:  # a first step: gradients and AdamW's moments are allocated in it
        opt = torch.optim.AdamW(params.values(), lr=1e-6)
        for part, a in zip(ids.split(size), adv.split(size), strict=True):
            logits = model(part, use_cache=False).logits[:, :-1]
            logp = torch.log_softmax(logits, -1).gather(-1, part[:, 1:, None]).squeeze(-1)
            loss, _ = clipped_ratio_loss(logp, logp.detach(), a, torch.ones_like(logp, dtype=torch.bool))
            (loss.sum() / ids[:, 1:].numel()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    out["adamw"] = peak_extra_bytes(lambda: adamw_step(batch))
    out["adamw_micro"] = peak_extra_bytes(lambda: adamw_step(micro_batch))
    return {k: v if k == "weights_bytes" else 1 + v / weights for k, v in out.items()}


@dataclass(frozen=True)
class _Run:
    hidden: int
    layers: int
    steps: int
    lockstep: bool
    fitness: str  # "forward": teacher-forced log-prob of 16 x 32 tokens; "generate": greedy addition, 16 prompts


def _worker(rank: int, world: int, init: str, run: _Run, out: str) -> None:
    from posttrain.llm.es.trainer import EsTrainConfig, es_train, generation_fitness, trainable_params
    from posttrain.llm.rollout.tasks import make_task

    torch.set_num_threads(1)  # 2 processes on 2 cores; the 1-process baseline also gets 1 thread
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    model, tok = _model(run.hidden, run.layers)
    ids = torch.randint(4, 50, (16, 32), generator=torch.Generator().manual_seed(0))
    fitness = (
        _fitness(model, ids)
        if run.fitness == "forward"
        else generation_fitness(model, tok, make_task("addition"), prompts_per_step=16, max_new_tokens=8)
    )
    params = trainable_params(model)
    cfg = EsTrainConfig(population=16, sigma=1e-3, lr=5e-4, steps=run.steps, lockstep=run.lockstep)
    es_train(params, fitness, EsTrainConfig(population=2, sigma=1e-3, lr=0.0, steps=1))  # warm-up, not timed
    if world > 1:
        dist.barrier()
    wall, cpu = time.perf_counter(), time.process_time()
    es_train(params, fitness, cfg)
    with open(f"{out}.{rank}", "w") as fh:
        fh.write(f"{time.perf_counter() - wall} {time.process_time() - cpu}")
    if world > 1:
        dist.barrier()  # no rank tears gloo down while the other is still in a collective
        dist.destroy_process_group()


def _best_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def speedup_bound(
    *, hidden: int = 128, layers: int = 2, population: int = 16, fitness: str = "forward", repeats: int = 5
) -> dict[str, float]:
    """The 2-process speed-up that the step's own costs allow, from one process's best-of timings.

    With ``n`` one perturb (or restore), ``f`` one fitness call, ``r`` one lockstep round trip and
    ``U`` the update (every rank does it whole): one process takes ``P(2n + f) + U``; a rank of two
    takes ``P/2 (2n + f) + U``, plus ``P/2 r`` with lockstep. Communication (one all-reduce of ``P``
    floats) is left out. Best-of timings make it far less sensitive to other load than wall time.
    """
    from posttrain.estimators import EsPopulation
    from posttrain.llm.es.params import apply_es_step_, perturb_, roundtrip_
    from posttrain.llm.es.trainer import generation_fitness, trainable_params
    from posttrain.llm.rollout.tasks import make_task

    torch.set_num_threads(1)
    model, tok = _model(hidden, layers)
    ids = torch.randint(4, 50, (16, 32), generator=torch.Generator().manual_seed(0))
    fit = (
        _fitness(model, ids)
        if fitness == "forward"
        else generation_fitness(model, tok, make_task("addition"), prompts_per_step=16, max_new_tokens=8)
    )
    params = trainable_params(model)
    pop = EsPopulation(torch.arange(population), torch.ones(population))
    rewards = torch.randn(population, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    n = _best_ms(lambda: perturb_(params, 1, sigma=0.0), repeats)
    r = _best_ms(lambda: roundtrip_(params, 1, sigma=0.0), repeats)
    f = _best_ms(lambda: fit(0), repeats)
    u = _best_ms(lambda: apply_es_step_(params, pop, rewards, lr=0.0), repeats)
    one, two = population * (2 * n + f) + u, population / 2 * (2 * n + f) + u
    return {"perturb_ms": n, "roundtrip_ms": r, "fitness_ms": f, "update_ms": u,
            "bound (lockstep=False)": one / two, "bound (lockstep=True)": one / (two + population / 2 * r)}  # fmt: skip


def throughput(
    *, hidden: int = 128, layers: int = 2, steps: int = 3, repeats: int = 5, fitness: str = "forward"
) -> dict[str, list[float]]:
    """Speed-ups of 2 gloo processes over 1 for whole ES steps (lockstep on and off), one per repeat.

    Population 16 (8 members per rank), one torch thread per process, a warm-up step before the
    clock starts; each repeat times 1 process, then 2, back to back. Two numbers per setting: wall
    time, and CPU time of the busiest rank (robust to other load on a shared machine, but blind to
    communication waits).
    """
    out: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for lockstep in (True, False):
            run = _Run(hidden, layers, steps, lockstep, fitness)
            for r in range(repeats):
                wall, cpu = {}, {}
                for world in (1, 2):
                    path, init = (
                        os.path.join(tmp, f"t{world}{lockstep}{r}"),
                        os.path.join(tmp, f"i{world}{lockstep}{r}"),
                    )
                    if world == 1:
                        _worker(0, 1, init, run, path)
                    else:
                        mp.spawn(_worker, args=(world, init, run, path), nprocs=world)
                    runs = []
                    for rank in range(world):
                        with open(f"{path}.{rank}") as fh:
                            runs.append([float(x) for x in fh.read().split()])
                    wall[world], cpu[world] = max(x[0] for x in runs), max(x[1] for x in runs)
                out.setdefault(f"wall-time speedup (lockstep={lockstep})", []).append(wall[1] / wall[2])
                out.setdefault(f"busiest-rank CPU-time speedup (lockstep={lockstep})", []).append(cpu[1] / cpu[2])
    return out


def noise_reuse(*, hidden: int = 128, layers: int = 2, repeats: int = 7) -> dict[str, tuple[float, float, float]]:
    """``{row: (seconds with the cache, seconds regenerating, kept bytes / weight bytes)}``, best of ``repeats``.

    ``toy``: one ES step's noise work on check 05's bandit, 10 seeds of population 32 with ``b [8]``
    and ``W [8, 16]`` in float64 (`perturbed_params`, then the update), with one `NoiseCache` per
    seed against none. ``llm default`` / ``llm all kept``: perturb and restore of 16 members, then
    `apply_es_step_`, on the tiny model, with the trainer's default budget (`step_noise_cache`) or
    an unbounded cache, against ``NoiseCache(0)``. The results are checked equal, bit for bit.
    """
    from benchmarks._timing import time_pair
    from posttrain.estimators.es import EsState, NoiseCache, evolution_strategy, perturbed_params
    from posttrain.llm.es.params import apply_es_step_, perturb_, restore_, step_noise_cache
    from posttrain.llm.es.trainer import EsTrainConfig, trainable_params

    es = evolution_strategy(population=32, sigma=0.5, lr=0.1)
    gen = torch.Generator().manual_seed(0)
    toys = [{"b": torch.randn(8, generator=gen, dtype=torch.float64),
             "W": torch.randn(8, 16, generator=gen, dtype=torch.float64)} for _ in range(10)]  # fmt: skip
    states = [es.init(s) for s in range(10)]
    rewards = torch.randn(32, generator=gen, dtype=torch.float64)

    def toy_step(cached: bool) -> list[dict[str, torch.Tensor]]:
        out = []
        for params, state in zip(toys, states, strict=True):
            pop, cache = es.ask(state), NoiseCache() if cached else None
            perturbed_params(params, pop, sigma=0.5, cache=cache)
            out.append(es.update(params, pop, rewards, state, cache)[0])
        return out

    if not all(torch.equal(a[n], b[n]) for a, b in zip(toy_step(True), toy_step(False), strict=True) for n in a):
        raise RuntimeError("the update with the step's NoiseCache differs from the regenerated one")
    out = {"toy": (*time_pair(lambda: toy_step(True), lambda: toy_step(False), repeats=repeats), 0.0)}

    model, _ = _model(hidden, layers)
    params = trainable_params(model)
    weights = sum(p.numel() * p.element_size() for p in params.values())
    pop = evolution_strategy(population=16, sigma=1e-3, lr=5e-4).ask(EsState(step=0, key=0))
    member_rewards = torch.randn(16, generator=gen, dtype=torch.float64)

    def llm_step(cache: Callable[[], NoiseCache]) -> Callable[[], NoiseCache]:
        def step() -> NoiseCache:
            kept = cache()
            for seed in pop.seeds.tolist():
                perturb_(params, seed, sigma=1e-3, cache=kept)
                restore_(params, seed, sigma=1e-3, cache=kept)
            apply_es_step_(params, pop, member_rewards, lr=0.0, cache=kept)  # lr 0: the weights stay put
            return kept

        return step

    budget = EsTrainConfig().noise_cache * weights
    regenerate = llm_step(lambda: NoiseCache(0))
    for row, cache in (("llm default", lambda: step_noise_cache(params, 16, max_bytes=budget)),
                       ("llm all kept", NoiseCache)):  # fmt: skip
        kept_bytes = llm_step(cache)().nbytes
        out[row] = (*time_pair(llm_step(cache), regenerate, repeats=repeats), kept_bytes / weights)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_es", description=__doc__)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--no-throughput", action="store_true", help="memory only (no processes spawned)")
    p.add_argument("--repeats", type=int, default=5, help="throughput repeats (the median is reported)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"noise drawn once per step vs regenerated at each use (CPU time, best of 7, alternated; {load_average()}):")
    for row, (cached, regenerated, kept) in noise_reuse(hidden=args.hidden, layers=args.layers).items():
        what = {"toy": "check 05's bandit, 10 seeds x 32 members: perturbed members + update",
                "llm default": "tiny model, 16 members: perturb, restore, update; trainer's default budget",
                "llm all kept": "tiny model, 16 members: perturb, restore, update; everything kept"}[row]  # fmt: skip
        target = "  (target <= 0.5)" if row == "toy" else ""
        print(f"  {what}: {1e3 * cached:.2f} ms vs {1e3 * regenerated:.2f} ms = {cached / regenerated:.2f}x"
              f"{target}; kept noise / weights {kept:.2f}")  # fmt: skip
    mem = memory_ratios(hidden=args.hidden, layers=args.layers)
    print(f"weights: {mem['weights_bytes'] / 2**20:.2f} MiB; peak of one step / weights (target for ES <= 1.2):")
    print(f"  ES, fitness = teacher-forced log-prob of 8 sequences in one forward: {mem['es']:.3f}")
    print(f"  ES, the same fitness one sequence per forward:                      {mem['es_micro']:.3f}")
    print(f"  ES, fitness = greedy generation, one prompt per generate:           {mem['es_generate']:.3f}")
    print(f"  ES perturb/restore/update only (no forward):                        {mem['es_machinery']:.3f}")
    print(f"  AdamW step, 8 sequences in one forward/backward (reference):        {mem['adamw']:.3f}")
    print(f"  AdamW step, gradient accumulation one sequence at a time:           {mem['adamw_micro']:.3f}")
    if not args.no_throughput:
        for fitness in ("forward", "generate"):
            b = speedup_bound(hidden=args.hidden, layers=args.layers, fitness=fitness)
            print(
                f"fitness={fitness}: perturb {b['perturb_ms']:.2f} ms, round trip {b['roundtrip_ms']:.2f} ms, "
                f"fitness {b['fitness_ms']:.2f} ms, update (P=16) {b['update_ms']:.2f} ms; 2-process speed-up "
                f"these costs allow: {b['bound (lockstep=False)']:.2f}x, lockstep {b['bound (lockstep=True)']:.2f}x"
            )
        print(f"load average before the throughput runs: {os.getloadavg()[0]:.2f} (2 cores)")
        for fitness in ("forward", "generate"):
            for k, v in throughput(
                hidden=args.hidden, layers=args.layers, repeats=args.repeats, fitness=fitness
            ).items():
                runs = " ".join(f"{x:.2f}" for x in sorted(v))
                print(
                    f"2 gloo processes vs 1, fitness={fitness}, {k}: median {statistics.median(v):.2f}x [{runs}]"
                    "  (target >= 1.7)"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
