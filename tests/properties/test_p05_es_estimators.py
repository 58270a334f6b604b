"""Spec 05 §8 / spec 10 §8: ES estimators, seeded noise, reward shaping and the update (float64 unless stated)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators import (
    EsPopulation,
    antithetic_gradient,
    antithetic_population,
    centered_rank_rewards,
    es_direction,
    es_gradient,
    es_step,
    evolution_strategy,
    noise_chunks,
    perturbed_params,
    population_noise,
    relative_drift,
    seeded_noise,
    tensor_seed,
    threshold_update,
    update_sparsity,
    zscore_rewards,
)
from posttrain.estimators.es import NOISE_CHUNK
from posttrain.llm.es.params import apply_es_step_, perturb_, population_forward, restore_, roundtrip_

seeds = st.integers(0, 2**31 - 1)
F64 = torch.float64


def _quadratic(d: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, float]:
    m = torch.randn(d, d, generator=g, dtype=F64)
    return (m + m.T) / 2, torch.randn(d, generator=g, dtype=F64), float(torch.randn(1, generator=g))


def _f(theta: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    """F(theta) = 1/2 theta^T A theta + b^T theta + c, batched over leading axes of theta."""
    return 0.5 * torch.einsum("...i,ij,...j->...", theta, a, theta) + theta @ b + c


def _pop(n: int, g: torch.Generator) -> EsPopulation:
    return EsPopulation(torch.randint(0, 2**31 - 1, (n,), generator=g), torch.ones(n, dtype=F64))


@given(seed=seeds, d=st.integers(1, 8), log_sigma=st.floats(-4, 1))
def test_quadratic_antithetic_identity(seed: int, d: int, log_sigma: float) -> None:
    """[F(theta + s eps) - F(theta - s eps)] / (2 s) = (A theta + b)^T eps exactly (up to rounding)."""
    g = torch.Generator().manual_seed(seed)
    a, b, c = _quadratic(d, g)
    theta, eps = torch.randn(d, generator=g, dtype=F64), torch.randn(1, d, generator=g, dtype=F64)
    sigma = 10.0**log_sigma
    est = antithetic_gradient(_f(theta + sigma * eps, a, b, c), _f(theta - sigma * eps, a, b, c), eps, sigma=sigma)
    exact = ((a @ theta + b) @ eps[0]) * eps[0]
    scale = (_f(theta + sigma * eps, a, b, c).abs() + 1).item() / sigma  # rounding of the difference
    torch.testing.assert_close(est, exact, rtol=0, atol=1e-13 * scale * float(eps.abs().max()) + 1e-12)


@settings(max_examples=5)
@given(seed=seeds, d=st.integers(1, 8), sigma=st.sampled_from([0.1, 0.5, 1.0]))
def test_one_point_unbiased_for_quadratic(seed: int, d: int, sigma: float) -> None:
    """The mean of R_i eps_i / sigma over 2e4 directions is within 5 SE of grad F = A theta + b."""
    g = torch.Generator().manual_seed(seed)
    a, b, c = _quadratic(d, g)
    theta = torch.randn(d, generator=g, dtype=F64)
    eps = torch.randn(20_000, d, generator=g, dtype=F64)
    rewards = _f(theta + sigma * eps, a, b, c)
    est = es_gradient(rewards, eps, sigma=sigma)
    se = (rewards[:, None] * eps / sigma).std(dim=0) / math.sqrt(eps.shape[0])
    assert bool(((est - (a @ theta + b)).abs() <= 5 * se).all())


def test_antithetic_converges_as_sigma_shrinks() -> None:
    """Log-sum-exp: the antithetic estimate tends to mean (grad F^T eps) eps, error falling like sigma^2."""
    g = torch.Generator().manual_seed(0)
    theta, eps = torch.randn(6, generator=g, dtype=F64), torch.randn(64, 6, generator=g, dtype=F64)
    grad = torch.softmax(theta, 0)
    target = ((eps @ grad)[:, None] * eps).mean(0)
    errors = []
    for sigma in (1e-1, 1e-2, 1e-3):
        est = antithetic_gradient(
            torch.logsumexp(theta + sigma * eps, -1), torch.logsumexp(theta - sigma * eps, -1), eps, sigma=sigma
        )
        errors.append(float((est - target).norm()))
    assert errors[0] > errors[1] > errors[2]
    assert errors[1] < errors[0] / 50 and errors[2] < errors[1] / 50  # O(sigma^2): x100 per decade


@given(rewards=st.lists(st.floats(-100, 100), min_size=2, max_size=40), a=st.floats(0.1, 10), b=st.floats(-10, 10))
def test_zscore_properties(rewards: list[float], a: float, b: float) -> None:
    r = torch.tensor(rewards, dtype=F64)
    z = zscore_rewards(r)
    spread = float(r.max() - r.min())
    if spread == 0:
        assert bool((z == 0).all())
        return
    std = float((r - r.mean()).square().mean().sqrt())
    if std < 1e-3:
        return  # eps = 1e-8 is no longer negligible against the spread
    assert abs(float(z.mean())) < 1e-9 and abs(float(z.square().mean().sqrt()) - 1) < 1e-6
    tol = 2e-8 / (min(a, 1.0) * std) + 1e-12  # the 1e-8 in the denominator is the only non-invariant term
    torch.testing.assert_close(zscore_rewards(a * r + b), z, rtol=tol, atol=1e-12)
    torch.testing.assert_close(zscore_rewards(-a * r + b), -z, rtol=tol, atol=1e-12)


@given(rewards=st.lists(st.integers(-5, 5), min_size=1, max_size=30))
def test_centered_ranks_invariant_to_monotone_transforms(rewards: list[int]) -> None:
    r = torch.tensor(rewards, dtype=F64)
    u = centered_rank_rewards(r)
    for transform in (torch.exp, lambda x: x**3 + x, lambda x: 7 * x - 2):
        assert torch.equal(centered_rank_rewards(transform(r)), u)
    assert abs(float(u.sum())) < 1e-12 and float(u.abs().max()) <= 0.5
    if len(set(rewards)) == len(rewards) > 1:  # distinct: an evenly spaced grid on [-1/2, 1/2]
        torch.testing.assert_close(u.sort().values, torch.linspace(-0.5, 0.5, len(rewards), dtype=F64))


@settings(max_examples=15)
@given(seed=seeds, n=st.integers(2, 12), a=st.floats(0.1, 10), b=st.floats(-5, 5))
def test_update_invariances(seed: int, n: int, a: float, b: float) -> None:
    """Affine reward maps (a > 0) and joint permutations of (seed, reward) leave the step unchanged."""
    g = torch.Generator().manual_seed(seed)
    params = {"w": torch.randn(3, 4, generator=g, dtype=F64), "b": torch.randn(4, generator=g, dtype=F64)}
    pop = _pop(n, g)
    r = torch.randn(n, generator=g, dtype=F64)
    base = es_step(params, pop, r, lr=0.3)
    std = float((r - r.mean()).square().mean().sqrt())
    rel = 2e-8 / (min(a, 1.0) * std) + 1e-12  # the 1e-8 in z-scoring is the only non-invariant term
    for k, v in es_step(params, pop, a * r + b, lr=0.3).items():
        torch.testing.assert_close(v, base[k], rtol=rel, atol=1e-14)
    perm = torch.randperm(n, generator=g)
    for k, v in es_step(params, EsPopulation(pop.seeds[perm], pop.signs[perm]), r[perm], lr=0.3).items():
        torch.testing.assert_close(v, base[k], rtol=0, atol=1e-12)
    for k, v in es_step(params, pop, r.exp(), lr=0.3, shaping="centered_ranks").items():
        by_name = es_step(params, pop, r, lr=0.3, shaping="centered_ranks")
        torch.testing.assert_close(v, by_name[k], rtol=0, atol=1e-12)


@settings(max_examples=10)
@given(seed=seeds, n=st.integers(1, 10), antithetic=st.booleans())
def test_seeded_update_equals_explicit_noise(seed: int, n: int, antithetic: bool) -> None:
    """The decomposed update from seeds equals (alpha/P) sum_i z_i s_i eps_i with materialised noise."""
    g = torch.Generator().manual_seed(seed)
    params = {"layer.w": torch.randn(5, 3, generator=g, dtype=F64), "layer.b": torch.randn(3, generator=g, dtype=F64)}
    pop = antithetic_population(_pop(n, g).seeds) if antithetic else _pop(n, g)
    r = torch.randn(pop.seeds.shape[0], generator=g, dtype=F64)
    step = es_step(params, pop, r, lr=0.05)
    z = zscore_rewards(r)
    for name, p in params.items():
        noise = population_noise(pop, name, p.shape, dtype=F64)  # [P, *shape], signs applied
        explicit = 0.05 * torch.einsum("p,p...->...", z, noise) / pop.seeds.shape[0]
        torch.testing.assert_close(step[name], explicit, rtol=1e-12, atol=1e-12)


@settings(max_examples=10)
@given(seed=seeds, n=st.integers(2, 12), workers=st.integers(1, 4))
def test_sharded_directions_sum_to_the_full_direction(seed: int, n: int, workers: int) -> None:
    """Members split across W workers: the shard directions, weighted by shard size, add up to the full one."""
    g = torch.Generator().manual_seed(seed)
    params = {"w": torch.randn(4, 2, generator=g, dtype=F64)}
    pop = _pop(n, g)
    w = torch.randn(n, generator=g, dtype=F64)
    full = es_direction(params, pop, w)["w"]
    total = torch.zeros_like(full)
    for shard in torch.arange(n).chunk(workers):
        part = es_direction(params, EsPopulation(pop.seeds[shard], pop.signs[shard]), w[shard])["w"]
        total += part * shard.numel() / n
    torch.testing.assert_close(total, full, rtol=1e-12, atol=1e-14)


def test_all_equal_rewards_are_an_exact_noop() -> None:
    es = evolution_strategy(population=6, sigma=0.1, lr=0.5)
    params = {"w": torch.randn(3, 3, dtype=torch.float32)}
    new, state = es.update(params, es.ask(es.init(3)), torch.full((6,), 0.7), es.init(3))
    assert torch.equal(new["w"], params["w"]) and state.step == 1


@given(seed=seeds, sigma=st.floats(1e-4, 1.0))
def test_perturb_restore_roundtrip(seed: int, sigma: float) -> None:
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(50, generator=g, dtype=F64)
    p64 = {"w": theta.clone()}
    perturb_(p64, seed, sigma=sigma)
    assert not torch.equal(p64["w"], theta)
    restore_(p64, seed, sigma=sigma)
    torch.testing.assert_close(p64["w"], theta, rtol=1e-12, atol=1e-12 * sigma)
    for dtype, ulps in ((torch.float32, 1.0), (torch.bfloat16, 1.0)):
        p = {"w": theta.to(dtype)}
        start = p["w"].clone()
        perturb_(p, seed, sigma=sigma)
        restore_(p, seed, sigma=sigma)
        eps = seeded_noise(seed, "w", theta.shape, dtype=dtype).double()
        ulp = torch.finfo(dtype).eps * (start.double().abs() + sigma * eps.abs())
        assert bool(((p["w"].double() - start.double()).abs() <= 2 * ulps * ulp).all())


def test_noise_is_a_pure_function_and_name_mixed() -> None:
    a1, a2 = seeded_noise(11, "layer0.weight", (100, 100)), seeded_noise(11, "layer0.weight", (100, 100))
    other_seed = seeded_noise(12, "layer0.weight", (100, 100))
    same_shape = seeded_noise(11, "layer1.weight", (100, 100))
    assert torch.equal(a1, a2) and not torch.equal(a1, other_seed)
    corr = torch.corrcoef(torch.stack([a1.flatten(), same_shape.flatten()]))[0, 1]
    assert abs(float(corr)) < 0.05
    # the original scripts' seeding: same-shaped tensors get identical noise
    assert torch.equal(
        seeded_noise(11, "layer0.weight", (100, 100), mix_names=False),
        seeded_noise(11, "layer1.weight", (100, 100), mix_names=False),
    )
    assert seeded_noise(1, "w", (3,), dtype=torch.float64).dtype == torch.float64
    assert seeded_noise(1, "w", (3,), dtype=torch.bfloat16).dtype == torch.float32


def test_ask_is_deterministic_and_steps_differ() -> None:
    es = evolution_strategy(population=8, sigma=0.1, lr=0.1, antithetic=True)
    s0 = es.init(5)
    p0, p0b = es.ask(s0), es.ask(s0)
    assert torch.equal(p0.seeds, p0b.seeds) and p0.seeds.shape == (8,)
    assert torch.equal(p0.seeds[0::2], p0.seeds[1::2]) and torch.equal(p0.signs, torch.tensor([1.0, -1.0] * 4))
    assert not torch.equal(es.ask(s0._replace(step=1)).seeds, p0.seeds)


def test_batched_members_match_in_place_perturbation() -> None:
    """vmap(functional_call) over batched weights equals perturbing the module in place, member by member."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
    x = torch.randn(5, 4, dtype=F64)
    pop = antithetic_population(torch.tensor([3, 9, 27]))
    params = dict(net.named_parameters())
    batched = perturbed_params(params, pop, sigma=0.05)
    out = population_forward(net, batched, x)  # [P, 5, 2]
    before = {k: v.detach().clone() for k, v in params.items()}
    for i, (s, sign) in enumerate(zip(pop.seeds.tolist(), pop.signs.tolist(), strict=True)):
        perturb_(params, s, sigma=0.05, sign=sign)
        torch.testing.assert_close(out[i], net(x).detach(), rtol=1e-12, atol=1e-12)
        restore_(params, s, sigma=0.05, sign=sign)
    for k, v in params.items():
        torch.testing.assert_close(v.detach(), before[k], rtol=0, atol=1e-15)


@given(seed=seeds, scale=st.floats(0.1, 10))
def test_drift_and_sparsity(seed: int, scale: float) -> None:
    g = torch.Generator().manual_seed(seed)
    base = {"w": torch.randn(20, generator=g, dtype=F64) + 3.0}
    delta = torch.randn(20, generator=g, dtype=F64) * (torch.rand(20, generator=g) < 0.7)
    tuned = {"w": base["w"] + delta}
    delta = tuned["w"] - base["w"]  # the represented change (rounding)
    assert float(relative_drift(base, base)) == 0.0
    scaled = {"w": base["w"] + scale * delta}
    torch.testing.assert_close(relative_drift(scaled, base), scale * relative_drift(tuned, base))
    taus = [0.0, 0.1, 0.5, 1.0, 2.0, 10.0]
    s = [float(update_sparsity(tuned, base, tau=t)) for t in taus]
    assert s == sorted(s) and s[0] == 0.0
    assert torch.equal(threshold_update(tuned, base, tau=0.0)["w"], tuned["w"])
    assert torch.equal(threshold_update(tuned, base, tau=float(delta.abs().max()))["w"], base["w"])
    changed = int((delta != 0).sum())
    if changed:
        assert s[-1] == 1.0 and float(update_sparsity(tuned, base, tau=0.5)) * changed == float(
            ((delta != 0) & (delta.abs() <= 0.5)).sum()
        )


def test_bad_inputs_raise_named_errors() -> None:
    pop = EsPopulation(torch.tensor([1, 2]), torch.ones(2))
    with pytest.raises(ShapeError, match="rewards"):
        es_step({"w": torch.zeros(2)}, pop, torch.zeros(3), lr=0.1)
    with pytest.raises(DomainError, match="sigma"):
        es_gradient(torch.zeros(2), torch.zeros(2, 3), sigma=0.0)
    with pytest.raises(ShapeError, match=r"population\.seeds"):
        es_direction({"w": torch.zeros(2)}, EsPopulation(torch.tensor([1.0]), torch.ones(1)), torch.ones(1))
    with pytest.raises(DomainError, match="rewards"):
        zscore_rewards(torch.tensor([1.0, float("nan")]))
    with pytest.raises(DomainError, match="population"):
        evolution_strategy(population=3, sigma=0.1, lr=0.1, antithetic=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pure_functions_do_not_mutate_and_keep_dtype(dtype: torch.dtype) -> None:
    """Contract: no input mutation, float32 and float64, finite outputs (all-equal rewards included)."""
    g = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(3, 2, generator=g, dtype=dtype)}
    pop = antithetic_population(torch.tensor([4, 8]))
    for r in (torch.randn(4, generator=g, dtype=dtype), torch.full((4,), 2.0, dtype=dtype)):
        snapshot = (params["w"].clone(), r.clone(), pop.seeds.clone(), pop.signs.clone())
        outs = [zscore_rewards(r), centered_rank_rewards(r), es_step(params, pop, r, lr=0.1)["w"]]
        outs.append(perturbed_params(params, pop, sigma=0.1)["w"])
        assert all(bool(torch.isfinite(o).all()) for o in outs)
        assert outs[0].dtype == outs[1].dtype == dtype and outs[3].dtype == dtype
        after = (params["w"], r, pop.seeds, pop.signs)
        assert all(torch.equal(a, b) for a, b in zip(snapshot, after, strict=True))


# --- chunked noise: bounded temporaries, same stream, same update ---

_SIZES = [1, 15, 16, 17, NOISE_CHUNK - 1, NOISE_CHUNK + 15, NOISE_CHUNK + 16, 2 * NOISE_CHUNK + 7]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_chunked_noise_is_the_one_shot_cpu_stream(dtype: torch.dtype) -> None:
    """On CPU, the chunked draw equals one torch.randn of the whole tensor (the artifact's noise), at every size."""
    for n in _SIZES:
        gen = torch.Generator().manual_seed(tensor_seed(9, "w"))
        assert torch.equal(seeded_noise(9, "w", (n,), dtype=dtype), torch.randn(n, generator=gen, dtype=dtype)), n


@given(seed=seeds, n=st.integers(0, 300), chunk=st.sampled_from([16, 32, 48, 64]))
@settings(max_examples=30)
def test_noise_chunks_tile_the_tensor(seed: int, n: int, chunk: int) -> None:
    """Chunks are consecutive, at most chunk + 15 long, at least 16 long when split, and concatenate to the noise."""
    parts = [(a, b, v.clone()) for a, b, v in noise_chunks(seed, "w", n, chunk=chunk)]
    starts, stops = [a for a, _, _ in parts], [b for _, b, _ in parts]
    assert (starts == [0, *stops[:-1]] and stops[-1] == n) if parts else n == 0
    assert all(b - a <= chunk + 15 and (len(parts) == 1 or b - a >= 16) for a, b, _ in parts)
    assert torch.equal(torch.cat([v for *_, v in parts]) if parts else torch.zeros(0), seeded_noise(seed, "w", (n,)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_apply_es_step_equals_the_pure_step_exactly(dtype: torch.dtype) -> None:
    """The chunked in-place update performs es_step's float operations: bit-identical, across chunk boundaries."""
    g = torch.Generator().manual_seed(0)
    params = {"big": torch.randn(2 * NOISE_CHUNK + 40, generator=g).to(dtype), "small": torch.randn(3, 5).to(dtype)}
    pop, rewards = antithetic_population(torch.tensor([4, 17, 99])), torch.randn(6, generator=g, dtype=F64)
    delta = es_step(params, pop, rewards, lr=0.3)
    live = {k: v.clone() for k, v in params.items()}
    apply_es_step_(live, pop, rewards, lr=0.3)
    for k, v in params.items():
        assert torch.equal(live[k], v + delta[k].to(dtype)), k


@given(seed=seeds, sigma=st.floats(1e-4, 1.0), sign=st.sampled_from([1.0, -1.0]))
@settings(max_examples=20)
def test_roundtrip_is_perturb_then_restore_bitwise(seed: int, sigma: float, sign: float) -> None:
    g = torch.Generator().manual_seed(seed)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        pair = {
            "a": torch.randn(NOISE_CHUNK + 33, generator=g).to(dtype),
            "b": torch.randn(7, 2, generator=g).to(dtype),
        }
        once = {k: v.clone() for k, v in pair.items()}
        perturb_(pair, seed, sigma=sigma, sign=sign)
        restore_(pair, seed, sigma=sigma, sign=sign)
        roundtrip_(once, seed, sigma=sigma, sign=sign)
        assert all(torch.equal(pair[k], once[k]) for k in pair)


def test_in_place_temporaries_do_not_grow_with_the_largest_tensor() -> None:
    """Peak extra CPU memory of perturb_/restore_/apply_es_step_ is two chunk buffers, for a 16-chunk tensor."""
    from benchmarks.bench_es import peak_extra_bytes

    params = {"w": torch.zeros(16 * NOISE_CHUNK), "b": torch.zeros(5)}
    pop, rewards = EsPopulation(torch.arange(4), torch.ones(4)), torch.arange(4.0, dtype=F64)
    budget = 2 * (NOISE_CHUNK + 15) * 4 + 4096  # two float32 buffers + small tensors (rewards, weights)

    def evaluate_member() -> None:
        perturb_(params, 3, sigma=0.1)
        restore_(params, 3, sigma=0.1)

    assert peak_extra_bytes(evaluate_member) <= budget
    assert peak_extra_bytes(lambda: apply_es_step_(params, pop, rewards, lr=0.1)) <= budget
    assert budget < params["w"].numel() * 4 / 4  # the bound is far below one copy of the largest tensor
