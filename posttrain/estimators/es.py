r"""Evolution strategies (ES) with seed-indexed Gaussian noise: perturb, shape rewards, update.

A population of ``P`` members is described by integer seeds and signs, never by stored noise:
member ``i`` is $\theta + \sigma s_i \varepsilon_{k_i}$ with $s_i \in \{+1, -1\}$
(antithetic pairs share a seed and carry opposite signs) and the noise of every named parameter
tensor is regenerated on demand from a ``torch.Generator`` seeded with
$k_i \oplus h(\text{name})$, ``h`` the 64-bit little-endian BLAKE2b digest of the name
(Ba et al. 2026, arXiv:2608.27351, App. G.1). Mixing the name into the seed gives independent
noise to same-shaped tensors; ``mix_names=False`` reproduces the correlated seeding of the
original ES-at-Scale scripts (Qiu et al. 2025, arXiv:2509.24372) for comparison only.

Noise is drawn in float32 (float64 for float64 parameters), scaled, then cast to the parameter
dtype; update directions are accumulated tensor by tensor in that precision. Streams differ
between devices (CPU and CUDA generators are different algorithms): pick one device per run.

A tensor's noise is drawn from its one generator in consecutive flat chunks of
`NOISE_CHUNK` elements (`noise_chunks`), so the in-place operations on a model's
parameters (`posttrain.llm.es.params`) hold one or two chunk-sized buffers, whatever the size
of the largest parameter. On CPU the chunked stream is bit-identical to one ``torch.randn`` of the
whole tensor (the artifact's draw), which the tests check.

The step follows the papers: $\theta^+ = \theta + \alpha \frac1P\sum_i w_i s_i\varepsilon_{k_i}$
with $w$ the shaped rewards (z-score by default) and no explicit $1/\sigma$ (absorbed
in $\alpha$). `evolution_strategy` bundles it as an optax-style
``(init, ask, update)`` triple with an explicit `EsState`.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.registry import registry
from posttrain.validate import check_finite, check_float, check_positive, check_tensor

__all__ = [
    "NOISE_CHUNK",
    "NOISE_TAIL",
    "REWARD_SHAPINGS",
    "EsPopulation",
    "EsState",
    "EvolutionStrategy",
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
_MASK64 = (1 << 64) - 1
NOISE_CHUNK = 1 << 14
"""Elements per noise chunk (64 KiB of float32): the bound on the in-place operations' temporaries."""
NOISE_TAIL = 16  # CPU normal_ transforms blocks of 16 and redraws a shorter tail: a last chunk is >= 16 long


class EsPopulation(NamedTuple):
    """Seeds ``[P]`` (int64) and signs ``[P]`` (+1/-1 floats) of the population's members."""

    seeds: Int[Tensor, " P"]
    signs: Float[Tensor, " P"]


class EsState(NamedTuple):
    """ES state: the number of completed steps and the run's key (seeds derive from both)."""

    step: int
    key: int


def tensor_seed(seed: int, name: str, *, mix_names: bool = True) -> int:
    r"""The generator seed of tensor ``name`` in member ``seed``: $k \oplus h(\text{name})$.

    ``h`` is BLAKE2b with an 8-byte digest read little-endian (the paper's artifact). With
    ``mix_names=False`` every tensor uses ``seed`` itself (original ES-at-Scale scripts).

    Examples:
        >>> tensor_seed(7, "w", mix_names=False)
        7
        >>> tensor_seed(7, "w") == tensor_seed(7, "w") != tensor_seed(7, "b")
        True
    """
    if seed < 0:
        raise DomainError(f"seed: expected a non-negative integer, got {seed}")
    if not mix_names:
        return int(seed) & _MASK64
    digest = int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "little")
    return (int(seed) ^ digest) & _MASK64


def noise_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def seeded_noise(
    seed: int,
    name: str,
    shape: torch.Size | tuple[int, ...],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    mix_names: bool = True,
) -> Tensor:
    r"""Standard normal noise for tensor ``name`` of member ``seed``: a pure function of its arguments.

    Drawn with a fresh ``torch.Generator`` on ``device`` seeded by `tensor_seed`, in float64
    when ``dtype`` is float64 and float32 otherwise (the caller casts after scaling), in the flat
    chunks of `noise_chunks`; on CPU this equals one ``torch.randn(shape)`` from that generator.

    Args:
        seed: the member's non-negative integer seed. name: the tensor's stable name.
        shape: the tensor's shape. dtype: the parameter dtype. device: where to draw.
        mix_names: mix the name into the seed (default; independent noise per tensor).

    Returns:
        a tensor of ``shape`` with i.i.d. $\mathcal N(0, 1)$ entries.

    Examples:
        >>> bool((seeded_noise(3, "w", (2, 2)) == seeded_noise(3, "w", (2, 2))).all())
        True
    """
    out = torch.empty(tuple(shape), dtype=noise_dtype(dtype), device=device)
    flat, gen = out.view(-1), _generator(seed, name, device, mix_names)
    for start, stop in chunk_spans(flat.numel(), NOISE_CHUNK):
        flat[start:stop].normal_(generator=gen)  # the chunks of noise_chunks, drawn in place
    return out


def chunk_spans(numel: int, chunk: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive ``chunk``-long spans of ``numel``; a last one shorter than 16 joins the one before."""
    if chunk < NOISE_TAIL or chunk % NOISE_TAIL:
        raise DomainError(f"chunk: expected a positive multiple of {NOISE_TAIL}, got {chunk}")
    starts = list(range(0, numel, chunk))
    if len(starts) > 1 and numel - starts[-1] < NOISE_TAIL:
        starts.pop()
    return list(itertools.pairwise([*starts, numel]))


def _generator(seed: int, name: str, device: torch.device | str | None, mix_names: bool) -> torch.Generator:
    gen = torch.Generator(device=device if device is not None else "cpu")
    return gen.manual_seed(tensor_seed(seed, name, mix_names=mix_names))


def noise_chunks(
    seed: int,
    name: str,
    numel: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    mix_names: bool = True,
    chunk: int = NOISE_CHUNK,
    out: Tensor | None = None,
) -> Iterator[tuple[int, int, Tensor]]:
    r"""The flat noise of tensor ``name`` of member ``seed`` as ``(start, stop, values)`` chunks.

    ``values`` (``[stop - start]``) are the next draws of the tensor's one generator; every chunk is
    ``chunk`` long except the last, which absorbs a remainder shorter than 16. ``values`` is a view
    of one reused buffer (``out`` if given, at least ``chunk + 15`` elements): consume it before the
    next chunk. Concatenated, the chunks are `seeded_noise` flattened.

    Examples:
        >>> parts = [v.clone() for _, _, v in noise_chunks(3, "w", 40, chunk=16)]
        >>> [len(v) for v in parts], bool(torch.equal(torch.cat(parts), seeded_noise(3, "w", (40,))))
        ([16, 24], True)
    """
    spans = chunk_spans(numel, chunk)
    gen = _generator(seed, name, device, mix_names)
    width = max((b - a for a, b in spans), default=0)
    buf = torch.empty(width, dtype=noise_dtype(dtype), device=device) if out is None else out
    for start, stop in spans:
        yield start, stop, buf[: stop - start].normal_(generator=gen)


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
) -> Tensor:
    r"""Signed noise of every member for one tensor, ``[P, *shape]``: row ``i`` is $s_i\varepsilon_{k_i}$.

    One generator per seed is unavoidable (each member's stream is defined by its own seed); the
    loop over members only draws noise, everything downstream is batched.
    """
    check_population(population)
    noise = torch.stack(
        [
            seeded_noise(int(s), name, shape, dtype=dtype, device=device, mix_names=mix_names)
            for s in population.seeds.tolist()
        ]
    )
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


def shape_rewards(rewards: Float[Tensor, " P"], shaping: str = "zscore") -> Float[Tensor, " P"]:
    """Member rewards shaped by the `REWARD_SHAPINGS` entry ``shaping`` (RegistryError for an unknown name)."""
    return REWARD_SHAPINGS.get(shaping)(rewards)  # type: ignore[operator,no-any-return]


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
    if not isinstance(rewards_minus, Tensor) or rewards_minus.shape != getattr(rewards_plus, "shape", None):
        raise ShapeError("rewards_minus: expected a tensor with the shape of rewards_plus")
    return es_gradient(rewards_plus - rewards_minus, noise, sigma=2.0 * check_positive("sigma", sigma))


def check_params(params: Params) -> Params:
    if not isinstance(params, Mapping) or not params:
        raise ShapeError("params: expected a non-empty mapping from names to tensors")
    for name, p in params.items():
        check_float(f"params[{name!r}]", p)
    return params


def perturbed_params(
    params: Params, population: EsPopulation, *, sigma: float, mix_names: bool = True
) -> dict[str, Tensor]:
    r"""Batched member weights ``{name: [P, *shape]}``, row ``i`` = $\theta + \sigma s_i\varepsilon_{k_i}$.

    Feed to `population_forward` (``vmap`` over ``functional_call``) or to batched matmuls to
    evaluate every member in one pass. Costs ``P`` copies of the parameters: for small models only.
    """
    check_params(params)
    sigma = check_positive("sigma", sigma, strict=False)
    out = {}
    for name, p in params.items():
        eps = population_noise(population, name, p.shape, dtype=p.dtype, device=p.device, mix_names=mix_names)
        out[name] = (p.detach().unsqueeze(0) + sigma * eps).to(p.dtype)
    return out


def member_coefficients(population: EsPopulation, weights: Tensor) -> list[float]:
    """$w_i s_i / P$ per member, in float64."""
    return (weights.double() * population.signs.double() / weights.shape[0]).tolist()


def es_direction(
    params: Params, population: EsPopulation, weights: Float[Tensor, " P"], *, mix_names: bool = True
) -> dict[str, Tensor]:
    r"""Decomposed search direction $d^{(n)} = \frac1P\sum_i w_i s_i\varepsilon^{(n)}_{k_i}$ per tensor.

    Computed tensor by tensor and member by member with one accumulator per tensor (float32, or
    float64 for float64 parameters), as in ES-at-Scale's decomposed update; returned in the
    accumulator dtype.
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
    out = {}
    for name, p in params.items():
        acc = torch.zeros(p.shape, dtype=noise_dtype(p.dtype), device=p.device)
        for s, c in zip(seeds, coef, strict=True):
            if c != 0.0:
                acc.add_(
                    seeded_noise(int(s), name, p.shape, dtype=p.dtype, device=p.device, mix_names=mix_names), alpha=c
                )
        out[name] = acc
    return out


def es_step(
    params: Params,
    population: EsPopulation,
    rewards: Float[Tensor, " P"],
    *,
    lr: float,
    shaping: str = "zscore",
    mix_names: bool = True,
) -> dict[str, Tensor]:
    r"""The ES update $\Delta^{(n)} = \alpha\frac1P\sum_i w_i s_i\varepsilon^{(n)}_{k_i}$ (w: shaped rewards).

    Pure: returns the per-tensor increments (accumulator dtype) and leaves ``params`` untouched.
    All-equal rewards under z-scoring give exactly zero increments.

    Args:
        params: the centre, ``{name: tensor}``. population: the members' seeds and signs.
        rewards: ``[P]`` fitness of each member. lr: $\alpha$ (absorbs $1/\sigma$).
        shaping: reward shaping. mix_names: name-mixed seeding.

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
    return {n: lr * d for n, d in es_direction(params, population, weights, mix_names=mix_names).items()}


class EvolutionStrategy(NamedTuple):
    """An optax-style ES triple: ``init(key) -> state``, ``ask(state) -> population``,
    ``update(params, population, rewards, state) -> (new_params, new_state)``."""

    init: Callable[[int], EsState]
    ask: Callable[[EsState], EsPopulation]
    update: Callable[[Params, EsPopulation, Tensor, EsState], tuple[dict[str, Tensor], EsState]]


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
    `perturbed_params` or `posttrain.llm.es.params.perturb_`).

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
    REWARD_SHAPINGS.get(shaping)  # an unknown name fails here, not at the first update

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

    def update(params: Params, pop: EsPopulation, rewards: Tensor, state: EsState) -> tuple[dict[str, Tensor], EsState]:
        delta = es_step(params, pop, rewards, lr=lr, shaping=shaping, mix_names=mix_names)
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
