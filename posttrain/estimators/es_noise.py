r"""Seed-indexed Gaussian noise of evolution strategies: one stream per (member, tensor), chunks, and a step cache.

The noise of parameter tensor ``name`` in the member with integer seed $k$ is a pure function of
$(k, \text{name})$: a ``torch.Generator`` on the tensor's device seeded with $k \oplus h(\text{name})$,
``h`` the 64-bit little-endian BLAKE2b digest of the name (Ba et al. 2026, arXiv:2608.27351,
App. G.1), draws the tensor's elements in consecutive flat chunks of `NOISE_CHUNK` elements
(`noise_chunks`); chunk ``c`` is therefore a pure function of $(k, \text{name}, c)$. Mixing the name into
the seed gives independent noise to same-shaped tensors; ``mix_names=False`` reproduces the correlated
seeding of the original ES-at-Scale scripts (Qiu et al. 2025, arXiv:2509.24372) for comparison only.
On CPU the chunked stream is bit-identical to one ``torch.randn`` of the whole tensor (the artifact's
draw). Noise is drawn in float32 (float64 for float64 parameters); streams differ between devices
(CPU and CUDA generators are different algorithms): pick one device per run.

An ES step needs each member's noise three times: to perturb the weights, to restore them, and in the
update. Regenerating it every time is the memory design of seed-indexed ES (no member's noise is
ever stored), and on an LLM the population's noise cannot be stored. Where it can, a `NoiseCache`
passed explicitly to the functions of a step draws each (member, tensor) once and hands the same
values to all three uses; its byte budget decides what is kept, the rest is regenerated from the
seed. A cached value equals the regenerated one bit for bit, so results do not depend on the cache,
only time and memory do.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from posttrain.errors import DomainError

__all__ = [
    "NOISE_CHUNK",
    "NOISE_TAIL",
    "NoiseCache",
    "chunk_spans",
    "members_noise",
    "noise_chunks",
    "noise_dtype",
    "seeded_noise",
    "tensor_seed",
]

_MASK64 = (1 << 64) - 1
NOISE_CHUNK = 1 << 14
"""Elements per noise chunk (64 KiB of float32): the bound on the in-place operations' temporaries."""
NOISE_TAIL = 16  # CPU normal_ transforms blocks of 16 and redraws a shorter tail: a last chunk is >= 16 long


@functools.lru_cache(maxsize=1 << 16)
def _name_digest(name: str) -> int:
    """``h(name)``: BLAKE2b, 8-byte digest read little-endian (memoised: a pure function of the name)."""
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "little")


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
    return (int(seed) ^ _name_digest(name)) & _MASK64


def noise_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype noise is drawn in for parameters of ``dtype``: float64 for float64, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def chunk_spans(numel: int, chunk: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive ``chunk``-long spans of ``numel``; a last one shorter than 16 joins the one before."""
    if chunk < NOISE_TAIL or chunk % NOISE_TAIL:
        raise DomainError(f"chunk: expected a positive multiple of {NOISE_TAIL}, got {chunk}")
    starts = list(range(0, numel, chunk))
    if len(starts) > 1 and numel - starts[-1] < NOISE_TAIL:
        starts.pop()
    return list(itertools.pairwise([*starts, numel]))


_CPU = torch.device("cpu")


def _device(device: torch.device | str | None) -> torch.device:
    if isinstance(device, torch.device):
        return device
    return torch.device(device) if device is not None else _CPU


def _fill_(flat: Tensor, generator_seed: int, gen: torch.Generator) -> Tensor:
    """Draw the stream of ``generator_seed`` into the 1-D ``flat`` in the chunks of `noise_chunks` (``gen`` re-seeded).

    A tensor of at most one chunk is one ``normal_`` (no span list); re-seeding a generator equals a fresh one.
    """
    gen.manual_seed(generator_seed)
    if flat.numel() < NOISE_CHUNK + NOISE_TAIL:
        return flat.normal_(generator=gen)
    for start, stop in chunk_spans(flat.numel(), NOISE_CHUNK):
        flat[start:stop].normal_(generator=gen)
    return flat


class NoiseCache:
    r"""Member noise drawn once and reused within an ES step: an explicit memo of `seeded_noise`.

    An entry is the noise ``[M, numel]`` of M members for one tensor, keyed by the members' seeds, the
    tensor's name, ``mix_names``, the length, the noise dtype and the device: everything that determines
    the streams, so a kept value is the one regeneration would give, bit for bit. An entry is kept if its
    tensor has at most ``max_numel`` elements and it fits in what is left of ``max_bytes``; anything
    else is drawn again whenever it is asked for. ``NoiseCache(0)`` keeps nothing (pure regeneration
    from seeds, the memory design for models whose noise cannot be stored); ``NoiseCache()`` keeps
    everything (a toy's population). Build one per step (the members change) and pass it to every
    function of the step (`perturbed_params`, `es_step`, ``perturb_``, ``restore_``,
    ``apply_es_step_``). Values it returns are shared: read them, never write to them. One generator
    per device is reused for the draws (not thread-safe).

    Examples:
        >>> cache = NoiseCache()
        >>> a = seeded_noise(3, "w", (2, 2), cache=cache)
        >>> b = seeded_noise(3, "w", (2, 2), cache=cache)  # kept: not drawn again
        >>> len(cache), bool(torch.equal(a, b)), bool(torch.equal(a, seeded_noise(3, "w", (2, 2))))
        (1, True, True)
    """

    def __init__(self, max_bytes: float = math.inf, *, max_numel: int | None = None) -> None:
        if not max_bytes >= 0:
            raise DomainError(f"max_bytes: expected a non-negative number of bytes, got {max_bytes}")
        if max_numel is not None and max_numel < 0:
            raise DomainError(f"max_numel: expected a non-negative integer or None, got {max_numel}")
        self.max_bytes, self.max_numel = max_bytes, max_numel
        self.nbytes = 0
        self._entries: dict[tuple[tuple[int, ...], str, bool, int, torch.dtype, torch.device], Tensor] = {}
        self._generators: dict[torch.device, torch.Generator] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def generator(self, device: torch.device | str | None) -> torch.Generator:
        """The cache's generator on ``device`` (re-seeded before every draw)."""
        dev = _device(device)
        if dev not in self._generators:
            self._generators[dev] = torch.Generator(device=dev)
        return self._generators[dev]

    def members(
        self,
        seeds: Sequence[int],
        name: str,
        numel: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        mix_names: bool = True,
    ) -> Tensor | None:
        """The kept noise ``[len(seeds), numel]`` of tensor ``name`` of the members ``seeds`` (drawn now if new and
        admitted; row ``i`` is `seeded_noise` of ``seeds[i]`` flattened), or None if not kept."""
        dev, ndtype, numel = _device(device), noise_dtype(dtype), int(numel)
        key = (tuple(seeds), name, mix_names, numel, ndtype, dev)
        kept = self._entries.get(key)
        if kept is not None:
            return kept
        size = len(seeds) * numel * ndtype.itemsize
        if (self.max_numel is not None and numel > self.max_numel) or self.nbytes + size > self.max_bytes:
            return None
        kept = torch.empty(len(seeds), numel, dtype=ndtype, device=dev)
        gen = self.generator(dev)
        for row, s in zip(kept.unbind(0), seeds, strict=True):
            _fill_(row, tensor_seed(s, name, mix_names=mix_names), gen)
        self._entries[key] = kept
        self.nbytes += size
        return kept


def members_noise(
    seeds: Sequence[int],
    name: str,
    numel: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    mix_names: bool = True,
    cache: NoiseCache | None = None,
) -> Tensor:
    """The noise ``[len(seeds), numel]`` of tensor ``name`` of several members: row ``i`` is `seeded_noise` of
    ``seeds[i]`` flattened. Taken from ``cache`` where it keeps it (shared: read-only), else drawn now."""
    kept = None if cache is None else cache.members(seeds, name, numel, dtype=dtype, device=device, mix_names=mix_names)
    if kept is not None:
        return kept
    gen = cache.generator(device) if cache is not None else torch.Generator(device=_device(device))
    out = torch.empty(len(seeds), numel, dtype=noise_dtype(dtype), device=device)
    for row, s in zip(out.unbind(0), seeds, strict=True):
        _fill_(row, tensor_seed(s, name, mix_names=mix_names), gen)
    return out


def seeded_noise(
    seed: int,
    name: str,
    shape: torch.Size | tuple[int, ...],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    mix_names: bool = True,
    cache: NoiseCache | None = None,
) -> Tensor:
    r"""Standard normal noise for tensor ``name`` of member ``seed``: a pure function of its arguments.

    Drawn with a generator on ``device`` seeded by `tensor_seed`, in float64 when ``dtype`` is float64
    and float32 otherwise (the caller casts after scaling), in the flat chunks of `noise_chunks`; on
    CPU this equals one ``torch.randn(shape)`` from that generator. With a ``cache`` the value is
    taken from it (or drawn and kept there): the same numbers, shared (do not modify them).

    Args:
        seed: the member's non-negative integer seed. name: the tensor's stable name.
        shape: the tensor's shape. dtype: the parameter dtype. device: where to draw.
        mix_names: mix the name into the seed (default; independent noise per tensor).
        cache: a step's `NoiseCache` (None: drawn now, kept nowhere).

    Returns:
        a tensor of ``shape`` with i.i.d. $\mathcal N(0, 1)$ entries.

    Examples:
        >>> bool((seeded_noise(3, "w", (2, 2)) == seeded_noise(3, "w", (2, 2))).all())
        True
    """
    shape = tuple(shape)
    numel = math.prod(shape)
    if cache is not None:
        kept = cache.members((seed,), name, numel, dtype=dtype, device=device, mix_names=mix_names)
        if kept is not None:
            return kept[0].view(shape)
    gen = cache.generator(device) if cache is not None else torch.Generator(device=_device(device))
    out = torch.empty(numel, dtype=noise_dtype(dtype), device=device)
    return _fill_(out, tensor_seed(seed, name, mix_names=mix_names), gen).view(shape)


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
    cache: NoiseCache | None = None,
) -> Iterator[tuple[int, int, Tensor]]:
    r"""The flat noise of tensor ``name`` of member ``seed`` as ``(start, stop, values)`` chunks.

    ``values`` (``[stop - start]``) are the next draws of the tensor's one generator; every chunk is
    ``chunk`` long except the last, which absorbs a remainder shorter than 16. ``values`` is a view
    of one reused buffer (``out`` if given, at least ``chunk + 15`` elements): consume it before the
    next chunk. Concatenated, the chunks are `seeded_noise` flattened. When ``cache`` keeps the tensor
    (``chunk`` must then be `NOISE_CHUNK`), ``values`` are views of the kept noise instead: read-only.

    Examples:
        >>> parts = [v.clone() for _, _, v in noise_chunks(3, "w", 40, chunk=16)]
        >>> [len(v) for v in parts], bool(torch.equal(torch.cat(parts), seeded_noise(3, "w", (40,))))
        ([16, 24], True)
    """
    spans = chunk_spans(numel, chunk)
    kept = None
    if cache is not None:
        if chunk != NOISE_CHUNK:
            raise DomainError(f"chunk: a cache holds NOISE_CHUNK-chunked streams, got chunk={chunk}")
        kept = cache.members((seed,), name, numel, dtype=dtype, device=device, mix_names=mix_names)
    if kept is not None:
        for start, stop in spans:
            yield start, stop, kept[0, start:stop]
        return
    gen = torch.Generator(device=_device(device)).manual_seed(tensor_seed(seed, name, mix_names=mix_names))
    width = max((b - a for a, b in spans), default=0)
    buf = torch.empty(width, dtype=noise_dtype(dtype), device=device) if out is None else out
    for start, stop in spans:
        yield start, stop, buf[: stop - start].normal_(generator=gen)
