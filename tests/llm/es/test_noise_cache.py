"""The step's noise cache in the in-place ES operations and the trainer: fewer draws, the same weights bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from posttrain.errors import DomainError
from posttrain.estimators.es import NOISE_CHUNK, EsPopulation, NoiseCache, members_noise
from posttrain.llm.es.params import apply_es_step_, perturb_, restore_, roundtrip_, step_noise_cache
from posttrain.llm.es.trainer import EsTrainConfig, es_train, trainable_params


def _params(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {"big": (2 * NOISE_CHUNK + 40,), "one_chunk": (NOISE_CHUNK + 15,), "w": (6, 5), "norm": (7,)}
    return {k: torch.randn(s, generator=g).to(dtype) for k, s in shapes.items()}


def _member_round(params: dict[str, torch.Tensor], pop: EsPopulation, cache: NoiseCache | None) -> None:
    """What one process does in a step: perturb, restore, replay a round trip, then update."""
    for seed, sign in zip(pop.seeds.tolist(), pop.signs.tolist(), strict=True):
        perturb_(params, seed, sigma=0.07, sign=sign, cache=cache)
        restore_(params, seed, sigma=0.07, sign=sign, cache=cache)
        roundtrip_(params, seed, sigma=0.03, sign=sign, cache=cache)
    rewards = torch.tensor([0.3, -1.0, 2.0, 0.1], dtype=torch.float64)
    apply_es_step_(params, pop, rewards, lr=0.2, cache=cache)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_in_place_step_with_a_cache_is_bitwise_the_step_without(dtype: torch.dtype) -> None:
    pop = EsPopulation(torch.tensor([4, 17, 4, 99]), torch.tensor([1.0, 1.0, -1.0, 1.0]))
    reference = _params(dtype)
    _member_round(reference, pop, None)
    full = 4 * sum(p.numel() for p in reference.values()) * 8
    for cache in (NoiseCache(), NoiseCache(0), step_noise_cache(reference, 4, max_bytes=1024), NoiseCache(full // 3)):
        live = _params(dtype)
        _member_round(live, pop, cache)
        assert all(torch.equal(live[k], reference[k]) for k in live), cache.nbytes
        assert cache.nbytes <= cache.max_bytes
        for name, p in live.items():  # what was kept is still the noise (the operations only read it)
            kept = cache.members((4,), name, p.numel(), dtype=dtype)
            if kept is not None:
                assert torch.equal(kept, members_noise([4], name, p.numel(), dtype=dtype))


def test_kept_tensors_are_drawn_once_per_member_and_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """perturb, restore and update of a member draw a kept tensor once; regenerated ones three times."""
    calls = [0]
    normal = torch.Tensor.normal_

    def counting(self: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
        calls[0] += 1
        return normal(self, *args, **kw)

    monkeypatch.setattr(torch.Tensor, "normal_", counting)
    params = {"w": torch.zeros(6, 5), "norm": torch.zeros(7)}
    pop = EsPopulation(torch.tensor([1, 2, 3, 4]), torch.ones(4))
    for cache, expected in ((NoiseCache(), 4 * 2 * 1), (NoiseCache(0), 4 * 2 * 3), (NoiseCache(max_numel=7), 4 * 4)):
        calls[0] = 0
        for seed in pop.seeds.tolist():
            perturb_(params, seed, sigma=0.1, cache=cache)
            restore_(params, seed, sigma=0.1, cache=cache)
        apply_es_step_(params, pop, torch.tensor([0.0, 1.0, 3.0, 7.0]), lr=0.1, cache=cache)  # no zero weight
        assert calls[0] == expected


def test_step_noise_cache_spends_the_budget_on_the_smallest_tensors() -> None:
    params = {"emb": torch.zeros(1000), "q": torch.zeros(64), "k": torch.zeros(64), "norm": torch.zeros(8)}
    assert step_noise_cache(params, 2, max_bytes=0).max_numel == 0
    norm_only = step_noise_cache(params, 2, max_bytes=2 * 8 * 4 + 2 * 64 * 4)  # q fits, q and k together do not
    assert (norm_only.max_numel, norm_only.max_bytes) == (8, 64)
    both = step_noise_cache(params, 2, max_bytes=2 * (8 + 64 + 64) * 4)
    assert (both.max_numel, both.max_bytes) == (64, 1088)
    double = step_noise_cache({"w": torch.zeros(10, dtype=torch.float64)}, 3, max_bytes=240)
    assert double.max_numel == 10  # float64 noise: 3 x 10 x 8 bytes
    with pytest.raises(DomainError, match="population"):
        step_noise_cache(params, 0, max_bytes=10)
    with pytest.raises(DomainError, match="max_bytes"):
        step_noise_cache(params, 2, max_bytes=-1)


def test_trainer_weights_do_not_depend_on_the_cache(tiny: tuple[Any, Any]) -> None:
    """``noise_cache`` 0 (regenerate), the default and everything kept: the same weights after two steps."""
    model, tok = tiny
    start = {k: v.detach().clone() for k, v in trainable_params(model).items()}
    ids = torch.tensor([tok("12+34=46")["input_ids"]])

    def fitness(step: int) -> float:
        with torch.no_grad():
            return float(torch.log_softmax(model(ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).mean())

    ends = []
    for fraction in (0.0, EsTrainConfig().noise_cache, 100.0):
        params = trainable_params(model)
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(start[k])
        es_train(
            params, fitness, EsTrainConfig(population=4, sigma=0.05, lr=0.02, steps=2, seed=1, noise_cache=fraction)
        )
        ends.append({k: v.detach().clone() for k, v in params.items()})
    assert not all(torch.equal(ends[0][k], start[k]) for k in start)  # the steps moved the weights
    assert all(torch.equal(e[k], ends[0][k]) for e in ends[1:] for k in start)
    with pytest.raises(DomainError, match="noise_cache"):
        es_train(trainable_params(model), fitness, EsTrainConfig(steps=1, noise_cache=-0.1))


def test_a_budgeted_cache_bounds_the_temporaries() -> None:
    """Peak extra memory of a member's perturb/restore with a step cache: its budget plus the chunk buffers."""
    from benchmarks.bench_es import peak_extra_bytes

    params = {"w": torch.zeros(16 * NOISE_CHUNK), "norms": torch.zeros(300), "b": torch.zeros(5)}
    cache = step_noise_cache(params, 4, max_bytes=8192)
    assert cache.max_numel == 300

    def evaluate_member() -> None:
        perturb_(params, 3, sigma=0.1, cache=cache)
        restore_(params, 3, sigma=0.1, cache=cache)

    assert peak_extra_bytes(evaluate_member) <= 8192 + 2 * (NOISE_CHUNK + 15) * 4 + 4096
