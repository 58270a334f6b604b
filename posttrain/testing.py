"""Test an estimator the way posttrain tests its own: hypothesis strategies and a contract runner.

Needs the ``[testing]`` extra (``pip install "posttrain[testing]"``, which installs hypothesis);
importing this module without hypothesis raises an ``ImportError`` saying so. Nothing else in
posttrain imports it.

Strategies (all return torch tensors and take the dtype to build):

- `grouped_rewards`: rewards ``[G, K]`` (optionally binary, optionally with constant groups);
- `response_masks`: boolean masks ``[B, T]`` with at least one True per row;
- `log_probs`: log-probabilities in ``[low, high]`` (``high <= 0``);
- `token_tensors`: bounded float tensors of a given shape;
- `policy_batches`: a consistent ``(logp, logp_old, advantages, mask)`` batch.

`check_estimator` runs the contract every public estimator passes (see its docstring) and raises
`ContractFailure` listing what broke; `contract_findings` runs the same list and returns each broken
item as a `ContractFinding` (item id and one line), for tools that report rather than fail
(`posttrain arena`). `CONTRACT_ITEMS` names the items; `VALID_INPUT_ITEMS` are those about valid
input (the rest are about rejecting bad input):

    def make_inputs(dtype):
        g = torch.Generator().manual_seed(0)
        logp = -torch.rand(3, 5, generator=g, dtype=dtype)
        return dict(logp=logp, logp_old=logp - 0.1, advantages=torch.randn(3, generator=g, dtype=dtype),
                    mask=torch.ones(3, 5, dtype=torch.bool))

    check_estimator(my_loss, make_inputs, output_shape=(3, 5), bad_values={"clip": [0.0, -1.0]})
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError

try:
    from hypothesis import strategies as st
    from hypothesis.extra.numpy import arrays
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError('posttrain.testing needs hypothesis: pip install "posttrain[testing]"') from exc

__all__ = [
    "CONTRACT_ITEMS",
    "VALID_INPUT_ITEMS",
    "ContractFailure",
    "ContractFinding",
    "PolicyBatch",
    "check_estimator",
    "contract_findings",
    "grouped_rewards",
    "log_probs",
    "policy_batches",
    "response_masks",
    "token_tensors",
]

# ----------------------------------------------------------------------------------------------
# Strategies
# ----------------------------------------------------------------------------------------------


def _floats(low: float, high: float) -> st.SearchStrategy[float]:
    # width=32 keeps every drawn value exactly representable in float32 as well as float64; the
    # bounds are rounded inwards to float32 numbers.
    lo, hi = np.float32(low), np.float32(high)
    if float(lo) < low:
        lo = np.nextafter(lo, np.float32(np.inf))
    if float(hi) > high:
        hi = np.nextafter(hi, np.float32(-np.inf))
    return st.floats(float(lo), float(hi), allow_nan=False, allow_infinity=False, width=32)


@st.composite
def token_tensors(
    draw: st.DrawFn,
    shape: Sequence[int],
    *,
    low: float = -10.0,
    high: float = 10.0,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """A float tensor of ``shape`` with entries in ``[low, high]`` (finite, float32-representable)."""
    arr = draw(arrays(np.float64, tuple(shape), elements=_floats(low, high)))
    return torch.from_numpy(arr).to(dtype)


def log_probs(
    shape: Sequence[int], *, low: float = -20.0, high: float = 0.0, dtype: torch.dtype = torch.float64
) -> st.SearchStrategy[Tensor]:
    """Log-probabilities in ``[low, high]``; ``high`` must be <= 0 (use ``low=-1e4`` for rare tokens)."""
    if high > 0:
        raise DomainError(f"high: log-probabilities are <= 0, got {high!r}")
    return token_tensors(shape, low=low, high=high, dtype=dtype)


@st.composite
def grouped_rewards(
    draw: st.DrawFn,
    *,
    groups: int | tuple[int, int] = (1, 4),
    k: int | tuple[int, int] = (2, 8),
    binary: bool = False,
    low: float = -5.0,
    high: float = 5.0,
    constant_groups: bool = True,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """Rewards ``[G, K]``: G and K fixed or drawn from ``(min, max)``; binary (0/1) or in ``[low, high]``.

    With ``constant_groups`` some rows may be made constant (every sample with the same reward), the
    case where group-normalised advantages must be exactly 0.
    """
    g = groups if isinstance(groups, int) else draw(st.integers(*groups))
    kk = k if isinstance(k, int) else draw(st.integers(*k))
    elements = st.sampled_from([0.0, 1.0]) if binary else _floats(low, high)
    arr = draw(arrays(np.float64, (g, kk), elements=elements))
    if constant_groups:
        rows = draw(st.lists(st.booleans(), min_size=g, max_size=g))
        for i, make_constant in enumerate(rows):
            if make_constant:
                arr[i, :] = arr[i, 0]
    return torch.from_numpy(arr).to(dtype)


@st.composite
def response_masks(
    draw: st.DrawFn, shape: Sequence[int], *, contiguous: bool = False, empty_rows: bool = False
) -> Tensor:
    """A boolean mask ``[B, T]`` with at least one True in every row.

    ``contiguous=True`` gives right-padded responses (each row a prefix of Trues); otherwise any
    pattern (holes such as masked tool outputs included). ``empty_rows=True`` also allows fully
    masked rows (padding rows of a micro-batch; TRL's truncated completions), keeping at least one
    True in the whole mask.
    """
    b, t = int(shape[0]), int(shape[1])
    if t < 1:
        raise ShapeError(f"shape: a mask with at least one token per row needs T >= 1, got {list(shape)}")
    if contiguous:
        lengths = draw(st.lists(st.integers(1, t), min_size=b, max_size=b))
        mask = torch.arange(t).unsqueeze(0) < torch.tensor(lengths).unsqueeze(-1)
    else:
        arr = draw(arrays(np.bool_, (b, t)))
        firsts = draw(st.lists(st.integers(0, t - 1), min_size=b, max_size=b))
        arr[np.arange(b), firsts] = True
        mask = torch.from_numpy(arr)
    if empty_rows and b > 1:
        drop = draw(st.lists(st.booleans(), min_size=b, max_size=b))
        drop[draw(st.integers(0, b - 1))] = False  # one row keeps its tokens
        mask = mask & ~torch.tensor(drop).unsqueeze(-1)
    return mask


@dataclass(frozen=True)
class PolicyBatch:
    """Inputs of a per-token policy loss (see `policy_batches`)."""

    logp: Tensor
    logp_old: Tensor
    advantages: Tensor
    mask: Tensor


@st.composite
def policy_batches(
    draw: st.DrawFn,
    *,
    b: int | tuple[int, int] = (1, 4),
    t: int | tuple[int, int] = (1, 6),
    max_log_ratio: float = 1.0,
    logp_low: float = -20.0,
    token_advantages: bool | None = None,
    dtype: torch.dtype = torch.float64,
) -> PolicyBatch:
    """``logp``, ``logp_old = logp - delta`` with ``|delta| <= max_log_ratio``, advantages ``[B]`` or
    ``[B, T]`` (drawn unless ``token_advantages`` is given) and a mask with a token in every row."""
    bb = b if isinstance(b, int) else draw(st.integers(*b))
    tt = t if isinstance(t, int) else draw(st.integers(*t))
    logp = draw(log_probs((bb, tt), low=logp_low, dtype=dtype))
    delta = draw(token_tensors((bb, tt), low=-max_log_ratio, high=max_log_ratio, dtype=dtype))
    per_token = draw(st.booleans()) if token_advantages is None else token_advantages
    adv = draw(token_tensors((bb, tt) if per_token else (bb,), low=-3.0, high=3.0, dtype=dtype))
    return PolicyBatch(logp, logp - delta, adv, draw(response_masks((bb, tt))))


# ----------------------------------------------------------------------------------------------
# Contract runner
# ----------------------------------------------------------------------------------------------


class ContractFailure(AssertionError):
    """An estimator broke one or more items of the contract; the message lists every one."""


CONTRACT_ITEMS: dict[str, str] = {
    "valid-call": "a valid call returns without raising",
    "output-shape": "the first output has the documented shape",
    "output-dtype": "floating outputs have the input dtype",
    "finite": "outputs are finite on valid input",
    "annotations": "a valid call passes the runtime check of the shape annotations",
    "mutation": "no argument is modified in place",
    "rank": "an argument of the wrong rank raises ShapeError naming it",
    "input-dtype": "an argument of the wrong dtype raises ShapeError naming it",
    "mismatch": "mismatched shapes raise ShapeError naming the argument",
    "empty-mask": "an all-False mask raises DomainError naming it",
    "hyperparameter": "a bad hyperparameter raises DomainError naming it",
    "gradient": "gradients are finite and reach the inputs",
    "masked": "values at masked positions change no output and no gradient",
}
"""The contract's items (id -> what it requires), in the order `check_estimator` runs them."""

VALID_INPUT_ITEMS = frozenset(
    {"valid-call", "output-shape", "output-dtype", "finite", "annotations", "mutation", "gradient", "masked"}
)
"""Items about what a valid call does (the others are about rejecting bad input)."""


@dataclass(frozen=True)
class ContractFinding:
    """One broken contract item: its id in `CONTRACT_ITEMS` and a one-line description."""

    item: str
    message: str


def _tensors(out: object) -> list[Tensor]:
    """Every tensor in an output: a tensor, or tuples / NamedTuples / lists / dicts of them."""
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, Mapping):
        return [t for v in out.values() for t in _tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _tensors(v)]
    return []


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(((a == b) | (a.isnan() & b.isnan())).all())


class _Runner:
    """Holds the configuration of one `check_estimator` call and collects failures."""

    def __init__(self, fn: Callable[..., Any], mask_arg: str | None) -> None:
        self.fn = fn
        self.mask_arg = mask_arg
        self.failures: list[ContractFinding] = []

    def fail(self, item: str, what: str) -> None:
        self.failures.append(ContractFinding(item, what))

    def call(self, inputs: Mapping[str, Any], label: str) -> Any:
        """Call ``fn`` and check it neither mutates its inputs nor bumps their version counters."""
        snapshot = {k: v.detach().clone() for k, v in inputs.items() if isinstance(v, Tensor)}
        versions = {k: v._version for k, v in inputs.items() if isinstance(v, Tensor)}
        others = {k: copy.deepcopy(v) for k, v in inputs.items() if isinstance(v, np.ndarray)}
        try:
            out = self.fn(**inputs)
        except Exception as e:  # reported as a contract failure
            self.fail("valid-call", f"{label}: raised {type(e).__name__} on valid input: {e}")
            return None
        for k, before in snapshot.items():
            if not _same(inputs[k].detach(), before) or inputs[k]._version != versions[k]:
                self.fail("mutation", f"{label}: argument {k!r} was modified in place")
        for k, before_arr in others.items():
            if not np.array_equal(inputs[k], before_arr, equal_nan=True):
                self.fail("mutation", f"{label}: argument {k!r} was modified in place")
        return out

    def expect_error(self, item: str, inputs: Mapping[str, Any], error: type[Exception], arg: str, label: str) -> None:
        """The call must raise ``error`` whose message names ``arg``."""
        try:
            self.fn(**inputs)
        except error as e:
            if arg not in str(e):
                self.fail(item, f"{label}: {error.__name__} raised but its message does not name {arg!r}: {e}")
        except Exception as e:  # any other exception is a contract failure
            self.fail(item, f"{label}: expected {error.__name__} naming {arg!r}, got {type(e).__name__}: {e}")
        else:
            self.fail(item, f"{label}: expected {error.__name__} naming {arg!r}, nothing was raised")


def _weighted_sum(outs: list[Tensor]) -> Tensor | None:
    """A fixed pseudo-random linear functional of the differentiable outputs (None if there are none)."""
    gen = torch.Generator().manual_seed(0)
    total: Tensor | None = None
    for t in outs:
        if t.requires_grad and t.is_floating_point():
            w = torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype)
            term = (t * w).sum()
            total = term if total is None else total + term
    return total


def _grad_check(
    run: _Runner, inputs: Mapping[str, Any], grad_args: Sequence[str], label: str
) -> dict[str, Tensor | None]:
    leaves = {k: inputs[k].detach().clone().requires_grad_(True) for k in grad_args}
    outs = _tensors(run.call({**inputs, **leaves}, label))
    if not outs:
        return {}
    total = _weighted_sum(outs)
    if total is None:
        run.fail("gradient", f"{label}: no output is differentiable with respect to {list(grad_args)}")
        return {}
    total.backward()
    grads = {k: v.grad for k, v in leaves.items()}
    if all(g is None for g in grads.values()):
        run.fail("gradient", f"{label}: no gradient reached any of {list(grad_args)}")
    for k, g in grads.items():
        if g is not None and not bool(torch.isfinite(g).all()):
            run.fail("gradient", f"{label}: gradient with respect to {k!r} has non-finite entries")
    return grads


def check_estimator(
    fn: Callable[..., Any],
    make_inputs: Callable[[torch.dtype], dict[str, Any]],
    *,
    output_shape: Sequence[int] | Callable[[Mapping[str, Any]], Sequence[int]] | None = None,
    mask_arg: str | None = "mask",
    mismatch_args: Sequence[str] | None = None,
    rank_args: Sequence[str] | None = None,
    grad_args: Sequence[str] | None = None,
    bad_values: Mapping[str, Sequence[Any]] | None = None,
    masked_positions_ignored: bool = True,
    check_annotations: bool = True,
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.float64),
) -> None:
    """Run the estimator contract on ``fn``; raise `ContractFailure` listing every broken item.

    ``make_inputs(dtype)`` returns the keyword arguments of one valid call, its float tensors in
    ``dtype``. Give every dimension a distinct size (e.g. ``G=2, K=3, T=5``) so that a wrong rank
    cannot be mistaken for a valid shape. For each dtype in ``dtypes`` the runner checks:

    1. **documented shape and dtype**: the first output tensor has ``output_shape`` (a shape, or a
       function of the inputs) and every floating output has ``dtype`` and finite entries; with
       ``check_annotations`` and beartype installed (the ``[dev]`` extra), the call also passes
       jaxtyping's runtime check of the signature's shape annotations (``Float[Tensor, "B T"]``);
    2. **no input mutation**: no tensor or array argument changes value or version counter;
    3. **wrong rank**: each of ``rank_args`` (default: every tensor argument) with a leading axis
       added, or with its first axis dropped (a ``[B]`` tensor made 0-d), raises ``ShapeError``
       naming the argument;
    4. **wrong dtype**: a float argument cast to int64, a boolean one to float, an integer one to
       float raises ``ShapeError`` naming it;
    5. **mismatched shapes**: each of ``mismatch_args`` (default: every tensor argument but the
       first) with its first axis shortened by one raises ``ShapeError`` naming it;
    6. **empty mask**: ``mask_arg`` all False raises ``DomainError`` naming it;
    7. **bad hyperparameters**: each value in ``bad_values[name]`` raises ``DomainError`` naming
       ``name``;
    8. **finite gradients**: a fixed random linear functional of the differentiable outputs is
       backpropagated to ``grad_args`` (default: every float tensor argument); the gradients are
       finite and at least one exists;
    9. **masked positions are ignored** (``masked_positions_ignored``): NaN written into every float
       argument of the mask's shape at masked positions changes no output bit, and the gradients
       stay finite.

    Args:
        fn: the estimator, called with keyword arguments only.
        make_inputs: ``dtype -> kwargs`` of a valid call.
        output_shape: expected shape of the first output tensor, or None to skip.
        mask_arg: name of the boolean mask argument (ignored when absent from the inputs).
        mismatch_args, rank_args, grad_args: override the defaults above (``()`` skips).
        bad_values: hyperparameter values that must raise ``DomainError``.
        masked_positions_ignored: run check 9.
        check_annotations: run the runtime annotation check of item 1.
        dtypes: float dtypes to run with.

    Raises:
        ContractFailure: with one line per broken item.
    """
    findings = contract_findings(
        fn,
        make_inputs,
        output_shape=output_shape,
        mask_arg=mask_arg,
        mismatch_args=mismatch_args,
        rank_args=rank_args,
        grad_args=grad_args,
        bad_values=bad_values,
        masked_positions_ignored=masked_positions_ignored,
        check_annotations=check_annotations,
        dtypes=dtypes,
    )
    if findings:
        name = getattr(fn, "__name__", repr(fn))
        lines = "\n  - ".join(f.message for f in findings)
        raise ContractFailure(f"{name} breaks the estimator contract:\n  - {lines}")


def contract_findings(
    fn: Callable[..., Any],
    make_inputs: Callable[[torch.dtype], dict[str, Any]],
    *,
    output_shape: Sequence[int] | Callable[[Mapping[str, Any]], Sequence[int]] | None = None,
    mask_arg: str | None = "mask",
    mismatch_args: Sequence[str] | None = None,
    rank_args: Sequence[str] | None = None,
    grad_args: Sequence[str] | None = None,
    bad_values: Mapping[str, Sequence[Any]] | None = None,
    masked_positions_ignored: bool = True,
    check_annotations: bool = True,
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.float64),
    items: Collection[str] | None = None,
) -> list[ContractFinding]:
    """The items of `check_estimator`'s contract that ``fn`` breaks, one `ContractFinding` each (none: it passes).

    Same arguments as `check_estimator`, plus ``items``: the ids of `CONTRACT_ITEMS` to run (default
    all; e.g. `VALID_INPUT_ITEMS` to skip the bad-input calls). ``make_inputs`` may also return the
    same inputs whatever the dtype (a drawn example already in its dtype).

    Examples:
        >>> def careless(values, mask):
        ...     return (values * mask).sum(-1)  # a NaN at a masked position leaks through the product
        >>> inputs = lambda dtype: {"values": torch.ones(2, 3, dtype=dtype), "mask": torch.tensor([[True] * 3, [True, False, False]])}
        >>> sorted({f.item for f in contract_findings(careless, inputs, items={"masked"}, dtypes=(torch.float64,))})
        ['masked']
    """
    wanted = frozenset(CONTRACT_ITEMS) if items is None else frozenset(items)
    unknown = wanted - set(CONTRACT_ITEMS)
    if unknown:
        raise DomainError(f"items: unknown contract items {sorted(unknown)}; valid: {', '.join(CONTRACT_ITEMS)}")
    run = _Runner(fn, mask_arg)
    for dtype in dtypes:
        _check_one_dtype(
            run,
            make_inputs(dtype),
            dtype,
            wanted,
            output_shape=output_shape,
            mismatch_args=mismatch_args,
            rank_args=rank_args,
            grad_args=grad_args,
            bad_values=bad_values or {},
            masked_positions_ignored=masked_positions_ignored,
            check_annotations=check_annotations,
        )
    return [f for f in run.failures if f.item in wanted]


def _typechecked(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """``fn`` under jaxtyping's runtime checker with beartype, or None if beartype is not installed."""
    try:
        from beartype import beartype
        from jaxtyping import jaxtyped
    except ImportError:
        return None
    try:
        return jaxtyped(typechecker=beartype)(fn)  # type: ignore[no-any-return]
    except Exception:  # an object beartype cannot decorate (e.g. a C function): nothing to check
        return None


def _check_one_dtype(
    run: _Runner,
    inputs: dict[str, Any],
    dtype: torch.dtype,
    wanted: frozenset[str],
    *,
    output_shape: Sequence[int] | Callable[[Mapping[str, Any]], Sequence[int]] | None,
    mismatch_args: Sequence[str] | None,
    rank_args: Sequence[str] | None,
    grad_args: Sequence[str] | None,
    bad_values: Mapping[str, Sequence[Any]],
    masked_positions_ignored: bool,
    check_annotations: bool,
) -> None:
    tag = str(dtype).replace("torch.", "")
    tensor_args = [k for k, v in inputs.items() if isinstance(v, Tensor)]
    float_args = [k for k in tensor_args if inputs[k].is_floating_point()]
    mask_arg = run.mask_arg if run.mask_arg in tensor_args else None

    # 1-2. a valid call: shape, dtype, finiteness, no mutation.
    out = run.call(inputs, f"[{tag}] valid call")
    outs = _tensors(out)
    if not outs:
        run.fail("valid-call", f"[{tag}] valid call: returned no tensor")
    if output_shape is not None and outs:
        want = tuple(output_shape(inputs) if callable(output_shape) else output_shape)
        if tuple(outs[0].shape) != want:
            run.fail("output-shape", f"[{tag}] output shape: expected {list(want)}, got {list(outs[0].shape)}")
    for i, t in enumerate(outs):
        if t.is_floating_point() and t.dtype != dtype:
            run.fail("output-dtype", f"[{tag}] output {i}: dtype {t.dtype}, expected {dtype}")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            run.fail("finite", f"[{tag}] output {i}: non-finite entries on valid input")

    # 1b. the jaxtyping annotations agree with a valid call (runtime shape checking via beartype).
    if check_annotations and "annotations" in wanted:
        typed = _typechecked(run.fn)
        if typed is not None:
            try:
                typed(**inputs)
            except Exception as e:  # the checker's own error type
                first = " ".join(str(e).strip().splitlines()[:3])
                run.fail("annotations", f"[{tag}] annotations: a valid call fails runtime shape checking: {first}")

    # 3. wrong rank.
    for k in (tensor_args if rank_args is None else rank_args) if "rank" in wanted else ():
        x = inputs[k]
        run.expect_error("rank", {**inputs, k: x.unsqueeze(0)}, ShapeError, k, f"[{tag}] rank of {k} + 1")
        if x.ndim >= 1 and x.shape[0] >= 1:
            run.expect_error("rank", {**inputs, k: x[0]}, ShapeError, k, f"[{tag}] rank of {k} - 1")

    # 4. wrong dtype.
    for k in tensor_args if "input-dtype" in wanted else ():
        x = inputs[k]
        bad = x.long() if x.is_floating_point() else x.to(dtype)
        run.expect_error("input-dtype", {**inputs, k: bad}, ShapeError, k, f"[{tag}] dtype of {k} ({bad.dtype})")

    # 5. mismatched shapes.
    for k in (tensor_args[1:] if mismatch_args is None else mismatch_args) if "mismatch" in wanted else ():
        x = inputs[k]
        run.expect_error("mismatch", {**inputs, k: x[:-1]}, ShapeError, k, f"[{tag}] {k} with first axis shortened")

    # 6. empty mask.
    if mask_arg is not None and "empty-mask" in wanted:
        empty = torch.zeros_like(inputs[mask_arg])
        label = f"[{tag}] empty {mask_arg}"
        run.expect_error("empty-mask", {**inputs, mask_arg: empty}, DomainError, mask_arg, label)

    # 7. bad hyperparameters.
    for k, values in bad_values.items() if "hyperparameter" in wanted else ():
        for v in values:
            run.expect_error("hyperparameter", {**inputs, k: v}, DomainError, k, f"[{tag}] {k}={v!r}")

    # 8. finite gradients.
    gargs = float_args if grad_args is None else list(grad_args)
    if gargs and "gradient" in wanted:
        _grad_check(run, inputs, gargs, f"[{tag}] gradients")

    # 9. masked positions change nothing.
    if masked_positions_ignored and mask_arg is not None and "masked" in wanted:
        mask = inputs[mask_arg]
        nan = torch.tensor(float("nan"), dtype=dtype)
        corrupt = {k: torch.where(mask, inputs[k], nan) for k in float_args if inputs[k].shape == mask.shape}
        if corrupt:
            label = f"[{tag}] NaN at masked positions of {sorted(corrupt)}"
            outs_c = _tensors(run.call({**inputs, **corrupt}, label))
            if len(outs_c) != len(outs) or not all(
                _same(a.detach(), b.detach()) for a, b in zip(outs, outs_c, strict=True)
            ):
                run.fail("masked", f"{label}: an output changed")
            if gargs:
                start = len(run.failures)
                _grad_check(run, {**inputs, **corrupt}, gargs, label + " (gradients)")
                for i in range(start, len(run.failures)):  # a gradient broken by masked NaN is a masking fault
                    if run.failures[i].item == "gradient":
                        run.failures[i] = ContractFinding("masked", run.failures[i].message)
