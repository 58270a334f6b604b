r"""Properties of an estimator's form, searched with hypothesis: each holds, or a shrunk counterexample.

A `Property` is a statement about a function of one `Form` (e.g. "$A(R + c_g) = A(R)$"), a
hypothesis strategy of inputs for it, and a test of one input. `search` asks hypothesis for an input
that breaks it (``hypothesis.find``, derandomised, so a report is reproducible) and returns the
shrunk input in one line, or None.

*Contract* properties must hold for every estimator of the form (a failure is a defect): the
masked positions of a per-token advantage are ignored (padding columns change nothing), and a policy
loss never blocks the *restoring* direction (for $A > 0$ and ratio $r < 1$ the gradient raises the
token's log-probability; for $A < 0$ and $r > 1$ it lowers it: a trust region stops only moves in
the improving direction). The others are *characteristics* that tell estimators apart (GRPO is
shift- and scale-invariant, Dr.GRPO shift-invariant and linear in the scale, k1 is not
non-negative). Comparisons use ``rtol = 1e-4`` (an $\epsilon = 10^{-6}$ added to a group std is not
a failure) on rewards from the grid ``{0, 1/4, ..., 1}``, whose non-constant groups have a std of
at least 0.14.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from hypothesis import find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample
from hypothesis.extra.numpy import arrays
from torch import Tensor

from posttrain.arena.inputs import (
    ARGS,
    GRID,
    SEARCH,
    Example,
    grid_rewards,
    kl_inputs,
    masked_inputs,
    policy_inputs,
    token_inputs,
)
from posttrain.arena.kinds import Form, first_tensor

__all__ = ["PROPERTIES", "Property", "search"]

RTOL, ATOL = 1e-4, 1e-6


def _call(fn: Callable[..., Any], form: Form, ex: Example, **override: Tensor) -> Tensor:
    args = {**ex, **override}
    return first_tensor(fn(*(args[n] for n in ARGS[form])))


def _close(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and bool(torch.isclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=False).all())


# --- properties --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Property:
    """A statement about a function of one form, its input strategy and its test of one input."""

    id: str
    statement: str
    contract: bool
    inputs: Callable[[], st.SearchStrategy[Example]]
    violation: Callable[[Callable[..., Any], Form, Example], str | None]


def _shift(fn: Callable[..., Any], form: Form, ex: Example) -> str | None:
    shifted = ex["rewards"] + ex["shift"]
    return None if _close(_call(fn, form, ex, rewards=shifted), _call(fn, form, ex)) else "A(R + c) != A(R)"


def _scale_inv(fn: Callable[..., Any], form: Form, ex: Example) -> str | None:
    key = ARGS[form][0]
    return None if _close(_call(fn, form, ex, **{key: ex[key] * ex["scale"]}), _call(fn, form, ex)) else "A(sR) != A(R)"


def _scale_lin(fn: Callable[..., Any], form: Form, ex: Example) -> str | None:
    key = ARGS[form][0]
    got = _call(fn, form, ex, **{key: ex[key] * ex["scale"]})
    return None if _close(got, ex["scale"] * _call(fn, form, ex)) else "A(sR) != s A(R)"


def _perm(fn: Callable[..., Any], form: Form, ex: Example) -> str | None:
    r, p = ex["rewards"], torch.tensor(ex["perm"])
    over: dict[str, Tensor] = {"rewards": r[:, p]}
    if form is Form.GROUPED_MASKED:  # rows of the mask follow their samples
        g, k = r.shape
        rows = (torch.arange(g).unsqueeze(-1) * k + p).reshape(-1)
        over["mask"] = ex["mask"][rows]
        want = _call(fn, form, ex)[rows]
    else:
        want = _call(fn, form, ex)[:, p]
    return (
        None
        if _close(_call(fn, form, ex, **over), want)
        else "permuting a group's samples does not permute its advantages"
    )


def _groups(fn: Callable[..., Any], form: Form, ex: Example) -> str | None:
    r = ex["rewards"]
    more = torch.cat([r, ex["other"]], 0)
    over: dict[str, Tensor] = {"rewards": more}
    if form is Form.GROUPED_MASKED:
        over["mask"] = torch.cat([ex["mask"], torch.ones(r.shape[1], ex["mask"].shape[1], dtype=torch.bool)], 0)
    got = _call(fn, form, ex, **over)[: (r.shape[0] if form is Form.GROUPED else r.numel())]
    return None if _close(got, _call(fn, form, ex)) else "adding a group changes the other groups' advantages"


def _zero_sum(fn: Callable[..., Any], form: Form, ex: Example) -> str | None:
    total = _call(fn, form, ex).sum(-1)
    return None if _close(total, torch.zeros_like(total)) else "a group's advantages do not sum to 0"


def _constant(fn: Callable[..., Any], form: Form, ex: Example) -> str | None:
    r = ex["rewards"][:, :1].expand_as(ex["rewards"]).clone()
    out = _call(fn, form, ex, rewards=r)
    return None if bool((out == 0).all()) else "a group whose rewards are all equal gets non-zero advantages"


def _masked_zero(fn: Callable[..., Any], form: Form, ex: Example) -> str | None:
    out = _call(fn, form, ex)
    return None if bool((out[~ex["mask"]] == 0).all()) else "non-zero output at a masked position"


def _padding(fn: Callable[..., Any], form: Form, ex: Example) -> str | None:
    mask = ex["mask"]
    pad = torch.zeros(mask.shape[0], 2, dtype=torch.bool)
    over = {"mask": torch.cat([mask, pad], -1)}
    for name in ARGS[form]:  # token tensors get two padding columns of junk
        x = ex[name]
        if name != "mask" and x.shape == mask.shape:
            over[name] = torch.cat([x, torch.full((x.shape[0], 2), 0.5, dtype=x.dtype)], -1)
    got, want = _call(fn, form, ex, **over), _call(fn, form, ex)
    ok = _close(torch.where(mask, got[:, : mask.shape[1]], 0.0), torch.where(mask, want, 0.0))
    return None if ok else "two masked padding columns change the values at valid positions"


def _rows(fn: Callable[..., Any], form: Form, ex: Example) -> str | None:
    over = {n: torch.cat([ex[n], ex[n][:1]], 0) for n in ARGS[form]}  # one more row
    got = _call(fn, form, ex, **over)[: ex[ARGS[form][0]].shape[0]]
    return None if _close(got, _call(fn, form, ex)) else "adding a row changes the other rows' values"


def _grad(fn: Callable[..., Any], form: Form, ex: Example, **override: Tensor) -> Tensor:
    lp = {**ex, **override}["logp"].detach().clone().requires_grad_(True)
    out = _call(fn, form, ex, **{**override, "logp": lp})
    (g,) = torch.autograd.grad(out.sum(), lp, allow_unused=True)
    return torch.zeros_like(lp) if g is None else g


def _token_adv(ex: Example) -> Tensor:
    a = ex["advantages"]
    return a.unsqueeze(-1).expand_as(ex["logp"]) if a.ndim == 1 else a


def _restoring(fn: Callable[..., Any], form: Form, ex: Example) -> str | None:
    a, r = _token_adv(ex), (ex["logp"] - ex["logp_old"]).exp()
    g = _grad(fn, form, ex)
    back = ex["mask"] & (((a > 0) & (r < 1)) | ((a < 0) & (r > 1)))  # the policy moved against A
    ok = bool(((-g * a)[back] > 0).all())
    return None if ok else "the gradient does not move a token back when the ratio moved against its advantage"


def _sign(fn: Callable[..., Any], form: Form, ex: Example) -> str | None:
    g = _grad(fn, form, ex)
    ok = bool(((-g * _token_adv(ex))[ex["mask"]] >= 0).all())
    return None if ok else "the gradient pushes a token against the sign of its advantage"


def _reinforce(fn: Callable[..., Any], form: Form, ex: Example) -> str | None:
    g = _grad(fn, form, ex, logp_old=ex["logp"])
    want = torch.where(ex["mask"], -_token_adv(ex), 0.0)
    return None if _close(torch.where(ex["mask"], g, 0.0), want) else "at ratio 1 the gradient is not -A (REINFORCE)"


def _kl_zero(fn: Callable[..., Any], form: Form, ex: Example) -> str | None:
    out = _call(fn, form, ex, logp_ref=ex["logp"])
    return None if _close(out, torch.zeros_like(out)) else "k(l, l) != 0"


def _kl_nonneg(fn: Callable[..., Any], form: Form, ex: Example) -> str | None:
    return None if bool((_call(fn, form, ex) >= 0).all()) else "a negative value"


def _kl_grad_zero(fn: Callable[..., Any], form: Form, ex: Example) -> str | None:
    g = _grad(fn, form, ex, logp_ref=ex["logp"])
    return None if _close(g, torch.zeros_like(g)) else "non-zero gradient where logp = logp_ref"


def _tokenwise(fn: Callable[..., Any], form: Form, ex: Example) -> str | None:
    full = _call(fn, form, ex)
    one = _call(fn, form, ex, logp=ex["logp"][:, :1], logp_ref=ex["logp_ref"][:, :1])
    return None if _close(one, full[:, :1]) else "a token's value depends on other tokens"


def _with(
    base: Callable[[], st.SearchStrategy[Example]], **extra: st.SearchStrategy[Any]
) -> Callable[[], st.SearchStrategy[Example]]:
    return lambda: st.tuples(base(), st.fixed_dictionaries(extra)).map(lambda p: {**p[0], **p[1]})


def _perms(ex: Example) -> st.SearchStrategy[Example]:
    k = ex["rewards"].shape[1]
    return st.permutations(list(range(k))).map(lambda p: {**ex, "perm": p})


def _grouped(spread: bool = False, masked: bool = False) -> Callable[[], st.SearchStrategy[Example]]:
    if masked:
        return lambda: masked_inputs(grid_rewards(spread=spread), empty_rows=False)
    return lambda: grid_rewards(spread=spread).map(lambda r: {"rewards": r})


_SHIFT = st.sampled_from([-2.0, -0.5, 0.25, 1.0, 3.0])
_SCALE = st.sampled_from([0.5, 2.0, 10.0])


def _other(ex: Example) -> st.SearchStrategy[Example]:
    k = ex["rewards"].shape[1]
    return arrays(np.float64, (1, k), elements=st.sampled_from(GRID)).map(
        lambda a: {**ex, "other": torch.from_numpy(a)}
    )


def _group_props(masked: bool) -> list[Property]:
    g, gs = _grouped(masked=masked), _grouped(spread=True, masked=masked)
    shift = _with(g, shift=_SHIFT)
    return [
        Property(
            "shift", "A(R + c_g) = A(R): a constant added to a group's rewards changes nothing", False, shift, _shift
        ),
        Property("scale-invariant", "A(sR) = A(R) for s > 0 (normalised)", False, _with(gs, scale=_SCALE), _scale_inv),
        Property("scale-linear", "A(sR) = s A(R) for s > 0 (unnormalised)", False, _with(gs, scale=_SCALE), _scale_lin),
        Property(
            "permutation",
            "permuting a group's samples permutes their advantages",
            False,
            lambda: g().flatmap(_perms),
            _perm,
        ),
        Property(
            "groups-independent",
            "a group's advantages do not depend on the other groups",
            False,
            lambda: g().flatmap(_other),
            _groups,
        ),
        Property("constant-zero", "a group with equal rewards gets zero advantages", False, g, _constant),
    ]


def _masked_props(inputs: Callable[[], st.SearchStrategy[Example]]) -> list[Property]:
    return [
        Property("padding", "masked padding columns change no value at a valid position", True, inputs, _padding),
        Property("masked-zero", "the output is 0 at masked positions", False, inputs, _masked_zero),
    ]


PROPERTIES: dict[Form, list[Property]] = {
    Form.GROUPED: [
        *_group_props(False),
        Property("zero-sum", "each group's advantages sum to 0", False, _grouped(), _zero_sum),
    ],
    Form.GROUPED_MASKED: [*_masked_props(_grouped(masked=True)), *_group_props(True)],
    Form.TOKEN: [
        *_masked_props(token_inputs),
        Property(
            "scale-invariant",
            "A(sR) = A(R) for s > 0 (normalised)",
            False,
            _with(token_inputs, scale=_SCALE),
            _scale_inv,
        ),
        Property(
            "scale-linear",
            "A(sR) = s A(R) for s > 0 (unnormalised)",
            False,
            _with(token_inputs, scale=_SCALE),
            _scale_lin,
        ),
        Property("rows-independent", "a row's advantages do not depend on the other rows", False, token_inputs, _rows),
    ],
    Form.LOSS: [
        Property(
            "restoring",
            "A > 0, r < 1 (or A < 0, r > 1): the gradient moves the token back",
            True,
            lambda: policy_inputs(t=(1, 1)),
            _restoring,
        ),
        *_masked_props(policy_inputs),
        Property(
            "on-policy",
            "at ratio 1 the gradient of the summed loss is -A (REINFORCE)",
            False,
            policy_inputs,
            _reinforce,
        ),
        Property(
            "sign",
            "the gradient never pushes a token against its advantage's sign",
            False,
            lambda: policy_inputs(t=(1, 1), max_log_ratio=2.0),
            _sign,
        ),
        Property("rows-independent", "a row's loss does not depend on the other rows", False, policy_inputs, _rows),
    ],
    Form.KL: [
        Property("zero-at-equal", "k(l, l) = 0", False, kl_inputs, _kl_zero),
        Property("non-negative", "k >= 0", False, kl_inputs, _kl_nonneg),
        Property("stationary-at-equal", "dk/dlogp = 0 where logp = logp_ref", False, kl_inputs, _kl_grad_zero),
        Property("tokenwise", "each token's value depends on that token only", False, kl_inputs, _tokenwise),
    ],
}
"""The properties of each form, contract ones first."""


def search(
    fn: Callable[..., Any], form: Form, prop: Property, *, max_examples: int = 120
) -> tuple[str, Example] | None:
    """A shrunk input that breaks ``prop`` and what went wrong, or None if hypothesis finds none.

    An exception raised by ``fn`` on a property's (valid) input counts as breaking it.
    """

    def verdict(ex: Example) -> str | None:
        try:
            return prop.violation(fn, form, ex)
        except Exception as exc:  # the function raised on a valid input
            return f"raised {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"

    try:
        ex = find(prop.inputs(), lambda e: verdict(e) is not None, settings=settings(SEARCH, max_examples=max_examples))
    except NoSuchExample:
        return None
    return verdict(ex) or "fails", ex
