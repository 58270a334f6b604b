"""ES noise drawn once per step: a `NoiseCache` changes what is drawn, never the values (bit for bit)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posttrain.estimators.es_noise as es_noise
from posttrain.errors import DomainError
from posttrain.estimators.es import (
    NOISE_CHUNK,
    EsPopulation,
    NoiseCache,
    antithetic_population,
    es_step,
    evolution_strategy,
    members_noise,
    noise_chunks,
    perturbed_params,
    population_noise,
    seeded_noise,
)

SIZES = [1, 7, 15, 16, 17, 128, NOISE_CHUNK + 15, NOISE_CHUNK + 16, 2 * NOISE_CHUNK + 7]
DTYPES = [torch.float32, torch.float64, torch.bfloat16]


@contextmanager
def counted_draws(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Count the whole-tensor draws (one per member and tensor) made through `es_noise._fill_`."""
    calls = [0]
    fill = es_noise._fill_

    def counting(flat: torch.Tensor, generator_seed: int, gen: torch.Generator) -> torch.Tensor:
        calls[0] += 1
        return fill(flat, generator_seed, gen)

    with monkeypatch.context() as m:
        m.setattr(es_noise, "_fill_", counting)
        yield calls


def _population(seeds: list[int], antithetic: bool) -> EsPopulation:
    if antithetic:
        return antithetic_population(torch.tensor(seeds))
    return EsPopulation(torch.tensor(seeds), torch.ones(len(seeds), dtype=torch.float64))


@settings(max_examples=25)
@given(
    seeds=st.lists(st.integers(0, 2**40), min_size=1, max_size=5),
    n=st.sampled_from(SIZES),
    dtype=st.sampled_from(DTYPES),
    mix_names=st.booleans(),
)
def test_kept_noise_is_the_regenerated_noise(seeds: list[int], n: int, dtype: torch.dtype, mix_names: bool) -> None:
    """Every entry point gives the same numbers with a cache (kept or over budget) as without, at every size."""
    kw: dict[str, Any] = {"dtype": dtype, "mix_names": mix_names}
    pop = _population(seeds, antithetic=False)
    for cache in (NoiseCache(), NoiseCache(0), NoiseCache(max_numel=16)):
        for _ in range(2):  # the first call draws (and keeps), the second reads what was kept
            assert torch.equal(
                population_noise(pop, "w", (n,), cache=cache, **kw), population_noise(pop, "w", (n,), **kw)
            )
            assert torch.equal(members_noise(seeds, "w", n, cache=cache, **kw), members_noise(seeds, "w", n, **kw))
            for s in seeds:
                assert torch.equal(seeded_noise(s, "w", (n,), cache=cache, **kw), seeded_noise(s, "w", (n,), **kw))
                kept = torch.cat(
                    [v.clone() for *_, v in noise_chunks(s, "w", n, cache=cache, **kw)] or [torch.zeros(0)]
                )
                assert torch.equal(kept, seeded_noise(s, "w", (n,), **kw).flatten())


@settings(max_examples=15)
@given(seed=st.integers(0, 2**31 - 1), p=st.integers(1, 6), antithetic=st.booleans(), dtype=st.sampled_from(DTYPES))
def test_step_with_a_cache_is_bitwise_the_step_without(seed: int, p: int, antithetic: bool, dtype: torch.dtype) -> None:
    """perturbed_params + es_step + update sharing one cache equal the regenerating calls exactly."""
    g = torch.Generator().manual_seed(seed)
    params = {"W": torch.randn(8, 16, generator=g).to(dtype), "b": torch.randn(8, generator=g).to(dtype)}
    pop = _population(torch.randint(0, 2**31 - 1, (p,), generator=g).tolist(), antithetic)
    rewards = torch.randn(pop.seeds.shape[0], generator=g, dtype=torch.float64)
    cache = NoiseCache()
    members = perturbed_params(params, pop, sigma=0.3, cache=cache)
    step = es_step(params, pop, rewards, lr=0.1, cache=cache)
    for name in params:
        assert torch.equal(members[name], perturbed_params(params, pop, sigma=0.3)[name])
        assert torch.equal(step[name], es_step(params, pop, rewards, lr=0.1)[name])
    es = evolution_strategy(population=4, sigma=0.3, lr=0.1)
    state = es.init(seed)
    pop4, cache = es.ask(state), NoiseCache()
    perturbed_params(params, pop4, sigma=0.3, cache=cache)
    with_cache, _ = es.update(params, pop4, rewards[:1].repeat(4) + torch.arange(4.0), state, cache)
    without, _ = es.update(params, pop4, rewards[:1].repeat(4) + torch.arange(4.0), state)
    assert all(torch.equal(with_cache[k], without[k]) for k in params)


def test_the_calls_leave_the_kept_noise_intact() -> None:
    params = {"W": torch.randn(4, 5), "b": torch.randn(4)}
    pop, cache = antithetic_population(torch.tensor([3, 11])), NoiseCache()
    perturbed_params(params, pop, sigma=0.5, cache=cache)
    es_step(params, pop, torch.tensor([1.0, -2.0, 0.5, 3.0]), lr=0.2, cache=cache)
    seeds = pop.seeds.tolist()
    for name, t in params.items():
        kept = cache.members(seeds, name, t.numel())
        assert kept is not None and torch.equal(kept, members_noise(seeds, name, t.numel()))


def test_a_step_draws_each_member_tensor_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the step's cache, perturbation and update together draw P x tensors streams; without, twice that."""
    params = {"W": torch.randn(8, 16, dtype=torch.float64), "b": torch.randn(8, dtype=torch.float64)}
    pop = EsPopulation(torch.arange(5), torch.ones(5))
    rewards = torch.tensor([0.0, 1.0, 2.0, 3.0, 10.0], dtype=torch.float64)  # no member with zero weight
    for cache, expected in ((NoiseCache(), 5 * 2), (None, 2 * 5 * 2)):
        with counted_draws(monkeypatch) as draws:
            perturbed_params(params, pop, sigma=0.1, cache=cache)
            es_step(params, pop, rewards, lr=0.1, cache=cache)
        assert draws[0] == expected


def test_the_toy_trainer_draws_once_per_member_tensor_and_step(monkeypatch: pytest.MonkeyPatch) -> None:
    from posttrain.simulators.es_toys import init_params, make_bandit, train_es

    env = make_bandit([0, 1], n_prompts=64)
    gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
    with counted_draws(monkeypatch) as draws:
        train_es(env, init_params(env), [5, 6], gens, steps=3, batch=8, population=4)
    assert draws[0] == 2 * 3 * 4 * 2  # seeds x steps x members x tensors (b, W)


def test_the_budget_bounds_what_is_kept() -> None:
    cache = NoiseCache(900, max_numel=100)
    for s in range(10):
        seeded_noise(s, "small", (50,), cache=cache)  # 200 bytes each: four fit (800 bytes)
        seeded_noise(s, "large", (101,), cache=cache)  # over max_numel: never kept
    assert cache.nbytes == 800 <= cache.max_bytes and len(cache) == 4
    nothing = NoiseCache(0)
    assert torch.equal(seeded_noise(4, "w", (3,), cache=nothing), seeded_noise(4, "w", (3,)))
    assert len(nothing) == 0 and nothing.nbytes == 0
    assert math.isinf(NoiseCache().max_bytes)


def test_bad_cache_arguments_raise_named_errors() -> None:
    with pytest.raises(DomainError, match="max_bytes"):
        NoiseCache(-1)
    with pytest.raises(DomainError, match="max_bytes"):
        NoiseCache(float("nan"))
    with pytest.raises(DomainError, match="max_numel"):
        NoiseCache(max_numel=-1)
    with pytest.raises(DomainError, match="chunk"):
        next(noise_chunks(1, "w", 100, chunk=32, cache=NoiseCache()))
    with pytest.raises(DomainError, match="seed"):
        seeded_noise(-1, "w", (2,), cache=NoiseCache())
