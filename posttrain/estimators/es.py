r"""Evolution strategies (ES) with seed-indexed Gaussian noise: perturb, shape rewards, update.

A population of ``P`` members is described by integer seeds and signs, never by stored noise:
member ``i`` is $\theta + \sigma s_i \varepsilon_{k_i}$ with $s_i \in \{+1, -1\}$
(antithetic pairs share a seed and carry opposite signs) and the noise of every named parameter
tensor is regenerated on demand from its seed (`posttrain.estimators.es_noise`: a pure function of
the member's seed, the tensor's name and the chunk). The functions of one step take an optional
`NoiseCache`: with one, each member's noise is drawn once and reused by the perturbation and the
update (bit-identical results); without, it is regenerated at each use.

The step follows the papers: $\theta^+ = \theta + \alpha \frac1P\sum_i w_i s_i\varepsilon_{k_i}$
with $w$ the shaped rewards (z-score by default) and no explicit $1/\sigma$ (absorbed
in $\alpha$). `evolution_strategy` bundles it as an optax-style
``(init, ask, update)`` triple with an explicit `EsState`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol

import torch
from jaxtyping import Float, Int
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators.es_noise import (
    NOISE_CHUNK,
    NOISE_TAIL,
    NoiseCache,
    chunk_spans,
    members_noise,
    noise_chunks,
    noise_dtype,
    seeded_noise,
    tensor_seed,
)
from posttrain.registry import registry
from posttrain.validate import check_finite, check_float, check_positive, check_tensor

__all__ = [
    "NOISE_CHUNK",
    "NOISE_TAIL",
    "REWARD_SHAPINGS",
    "EsPopulation",
    "EsState",
    "EsUpdate",
    "EvolutionStrategy",
    "NoiseCache",
    "Params",
    "antithetic_gradient",
    "antithetic_population",
    "centered_rank_rewards",
    "check_params",
    "check_population",
    "chunk_spans",
    "es_direction",
    "es_gradient",
    "es_step",
    "evolution_strategy",
    "member_coefficients",
    "members_noise",
    "noise_chunks",
    "noise_dtype",
    "perturbed_params",
    "population_noise",
    "raw_rewards",
    "relative_drift",
    "seeded_noise",
    "shape_rewards",
    "tensor_seed",
    "threshold_update",
    "update_sparsity",
    "zscore_rewards",
]

Params = Mapping[str, Tensor]


class EsPopulation(NamedTuple):
    """Seeds ``[P]`` (int64) and signs ``[P]`` (+1/-1 floats) of the population's members."""

    seeds: Int[Tensor, " P"]
    signs: Float[Tensor, " P"]


class EsState(NamedTuple):
    """ES state: the number of completed steps and the run's key (seeds derive from both)."""

    step: int
    key: int


def check_population(population: EsPopulation) -> EsPopulation:
    seeds = check_tensor("population.seeds", population.seeds, ndim=1)
    signs = check_float("population.signs", population.signs, ndim=1)
    if seeds.is_floating_point() or seeds.dtype == torch.bool:
        raise ShapeError(f"population.seeds: expected an integer dtype, got {seeds.dtype}")
    if seeds.shape != signs.shape or seeds.numel() == 0:
        raise ShapeError(
            f"population.signs: expected a non-empty shape equal to seeds' {list(seeds.shape)}, got {list(signs.shape)}"
        )
    return population


def population_noise(
    population: EsPopulation,
    name: str,
    shape: torch.Size | tuple[int, ...],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    mix_names: bool = True,
    cache: NoiseCache | None = None,
) -> Tensor:
    r"""Signed noise of every member for one tensor, ``[P, *shape]``: row ``i`` is $s_i\varepsilon_{k_i}$.

    One stream per seed is unavoidable (each member's noise is defined by its own seed); the loop
    over members only draws noise (one re-seeded generator, or the values kept in ``cache``),
    everything downstream is batched.
    """
    check_population(population)
    shape = tuple(shape)
    seeds = population.seeds.tolist()
    kept = members_noise(seeds, name, math.prod(shape), dtype=dtype, device=device, mix_names=mix_names, cache=cache)
    noise = kept.view(len(seeds), *shape)
    signs = population.signs.to(device=noise.device, dtype=noise.dtype)
    return noise * signs.reshape((-1,) + (1,) * len(tuple(shape)))


def antithetic_population(seeds: Int[Tensor, " N"]) -> EsPopulation:
    """Mirrored pairs: each seed twice, signs ``(+1, -1)``, so ``P = 2N``.

    Examples:
        >>> antithetic_population(torch.tensor([5, 9]))
        EsPopulation(seeds=tensor([5, 5, 9, 9]), signs=tensor([ 1., -1.,  1., -1.]))
    """
    check_tensor("seeds", seeds, ndim=1)
    signs = torch.tensor([1.0, -1.0]).repeat(seeds.shape[0])
    return EsPopulation(seeds.repeat_interleave(2), signs)


def _check_rewards(rewards: Tensor) -> Tensor:
    check_float("rewards", rewards, ndim=1)
    if rewards.numel() == 0:
        raise ShapeError("rewards: expected at least one member, got shape [0]")
    return check_finite("rewards", rewards)


def zscore_rewards(rewards: Float[Tensor, " P"], *, eps: float = 1e-8) -> Float[Tensor, " P"]:
    r"""Population z-scores $z_i = (R_i - \bar R)/(\sqrt{P^{-1}\sum_j (R_j-\bar R)^2} + \epsilon)$.

    Population std (ddof 0) and ``eps = 1e-8`` as in Qiu et al. 2025 (arXiv:2509.24372) and Ba et
    al. 2026 (arXiv:2608.27351, Eq. 7); equal rewards give exactly zero.

    Examples:
        >>> zscore_rewards(torch.tensor([0., 2.])).tolist()
        [-1.0, 1.0]
    """
    _check_rewards(rewards)
    eps = check_positive("eps", eps)
    centred = rewards - rewards.mean()
    return centred / (torch.linalg.vector_norm(centred) / rewards.shape[0] ** 0.5 + eps)  # 0 gradient at 0


def centered_rank_rewards(rewards: Float[Tensor, " P"]) -> Float[Tensor, " P"]:
    r"""Centred ranks (Salimans et al. 2017, arXiv:1703.03864): $u_i = \mathrm{rank}_i/(P-1) - 1/2$.

    Ranks start at 0; ties get their average rank, so the output depends on the rewards only
    through their order and is invariant to any strictly increasing transform. ``P == 1`` gives 0.

    Examples:
        >>> centered_rank_rewards(torch.tensor([10., -3., 4.])).tolist()
        [0.5, -0.5, 0.0]
    """
    _check_rewards(rewards)
    p = rewards.shape[0]
    if p == 1:
        return torch.zeros_like(rewards)
    less = (rewards[None, :] < rewards[:, None]).sum(dim=1)
    equal = (rewards[None, :] == rewards[:, None]).sum(dim=1)
    ranks = less.to(rewards.dtype) + (equal.to(rewards.dtype) - 1.0) / 2.0  # [P] average ranks
    return ranks / (p - 1) - 0.5


def raw_rewards(rewards: Float[Tensor, " P"]) -> Float[Tensor, " P"]:
    """The rewards unchanged (checked): the score-function estimator up to $1/\\sigma$."""
    return _check_rewards(rewards)


REWARD_SHAPINGS = registry("es_reward_shaping")
"""How member rewards become update weights: ``es.shaping`` / ``shaping=`` name one of these."""
REWARD_SHAPINGS.add("zscore", zscore_rewards, paper="Qiu et al. 2025, ES at Scale, arXiv:2509.24372")
REWARD_SHAPINGS.add("centered_ranks", centered_rank_rewards, paper="Salimans et al. 2017, arXiv:1703.03864")
REWARD_SHAPINGS.add("none", raw_rewards)


def _check_shaping(shaping: str) -> str:
    if shaping not in REWARD_SHAPINGS:
        raise DomainError(f"shaping: unknown reward shaping {shaping!r}; valid: {REWARD_SHAPINGS.names()}")
    return shaping


def shape_rewards(rewards: Float[Tensor, " P"], shaping: str = "zscore") -> Float[Tensor, " P"]:
    """Member rewards shaped by the `REWARD_SHAPINGS` entry ``shaping`` (DomainError naming it if unknown)."""
    return REWARD_SHAPINGS.get(_check_shaping(shaping))(rewards)  # type: ignore[operator,no-any-return]


def es_gradient(rewards: Float[Tensor, " P"], noise: Float[Tensor, "P D"], *, sigma: float) -> Float[Tensor, " D"]:
    r"""One-point ES estimate $\hat g = \frac{1}{P\sigma}\sum_i R_i\varepsilon_i$ of $\nabla F_\sigma$.

    $F_\sigma(\theta) = \mathbb E_\varepsilon F(\theta + \sigma\varepsilon)$; the estimate is
    unbiased for $\nabla F_\sigma$ (Ba et al. 2026, Eq. 6). ``noise`` holds the signed
    directions of the members, so a mirrored population gives the antithetic estimator.

    Examples:
        >>> es_gradient(torch.tensor([1., -1.]), torch.tensor([[1., 0.], [-1., 0.]]), sigma=0.5).tolist()
        [2.0, 0.0]
    """
    _check_rewards(rewards)
    check_float("noise", noise, ndim=2)
    if noise.shape[0] != rewards.shape[0]:
        raise ShapeError(f"noise: expected {rewards.shape[0]} rows (one per reward), got shape {list(noise.shape)}")
    sigma = check_positive("sigma", sigma)
    return (rewards.to(noise.dtype) @ noise) / (rewards.shape[0] * sigma)


def antithetic_gradient(
    rewards_plus: Float[Tensor, " N"], rewards_minus: Float[Tensor, " N"], noise: Float[Tensor, "N D"], *, sigma: float
) -> Float[Tensor, " D"]:
    r"""Two-point (antithetic) ES estimate of $\nabla F_\sigma$.

    $$
    \hat g^{2p} = \frac{1}{2N\sigma}\sum_i
    [F(\theta+\sigma\varepsilon_i) - F(\theta-\sigma\varepsilon_i)]\varepsilon_i
    $$


    Equal to `es_gradient` on the mirrored population (Ba et al. 2026, App. E); exactly
    $\frac1N\sum_i (\nabla F^\top\varepsilon_i)\varepsilon_i$ for quadratic $F$.

    Examples:
        >>> antithetic_gradient(torch.tensor([3.]), torch.tensor([1.]), torch.tensor([[1., 2.]]), sigma=0.5).tolist()
        [2.0, 4.0]
    """
    check_float("rewards_plus", rewards_plus, ndim=1)
    check_float("rewards_minus", rewards_minus, ndim=1)
    if rewards_minus.shape != rewards_plus.shape:
        raise ShapeError("rewards_minus: expected a tensor with the shape of rewards_plus")
    return es_gradient(rewards_plus - rewards_minus, noise, sigma=2.0 * check_positive("sigma", sigma))


def check_params(params: Params) -> Params:
    if not isinstance(params, Mapping) or not params:
        raise ShapeError("params: expected a non-empty mapping from names to tensors")
    for name, p in params.items():
        check_float(f"params[{name!r}]", p)
    return params


def perturbed_params(
    params: Params,
    population: EsPopulation,
    *,
    sigma: float,
    mix_names: bool = True,
    cache: NoiseCache | None = None,
) -> dict[str, Tensor]:
    r"""Batched member weights ``{name: [P, *shape]}``, row ``i`` = $\theta + \sigma s_i\varepsilon_{k_i}$.

    Feed to `population_forward` (``vmap`` over ``functional_call``) or to batched matmuls to
    evaluate every member in one pass. Costs ``P`` copies of the parameters: for small models only.
    Pass the step's ``cache`` to `es_step` too, and the update reuses this noise instead of drawing it again.
    """
    check_params(params)
    sigma = check_positive("sigma", sigma, strict=False)
    out = {}
    for name, p in params.items():
        eps = population_noise(
            population, name, p.shape, dtype=p.dtype, device=p.device, mix_names=mix_names, cache=cache
        )
        out[name] = (p.detach().unsqueeze(0) + sigma * eps).to(p.dtype)
    return out


def member_coefficients(population: EsPopulation, weights: Tensor) -> list[float]:
    """$w_i s_i / P$ per member, in float64."""
    return (weights.double() * population.signs.double() / weights.shape[0]).tolist()


def es_direction(
    params: Params,
    population: EsPopulation,
    weights: Float[Tensor, " P"],
    *,
    mix_names: bool = True,
    cache: NoiseCache | None = None,
) -> dict[str, Tensor]:
    r"""Decomposed search direction $d^{(n)} = \frac1P\sum_i w_i s_i\varepsilon^{(n)}_{k_i}$ per tensor.

    Computed tensor by tensor and member by member with one accumulator per tensor (float32, or
    float64 for float64 parameters), as in ES-at-Scale's decomposed update; returned in the
    accumulator dtype. The noise comes from ``cache`` where it keeps it (the step's draws), else it
    is regenerated from the seeds.
    """
    check_params(params)
    check_population(population)
    check_float("weights", weights, ndim=1)
    if weights.shape != population.seeds.shape:
        raise ShapeError(
            f"weights: expected shape {list(population.seeds.shape)} (one per member), got {list(weights.shape)}"
        )
    coef = member_coefficients(population, weights)
    seeds = population.seeds.tolist()
    cache = NoiseCache(0) if cache is None else cache
    out = {}
    for name, p in params.items():
        acc = torch.zeros(p.numel(), dtype=noise_dtype(p.dtype), device=p.device)
        kept = cache.members(seeds, name, p.numel(), dtype=p.dtype, device=p.device, mix_names=mix_names)
        rows = kept.unbind(0) if kept is not None else None
        for i, (s, c) in enumerate(zip(seeds, coef, strict=True)):
            if c != 0.0:  # without the step's draws, one member's noise at a time is regenerated
                eps = rows[i] if rows is not None else seeded_noise(s, name, (p.numel(),), dtype=p.dtype,
                                                                    device=p.device, mix_names=mix_names, cache=cache)  # fmt: skip
                acc.add_(eps, alpha=c)
        out[name] = acc.view(p.shape)
    return out


def es_step(
    params: Params,
    population: EsPopulation,
    rewards: Float[Tensor, " P"],
    *,
    lr: float,
    shaping: str = "zscore",
    mix_names: bool = True,
    cache: NoiseCache | None = None,
) -> dict[str, Tensor]:
    r"""The ES update $\Delta^{(n)} = \alpha\frac1P\sum_i w_i s_i\varepsilon^{(n)}_{k_i}$ (w: shaped rewards).

    Pure: returns the per-tensor increments (accumulator dtype) and leaves ``params`` untouched.
    All-equal rewards under z-scoring give exactly zero increments.

    Args:
        params: the centre, ``{name: tensor}``. population: the members' seeds and signs.
        rewards: ``[P]`` fitness of each member. lr: $\alpha$ (absorbs $1/\sigma$).
        shaping: reward shaping. mix_names: name-mixed seeding.
        cache: the step's `NoiseCache` (e.g. filled by `perturbed_params`); None regenerates the noise.

    References:
        Qiu et al. 2025 (arXiv:2509.24372); Ba et al. 2026 (arXiv:2608.27351, Eq. 7).

    Examples:
        >>> pop = EsPopulation(torch.tensor([1, 2]), torch.tensor([1., 1.]))
        >>> d = es_step({"w": torch.zeros(3)}, pop, torch.tensor([1., 1.]), lr=0.1)
        >>> d["w"].tolist()
        [0.0, 0.0, 0.0]
    """
    if population.seeds.shape != getattr(rewards, "shape", None):
        raise ShapeError(f"rewards: expected shape {list(population.seeds.shape)} (one per member)")
    lr = check_positive("lr", lr, strict=False)
    weights = shape_rewards(rewards, shaping)
    direction = es_direction(params, population, weights, mix_names=mix_names, cache=cache)
    return {n: lr * d for n, d in direction.items()}


class EsUpdate(Protocol):
    """``update(params, population, rewards, state, cache=None) -> (new_params, new_state)``."""

    def __call__(
        self,
        params: Params,
        population: EsPopulation,
        rewards: Tensor,
        state: EsState,
        /,
        cache: NoiseCache | None = None,
    ) -> tuple[dict[str, Tensor], EsState]: ...


class EvolutionStrategy(NamedTuple):
    """An optax-style ES triple: ``init(key) -> state``, ``ask(state) -> population``,
    ``update(params, population, rewards, state, cache=None) -> (new_params, new_state)``."""

    init: Callable[[int], EsState]
    ask: Callable[[EsState], EsPopulation]
    update: EsUpdate


def evolution_strategy(
    *,
    population: int,
    sigma: float,
    lr: float,
    antithetic: bool = False,
    shaping: str = "zscore",
    mix_names: bool = True,
) -> EvolutionStrategy:
    r"""Build the ES ``(init, ask, update)`` triple (defaults: one-point ES with z-scores, as both papers).

    ``ask`` draws ``population`` 31-bit seeds (or ``population // 2`` mirrored pairs) from a
    generator seeded with ``(key, step)``, so the same state always asks for the same members.
    ``update`` returns $\theta + \alpha\frac1P\sum_i w_i s_i\varepsilon_{k_i}$ (the members are
    evaluated at $\theta + \sigma s_i\varepsilon_{k_i}$ by the caller, e.g. with
    `perturbed_params` or `posttrain.llm.es.params.perturb_`); given the `NoiseCache` the members were
    perturbed with, it reuses their noise (the same result, no second draw).

    Examples:
        >>> es = evolution_strategy(population=4, sigma=0.1, lr=0.01)
        >>> state = es.init(0)
        >>> pop = es.ask(state)
        >>> params, state = es.update({"w": torch.zeros(2)}, pop, torch.arange(4.0), state)
        >>> state.step, params["w"].shape
        (1, torch.Size([2]))
    """
    if population < 1 or (antithetic and population % 2):
        raise DomainError(f"population: expected a positive (even when antithetic) integer, got {population}")
    check_positive("sigma", sigma)
    check_positive("lr", lr, strict=False)
    _check_shaping(shaping)  # an unknown name fails here, not at the first update

    def init(key: int) -> EsState:
        if key < 0:
            raise DomainError(f"key: expected a non-negative integer, got {key}")
        return EsState(step=0, key=int(key))

    def ask(state: EsState) -> EsPopulation:
        gen = torch.Generator().manual_seed(tensor_seed(state.key, f"es-step-{state.step}"))
        n = population // 2 if antithetic else population
        seeds = torch.randint(0, 2**31 - 1, (n,), generator=gen, dtype=torch.int64)
        if antithetic:
            return antithetic_population(seeds)
        return EsPopulation(seeds, torch.ones(n))

    def update(
        params: Params, pop: EsPopulation, rewards: Tensor, state: EsState, cache: NoiseCache | None = None
    ) -> tuple[dict[str, Tensor], EsState]:
        delta = es_step(params, pop, rewards, lr=lr, shaping=shaping, mix_names=mix_names, cache=cache)
        new = {n: (p.detach() + delta[n]).to(p.dtype) for n, p in params.items()}
        return new, EsState(step=state.step + 1, key=state.key)

    return EvolutionStrategy(init, ask, update)


def _deltas(params: Params, base: Params) -> dict[str, Tensor]:
    check_params(params)
    if set(params) != set(base):
        raise ShapeError("base: expected the same tensor names as params")
    for n in params:
        if params[n].shape != base[n].shape:
            raise ShapeError(f"base[{n!r}]: expected shape {list(params[n].shape)}, got {list(base[n].shape)}")
    return {n: params[n].detach().double() - base[n].detach().double() for n in params}


def relative_drift(params: Params, base: Params) -> Tensor:
    r"""Relative drift $\|\theta - \theta_0\|_2 / \|\theta_0\|_2$ over all tensors (Ba et al. 2026, §3.6).

    Examples:
        >>> float(relative_drift({"w": torch.tensor([3., 4.])}, {"w": torch.tensor([0., 4.])}))
        0.75
    """
    delta = _deltas(params, base)
    num = torch.stack([d.square().sum() for d in delta.values()]).sum().sqrt()
    den = torch.stack([b.detach().double().square().sum() for b in base.values()]).sum().sqrt()
    if float(den) == 0.0:
        raise DomainError("base: the base parameters are all zero, relative drift is undefined")
    return num / den


def update_sparsity(params: Params, base: Params, *, tau: float) -> Tensor:
    r"""Fraction of changed coordinates with small change: $|\{0<|\Delta_i|\le\tau\}| / |\{|\Delta_i|>0\}|$.

    Coordinates with exactly zero change are excluded from both counts; returns 0 when nothing
    changed (Ba et al. 2026, §3.6).

    Examples:
        >>> float(update_sparsity({"w": torch.tensor([1., 2., 5.])}, {"w": torch.tensor([1., 1., 1.])}, tau=1.5))
        0.5
    """
    tau = check_positive("tau", tau, strict=False)
    delta = torch.cat([d.reshape(-1).abs() for d in _deltas(params, base).values()])
    changed = (delta > 0).sum()
    small = ((delta > 0) & (delta <= tau)).sum()
    return small.double() / changed.clamp_min(1).double()


def threshold_update(params: Params, base: Params, *, tau: float) -> dict[str, Tensor]:
    r"""Magnitude-thresholded checkpoint: coordinates with $0<|\Delta_i|\le\tau$ reset to the base value."""
    tau = check_positive("tau", tau, strict=False)
    delta = _deltas(params, base)
    return {n: torch.where(delta[n].abs() <= tau, base[n], params[n]) for n in params}
