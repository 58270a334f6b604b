"""Evolution-strategies fine-tuning of a causal LM in place (ES-at-Scale recipe, Qiu et al. 2025).

Per step (Ba et al. 2026, arXiv:2608.27351, App. G.1; Qiu et al. 2025, arXiv:2509.24372):

1. ask: the step's member seeds come from `posttrain.estimators.es.evolution_strategy`;
2. evaluate: for each member, perturb the model's weights in place from its seed
   (`perturb_`), score it on the step's shared prompt batch, and
   subtract the same regenerated noise (`restore_`);
3. update: z-score the rewards and add $\\alpha\\frac1P\\sum_i z_i\\varepsilon_i$ tensor by tensor
   (`apply_es_step_`, one float32 accumulator at a time).

Memory stays near one copy of the weights: no gradients, no optimiser state; the noise is drawn
and the update accumulated in fixed-size chunks (`NOISE_CHUNK`
elements), so ES's own temporaries do not grow with the largest parameter tensor. The rest of a
step's peak is the fitness evaluation's activations (``micro_batch`` in `generation_fitness`).
A per-step `NoiseCache` (``noise_cache``: a fraction of the weights' bytes, spent on the smallest
tensors of every member, `step_noise_cache`) lets perturb, restore and update share one draw of those
tensors; the others are regenerated from their seeds. The weights do not depend on it.

Distributed: members are dealt round-robin over the processes of a ``torch.distributed`` group;
only seeds (derived identically on every rank from the shared key) and the ``P`` scalar rewards
(one ``all_reduce`` of a zero-initialised vector) cross processes. Restoring by subtraction is not
exact in floating point, so with ``lockstep=True`` (default) every rank also replays the
perturb-restore round trip of the members it does not evaluate (`roundtrip_`,
one noise draw instead of two): all ranks then perform the same float operations as a single
process and stay bit-identical to it without ever sending weights. ``lockstep=False`` skips that
work (faster) and lets the replicas drift by rounding; the paper re-broadcasts weights instead.

`grpo_then_es` is the sequential GRPO -> ES schedule of Ba et al. 2026 (§4C).

Simplifications: the fitness is any callable of the step (e.g. `generation_fitness`, greedy
decoding with a task's verifier); tied parameters are perturbed once (``named_parameters``
deduplicates shared tensors).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import evolution_strategy
from posttrain.llm.es.params import apply_es_step_, perturb_, restore_, roundtrip_, step_noise_cache
from posttrain.llm.rollout.engine import HFEngine, SamplingConfig
from posttrain.llm.rollout.tasks import Problem, Task
from posttrain.llm.rollout.text import decode_responses, encode_prompts

__all__ = [
    "EsStepLog",
    "EsTrainConfig",
    "es_train",
    "generation_fitness",
    "trainable_params",
]


@dataclass(frozen=True)
class EsTrainConfig:
    """ES hyperparameters (defaults: the ES-at-Scale Countdown recipe, N = 30 rounded to an even 32).

    ``noise_cache``: bytes of noise kept per step for reuse, as a fraction of the trainable weights'
    bytes (0: every use regenerates it; the results are the same either way).
    """

    population: int = 32
    sigma: float = 1e-3
    lr: float = 5e-4
    steps: int = 500
    seed: int = 0
    antithetic: bool = False
    shaping: str = "zscore"
    lockstep: bool = True
    noise_cache: float = 0.05


class EsStepLog(NamedTuple):
    """Per-step diagnostics: population reward mean/std, whether the step was a no-op (all equal), and the
    members whose fitness could not be computed (NaN: given the mean of the others, zero weight under z-score shaping)."""

    step: int
    reward_mean: float
    reward_std: float
    noop: bool
    unjudged: int = 0


def trainable_params(model: torch.nn.Module) -> dict[str, Tensor]:
    """``{name: parameter}`` of the trainable parameters, tied tensors once (``named_parameters`` dedups)."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def rank_world(group: Any) -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def es_train(
    params: Mapping[str, Tensor],
    fitness: Callable[[int], float],
    config: EsTrainConfig,
    *,
    group: Any = None,
    on_step: Callable[[EsStepLog], None] | None = None,
) -> list[EsStepLog]:
    """Run ``config.steps`` ES steps on ``params`` in place; ``fitness(step)`` scores the current weights.

    ``fitness`` must evaluate every member of a step on the same data (derive it from ``step``).
    With a process ``group`` (or the default group when ``torch.distributed`` is initialised),
    members are split round-robin and rewards summed with one ``all_reduce``.
    """
    if config.steps < 0:
        raise DomainError(f"steps: expected >= 0, got {config.steps}")
    if not config.noise_cache >= 0:
        raise DomainError(
            f"noise_cache: expected a non-negative fraction of the weights' bytes, got {config.noise_cache}"
        )
    cache_bytes = config.noise_cache * sum(p.numel() * p.element_size() for p in params.values())
    es = evolution_strategy(
        population=config.population, sigma=config.sigma, lr=config.lr, antithetic=config.antithetic,
        shaping=config.shaping,
    )  # fmt: skip
    rank, world = rank_world(group)
    state = es.init(config.seed)
    logs = []
    for step in range(config.steps):
        pop = es.ask(state)
        cache = step_noise_cache(params, config.population, max_bytes=cache_bytes)
        rewards = torch.zeros(config.population, dtype=torch.float64)
        for i, (seed, sign) in enumerate(zip(pop.seeds.tolist(), pop.signs.tolist(), strict=True)):
            if i % world == rank:
                perturb_(params, seed, sigma=config.sigma, sign=sign, cache=cache)
                rewards[i] = float(fitness(step))
                restore_(params, seed, sigma=config.sigma, sign=sign, cache=cache)
            elif config.lockstep:  # replay another rank's member: the same rounding, one noise draw
                roundtrip_(params, seed, sigma=config.sigma, sign=sign, cache=cache)
        if world > 1:
            dist.all_reduce(rewards, op=dist.ReduceOp.SUM, group=group)
        bad = ~torch.isfinite(rewards)
        if bool(bad.any()):  # a fitness that could not be computed: the mean of the others (zero weight in the update)
            rewards[bad] = rewards[~bad].mean() if bool((~bad).any()) else 0.0
        apply_es_step_(params, pop, rewards, lr=config.lr, shaping=config.shaping, cache=cache)
        state = state._replace(step=state.step + 1)
        log = EsStepLog(
            step, float(rewards.mean()), float(rewards.std(correction=0)), bool((rewards == rewards[0]).all()),
            int(bad.sum()),
        )  # fmt: skip
        logs.append(log)
        if on_step is not None:
            on_step(log)
    return logs


def generation_fitness(
    model: Any,
    tokenizer: Any,
    task: Task,
    *,
    prompts_per_step: int,
    seed: int = 0,
    max_new_tokens: int = 16,
    chat_template: bool = False,
    system: str | None = None,
    problems: Sequence[Problem] | None = None,
    micro_batch: int | None = None,
) -> Callable[[int], float]:
    """Mean task reward of one greedy response per prompt (the ES-at-Scale member fitness).

    Step ``t`` uses ``task.sample(random.Random(seed * 1_000_003 + t), prompts_per_step)`` (or the
    fixed ``problems``), so every member of a step, on every rank, sees the same prompts.
    ``micro_batch`` prompts go to each ``generate`` call (all at once if None): the activations'
    and KV cache's memory scale with it, the responses only through padding (greedy decoding).
    """
    if micro_batch is not None and micro_batch < 1:
        raise DomainError(f"micro_batch: expected a positive integer or None, got {micro_batch}")
    engine = HFEngine(
        model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id,
        sampling=SamplingConfig(max_new_tokens=max_new_tokens),
    )  # fmt: skip

    def fitness(step: int) -> float:
        batch = (
            list(problems)
            if problems is not None
            else task.sample(random.Random(seed * 1_000_003 + step), prompts_per_step)
        )
        prompts = encode_prompts(tokenizer, [p.prompt for p in batch], chat_template=chat_template, system=system)
        size = micro_batch or len(prompts)
        texts = []
        with torch.no_grad():
            for start in range(0, len(prompts), size):
                out = engine.generate(prompts[start : start + size], n=1, seed=step, greedy=True)
                texts += decode_responses(tokenizer, out.response_ids, out.mask)
        scores = [task.reward(p, t) for p, t in zip(batch, texts, strict=True)]
        judged = [r for r in scores if r == r]  # NaN: a verdict not reached, left out (all NaN: NaN)
        return sum(judged) / len(judged) if judged else float("nan")

    return fitness
