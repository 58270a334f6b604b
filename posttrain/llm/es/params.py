r"""In-place ES on a model's parameters: perturb, restore and update tensors chunk by chunk, and vmapped members.

The stateful half of evolution strategies: the noise, the reward shaping and the update maths are
the pure functions of `posttrain.estimators.es`; here they are applied to live parameters in
place (under ``torch.no_grad``) with the noise regenerated in `NOISE_CHUNK`-element
chunks (`noise_chunks`) through one or two reused buffers, so the extra
memory is independent of the parameters' sizes, and a module's members are evaluated in one
``vmap`` of ``functional_call`` (`population_forward`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from jaxtyping import Float
from torch import Tensor

from posttrain.errors import ShapeError
from posttrain.estimators.es import (
    NOISE_CHUNK,
    NOISE_TAIL,
    EsPopulation,
    Params,
    check_params,
    check_population,
    chunk_spans,
    member_coefficients,
    noise_chunks,
    noise_dtype,
    shape_rewards,
)
from posttrain.validate import check_positive

__all__ = ["apply_es_step_", "perturb_", "population_forward", "restore_", "roundtrip_"]


def perturb_(params: Params, seed: int, *, sigma: float, sign: float = 1.0, mix_names: bool = True) -> None:
    r"""In place, per tensor: $\theta^{(n)} \leftarrow \theta^{(n)} + \mathrm{sign}\,\sigma\varepsilon^{(n)}_{k}$.

    The noise comes in `NOISE_CHUNK`-element chunks (`noise_chunks`) through one reused
    buffer, so the peak extra memory is one chunk (plus its cast for low-precision parameters),
    independent of the parameters' sizes. Tied parameters must appear once in ``params``
    (``named_parameters()`` deduplicates). Runs under ``torch.no_grad()``.
    """
    _add_noise_(params, seed, sigma=sigma, sign=sign, mix_names=mix_names, roundtrip=False)


def _add_noise_(params: Params, seed: int, *, sigma: float, sign: float, mix_names: bool, roundtrip: bool) -> None:
    """``p += d`` (or, with ``roundtrip``, ``p = (p + d) - d``) per chunk, ``d = sign * sigma * noise`` cast to ``p``."""
    check_params(params)
    sigma = check_positive("sigma", sigma, strict=False)
    buffer = _chunk_buffer(params)
    with torch.no_grad():
        for name, p in params.items():
            flat = _flat_view(p)
            for start, stop, eps in noise_chunks(seed, name, p.numel(), dtype=p.dtype, device=p.device,
                                                 mix_names=mix_names, out=buffer(p)):  # fmt: skip
                d = eps.mul_(sign * sigma).to(p.dtype)
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


def restore_(params: Params, seed: int, *, sigma: float, sign: float = 1.0, mix_names: bool = True) -> None:
    """Undo `perturb_` by subtracting the same regenerated noise (exact only in exact arithmetic)."""
    perturb_(params, seed, sigma=sigma, sign=-sign, mix_names=mix_names)


def roundtrip_(params: Params, seed: int, *, sigma: float, sign: float = 1.0, mix_names: bool = True) -> None:
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
    _add_noise_(params, seed, sigma=sigma, sign=sign, mix_names=mix_names, roundtrip=True)


def apply_es_step_(
    params: Params,
    population: EsPopulation,
    rewards: Float[Tensor, " P"],
    *,
    lr: float,
    shaping: str = "zscore",
    mix_names: bool = True,
) -> None:
    """In place: add `es_step`'s increments to ``params`` (fp32 accumulate, cast once), chunk by chunk.

    For each tensor the ``P`` members' generators advance together over the tensor's noise chunks
    (`noise_chunks`), so the extra memory is two chunk buffers (accumulator and noise) and
    ``P`` generator states, independent of the parameters' sizes. Every element sees the same
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
                (noise_chunks(s, name, p.numel(), dtype=p.dtype, device=p.device, mix_names=mix_names, out=noise), c)
                for s, c in members
            ]
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
