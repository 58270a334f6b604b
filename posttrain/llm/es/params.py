r"""In-place ES on a model's parameters: perturb, restore and update tensors chunk by chunk, and vmapped members.

The stateful half of evolution strategies: the noise, the reward shaping and the update maths are
the pure functions of `posttrain.estimators.es`; here they are applied to live parameters in
place (under ``torch.no_grad``) with the noise regenerated in `NOISE_CHUNK`-element
chunks (`noise_chunks`) through one or two reused buffers, so the extra
memory is independent of the parameters' sizes, and a module's members are evaluated in one
``vmap`` of ``functional_call`` (`population_forward`).

Every function takes the step's optional `NoiseCache`: what it keeps is drawn once per
member and step and reused by `perturb_`, `restore_` and `apply_es_step_` (the same values, so the
same weights, bit for bit); what it does not keep is regenerated from the seed. `step_noise_cache`
spends a byte budget on the smallest tensors of every member (norms, biases: a generator seeding
each, few elements), where drawing once saves the most per byte; the large matrices, whose
population noise could not be stored on an LLM, are regenerated chunk by chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from jaxtyping import Float
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators import EsPopulation, noise_chunks, shape_rewards
from posttrain.estimators.es import (
    NOISE_CHUNK,
    NOISE_TAIL,
    NoiseCache,
    Params,
    check_params,
    check_population,
    chunk_spans,
    member_coefficients,
    noise_dtype,
)
from posttrain.validate import check_positive

__all__ = ["apply_es_step_", "perturb_", "population_forward", "restore_", "roundtrip_", "step_noise_cache"]


def step_noise_cache(params: Params, population: int, *, max_bytes: float) -> NoiseCache:
    """A step's `NoiseCache` keeping the noise of the smallest tensors of all ``population`` members, ``max_bytes`` in all.

    Tensors are taken by increasing size while ``population`` copies of their noise (float32, float64
    for float64 parameters) fit in ``max_bytes``; larger ones are regenerated. ``max_bytes=0``: pure
    regeneration (nothing kept).

    Examples:
        >>> params = {"w": torch.zeros(64, 64), "norm": torch.zeros(64)}
        >>> cache = step_noise_cache(params, 8, max_bytes=4096)  # 8 x 64 float32 = 2 KiB: the norm only
        >>> cache.max_numel, cache.max_bytes
        (64, 2048)
    """
    check_params(params)
    if population < 1:
        raise DomainError(f"population: expected a positive number of members, got {population}")
    if not max_bytes >= 0:
        raise DomainError(f"max_bytes: expected a non-negative number of bytes, got {max_bytes}")
    by_size: dict[int, int] = {}  # tensor size -> bytes of the population's noise of all tensors of that size
    for p in params.values():
        by_size[p.numel()] = by_size.get(p.numel(), 0) + population * p.numel() * noise_dtype(p.dtype).itemsize
    kept, max_numel = 0, 0
    for numel in sorted(by_size):  # whole size classes, so that what is planned is what gets kept
        if kept + by_size[numel] > max_bytes:
            break
        kept, max_numel = kept + by_size[numel], numel
    return NoiseCache(kept, max_numel=max_numel)


def perturb_(
    params: Params,
    seed: int,
    *,
    sigma: float,
    sign: float = 1.0,
    mix_names: bool = True,
    cache: NoiseCache | None = None,
) -> None:
    r"""In place, per tensor: $\theta^{(n)} \leftarrow \theta^{(n)} + \mathrm{sign}\,\sigma\varepsilon^{(n)}_{k}$.

    The noise comes in `NOISE_CHUNK`-element chunks (`noise_chunks`) through one reused
    buffer, so the peak extra memory is one chunk (plus its cast for low-precision parameters),
    independent of the parameters' sizes; tensors the step's ``cache`` keeps are drawn once and
    reused by `restore_` and `apply_es_step_`. Tied parameters must appear once in ``params``
    (``named_parameters()`` deduplicates). Runs under ``torch.no_grad()``.
    """
    _add_noise_(params, seed, sigma=sigma, sign=sign, mix_names=mix_names, roundtrip=False, cache=cache)


def _add_noise_(
    params: Params, seed: int, *, sigma: float, sign: float, mix_names: bool, roundtrip: bool, cache: NoiseCache | None
) -> None:
    """``p += d`` (or, with ``roundtrip``, ``p = (p + d) - d``) per chunk, ``d = sign * sigma * noise`` cast to ``p``."""
    check_params(params)
    sigma = check_positive("sigma", sigma, strict=False)
    buffer = _chunk_buffer(params)
    with torch.no_grad():
        for name, p in params.items():
            flat, buf = _flat_view(p), buffer(p)
            for start, stop, eps in noise_chunks(seed, name, p.numel(), dtype=p.dtype, device=p.device,
                                                 mix_names=mix_names, out=buf, cache=cache):  # fmt: skip
                d = torch.mul(eps, sign * sigma, out=buf[: stop - start]).to(p.dtype)  # kept noise stays intact
                part = flat[start:stop].add_(d)
                if roundtrip:
                    part.sub_(d)
            _write_back(p, flat)


def _chunk_buffer(params: Params) -> Callable[[Tensor], Tensor]:
    """``buffer(p)``: one chunk buffer per (noise dtype, device) of ``params``, allocated once and reused."""
    width: dict[tuple[torch.dtype, torch.device], int] = {}
    for p in params.values():
        key = (noise_dtype(p.dtype), p.device)
        width[key] = max(width.get(key, 0), min(p.numel(), NOISE_CHUNK + NOISE_TAIL - 1))
    bufs = {key: torch.empty(w, dtype=key[0], device=key[1]) for key, w in width.items()}
    return lambda p: bufs[(noise_dtype(p.dtype), p.device)]


def _flat_view(p: Tensor) -> Tensor:
    """``p`` flattened without a copy when contiguous (the usual case for parameters), else a contiguous copy."""
    return p.view(-1) if p.is_contiguous() else p.contiguous().view(-1)


def _write_back(p: Tensor, flat: Tensor) -> None:
    if not p.is_contiguous():
        p.copy_(flat.view(p.shape))


def restore_(
    params: Params,
    seed: int,
    *,
    sigma: float,
    sign: float = 1.0,
    mix_names: bool = True,
    cache: NoiseCache | None = None,
) -> None:
    """Undo `perturb_` by subtracting the same noise, kept in ``cache`` or regenerated (exact only in exact arithmetic)."""
    perturb_(params, seed, sigma=sigma, sign=-sign, mix_names=mix_names, cache=cache)


def roundtrip_(
    params: Params,
    seed: int,
    *,
    sigma: float,
    sign: float = 1.0,
    mix_names: bool = True,
    cache: NoiseCache | None = None,
) -> None:
    r"""`perturb_` then `restore_` with nothing in between, drawing the noise once.

    Bit-identical to the pair ($\theta \leftarrow (\theta + d) - d$ with the same rounded
    $d = \mathrm{sign}\,\sigma\varepsilon$, and $-d$ is exact), at half the noise cost:
    how a process replays the members it does not evaluate to stay bit-identical to one process.

    Examples:
        >>> a, b = {"w": torch.linspace(-1, 1, 40)}, {"w": torch.linspace(-1, 1, 40)}
        >>> perturb_(a, 4, sigma=0.3); restore_(a, 4, sigma=0.3); roundtrip_(b, 4, sigma=0.3)
        >>> bool(torch.equal(a["w"], b["w"]))
        True
    """
    _add_noise_(params, seed, sigma=sigma, sign=sign, mix_names=mix_names, roundtrip=True, cache=cache)


def apply_es_step_(
    params: Params,
    population: EsPopulation,
    rewards: Float[Tensor, " P"],
    *,
    lr: float,
    shaping: str = "zscore",
    mix_names: bool = True,
    cache: NoiseCache | None = None,
) -> None:
    """In place: add `es_step`'s increments to ``params`` (fp32 accumulate, cast once), chunk by chunk.

    For each tensor the ``P`` members' generators advance together over the tensor's noise chunks
    (`noise_chunks`), so the extra memory is two chunk buffers (accumulator and noise) and
    ``P`` generator states, independent of the parameters' sizes; noise the step's ``cache``
    kept during the members' evaluation is read from it instead. Every element sees the same
    float operations in the same order as `es_step`, so the result equals
    ``params + es_step(...)`` exactly.
    """
    check_params(params)
    check_population(population)
    if population.seeds.shape != getattr(rewards, "shape", None):
        raise ShapeError(f"rewards: expected shape {list(population.seeds.shape)} (one per member)")
    lr = check_positive("lr", lr, strict=False)
    weights = shape_rewards(rewards, shaping)
    coef = member_coefficients(population, weights)
    members = [(int(s), c) for s, c in zip(population.seeds.tolist(), coef, strict=True) if c != 0.0]
    accumulator, buffer = _chunk_buffer(params), _chunk_buffer(params)
    with torch.no_grad():
        for name, p in params.items():
            flat, acc, noise = _flat_view(p), accumulator(p), buffer(p)
            streams = [
                (noise_chunks(s, name, p.numel(), dtype=p.dtype, device=p.device, mix_names=mix_names, out=noise,
                              cache=cache), c)
                for s, c in members
            ]  # fmt: skip
            for start, stop in chunk_spans(p.numel(), NOISE_CHUNK):
                total = acc[: stop - start].zero_()
                for stream, c in streams:
                    total.add_(next(stream)[2], alpha=c)
                flat[start:stop].add_(total.mul_(lr).to(p.dtype))
            _write_back(p, flat)


def population_forward(
    module: torch.nn.Module, batched_params: Mapping[str, Tensor], *args: Tensor, shared_inputs: bool = True
) -> Tensor:
    """Evaluate every member in one call: ``vmap`` of ``torch.func.functional_call`` over the leading ``P`` axis.

    Parameters not in ``batched_params`` (and all buffers) are taken from ``module`` unbatched.
    With ``shared_inputs`` the same ``args`` go to every member, else each arg has a leading ``P``.
    Returns the module's output with a leading ``P`` axis.
    """
    if not batched_params:
        raise ShapeError("batched_params: expected a non-empty mapping")
    sizes = {t.shape[0] for t in batched_params.values()}
    if len(sizes) != 1:
        raise ShapeError(f"batched_params: every tensor needs the same leading population size, got {sorted(sizes)}")

    def one(p: dict[str, Tensor], *a: Tensor) -> Tensor:
        return torch.func.functional_call(module, p, a)  # type: ignore[no-any-return]

    in_dims = (0, *(None if shared_inputs else 0 for _ in args))
    return torch.func.vmap(one, in_dims=in_dims)(dict(batched_params), *args)  # type: ignore[no-any-return]
