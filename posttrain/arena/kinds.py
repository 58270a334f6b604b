"""What the arena judges: a function of one of the package's estimator signatures, loaded by name.

Three kinds, five accepted signatures (``Form``), read from the function's required positional
parameters (names matter only where two forms have the same count):

| kind | form | call |
| --- | --- | --- |
| advantage | ``grouped`` | ``f(rewards [G, K]) -> [G, K]`` (GRPO, RLOO, Dr.GRPO) |
| advantage | ``grouped-masked`` | ``f(rewards [G, K], mask [B, T]) -> [B, T]`` (REINFORCE++ with a group baseline) |
| advantage | ``token`` | ``f(token_rewards [B, T], mask [B, T]) -> [B, T]`` (REINFORCE++; first parameter named ``token_rewards``) |
| loss | ``loss`` | ``f(logp, logp_old, advantages, mask) -> (loss [B, T], diagnostics)`` or ``-> loss [B, T]`` |
| kl | ``kl`` | ``f(logp, logp_ref) -> [B, T]`` |

``B = G * K`` rows in row-major order (the K samples of prompt 0 first). Keyword-only options must
have defaults (bind others with ``functools.partial``). Every form is brought to one canonical
per-token call here (`advantage_tokens`, `loss_values`, `kl_values`), which the toys and the
convention search use; the contract and the properties call the function in its own form.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import ADVANTAGES, KL_ESTIMATORS, POLICY_LOSSES, broadcast_sequence_advantages

__all__ = [
    "DEFAULT_BASELINES",
    "Form",
    "Kind",
    "Subject",
    "advantage_tokens",
    "first_tensor",
    "kl_values",
    "last_token_rewards",
    "load_function",
    "loss_values",
    "registered",
    "subject",
]


class Kind(StrEnum):
    """What the function estimates."""

    ADVANTAGE = "advantage"
    LOSS = "loss"
    KL = "kl"


class Form(StrEnum):
    """The accepted signatures (module docstring)."""

    GROUPED = "grouped"
    GROUPED_MASKED = "grouped-masked"
    TOKEN = "token"
    LOSS = "loss"
    KL = "kl"


SIGNATURES: dict[Form, str] = {
    Form.GROUPED: "f(rewards [G, K]) -> [G, K]",
    Form.GROUPED_MASKED: "f(rewards [G, K], mask [B, T]) -> [B, T]",
    Form.TOKEN: "f(token_rewards [B, T], mask [B, T]) -> [B, T]",
    Form.LOSS: "f(logp, logp_old, advantages, mask) -> (loss [B, T], diagnostics)",
    Form.KL: "f(logp, logp_ref) -> [B, T]",
}
"""One line per form, as error messages and reports print it."""

DEFAULT_BASELINES: dict[Kind, tuple[str, ...]] = {
    Kind.ADVANTAGE: ("grpo", "rloo", "drgrpo"),
    Kind.LOSS: ("ppo_clip", "cispo", "gspo"),
    Kind.KL: ("k1", "k2", "k3"),
}
"""Registered names the learning curves compare with when ``baselines`` is not given."""

REGISTRIES = {Kind.ADVANTAGE: ADVANTAGES, Kind.LOSS: POLICY_LOSSES, Kind.KL: KL_ESTIMATORS}


@dataclass(frozen=True)
class Subject:
    """A function with its kind and form; ``params`` are its positional parameter names."""

    name: str
    fn: Callable[..., Any]
    kind: Kind
    form: Form
    params: tuple[str, ...]

    @property
    def signature(self) -> str:
        return SIGNATURES[self.form]


def load_function(spec: str) -> tuple[str, Callable[..., Any]]:
    """``"module:function"`` or ``"path/to/file.py:function"`` -> ``(spec, function)``.

    The current directory is importable (as with ``python -m``). Raises `DomainError` in one line
    when the module does not import, has no such name, or the name is not a function.
    """
    if spec.count(":") != 1 or not all(spec.split(":")):
        raise DomainError(f"function: expected 'module:function' or 'file.py:function', got {spec!r}")
    where, name = spec.split(":")
    try:
        if where.endswith(".py"):
            path = Path(where).resolve()
            loader = importlib.util.spec_from_file_location(f"_arena_{path.stem}", path)
            if loader is None or loader.loader is None or not path.is_file():
                raise FileNotFoundError(f"no file {where}")
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(where)
    except Exception as exc:  # any import failure is the user's input: one line
        first = (str(exc).splitlines() or [""])[0]
        raise DomainError(f"function: {where!r} does not import ({type(exc).__name__}: {first})") from None
    if not hasattr(module, name):
        raise DomainError(f"function: module {where!r} has no name {name!r}")
    fn = getattr(module, name)
    if inspect.isclass(fn) or not callable(fn):
        raise DomainError(f"function: {spec!r} is a {type(fn).__name__}, not a function")
    return spec, fn


def _positional(fn: Callable[..., Any]) -> tuple[tuple[str, ...], list[str]]:
    """Required positional parameter names, and required keyword-only ones."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise DomainError(f"function: cannot read the signature of {fn!r} ({exc})") from None
    pos: list[str] = []
    kw_only: list[str] = []
    for p in sig.parameters.values():
        if p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        (kw_only if p.kind is p.KEYWORD_ONLY else pos).append(p.name)
    return tuple(pos), kw_only


def _form(kind: Kind, params: tuple[str, ...]) -> Form | None:
    n = len(params)
    if kind is Kind.ADVANTAGE:
        if n == 1:
            return Form.GROUPED
        if n == 2 and params[1] == "mask":
            return Form.TOKEN if params[0] == "token_rewards" else Form.GROUPED_MASKED
        return None
    if kind is Kind.LOSS:
        return Form.LOSS if n == 4 else None
    return Form.KL if n == 2 and params[1] != "mask" else None


def _infer_kind(params: tuple[str, ...]) -> Kind:
    if "logp_old" in params or len(params) == 4:
        return Kind.LOSS
    if "logp_ref" in params or (len(params) == 2 and params[1] != "mask" and "rewards" not in params[0]):
        return Kind.KL
    return Kind.ADVANTAGE


def subject(name: str, fn: Callable[..., Any], kind: Kind | str | None = None) -> Subject:
    """Check ``fn``'s signature against ``kind`` (inferred from the parameter names when None).

    Raises:
        DomainError: an unknown kind, a required keyword-only option, or a signature of no accepted
            form (the message gives the accepted ones).
    """
    params, kw_only = _positional(fn)
    if kind is None:
        k = _infer_kind(params)
    else:
        try:
            k = Kind(kind)
        except ValueError:
            raise DomainError(f"kind: expected one of {', '.join(Kind)}, got {kind!r}") from None
    if kw_only:
        raise DomainError(f"function: {name} needs keyword options {kw_only} without defaults; give them defaults")
    form = _form(k, params)
    if form is None:
        accepted = "; ".join(SIGNATURES[f] for f in Form if _kind_of(f) is k)
        got = f"({', '.join(params)})"
        raise DomainError(f"function: {name}{got} does not have a {k.value} signature; accepted: {accepted}")
    return Subject(name, fn, k, form, params)


def _kind_of(form: Form) -> Kind:
    return {Form.LOSS: Kind.LOSS, Form.KL: Kind.KL}.get(form, Kind.ADVANTAGE)


def registered(kind: Kind, name: str) -> Subject:
    """The registered estimator ``name`` of ``kind`` as a `Subject` (a `RegistryError` lists the valid names)."""
    fn = REGISTRIES[kind].get(name)
    return subject(name, fn, kind)


def last_token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """``[B, T]`` token rewards: each sequence's reward ``rewards [G, K]`` on its last valid token, 0 elsewhere."""
    flat = rewards.reshape(-1)
    t = mask.shape[-1]
    last = torch.where(mask, torch.arange(t, device=mask.device), -1).amax(-1)  # -1 for an empty row
    hit = torch.arange(t, device=mask.device) == last.unsqueeze(-1)
    return torch.where(hit & mask, flat.unsqueeze(-1), torch.zeros((), dtype=flat.dtype))


def first_tensor(out: Any) -> Tensor:
    """The output tensor of a call that returns a tensor or a ``(tensor, diagnostics)`` tuple."""
    if isinstance(out, Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], Tensor):
        return out[0]
    raise DomainError(f"function: expected a tensor or a (tensor, diagnostics) tuple, got {type(out).__name__}")


def advantage_tokens(s: Subject, rewards: Tensor, mask: Tensor) -> Tensor:
    """``[B, T]`` per-token advantages of an advantage subject from sequence rewards ``[G, K]`` and ``mask [B, T]``."""
    if s.form is Form.GROUPED:
        return broadcast_sequence_advantages(first_tensor(s.fn(rewards)), mask)
    if s.form is Form.GROUPED_MASKED:
        return first_tensor(s.fn(rewards, mask))
    return first_tensor(s.fn(last_token_rewards(rewards, mask), mask))


def loss_values(s: Subject, logp: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """``[B, T]`` per-token loss of a loss subject (the diagnostics are dropped)."""
    return first_tensor(s.fn(logp, logp_old, advantages, mask))


def kl_values(s: Subject, logp: Tensor, logp_ref: Tensor) -> Tensor:
    """``[B, T]`` per-token KL estimate of a KL subject."""
    return first_tensor(s.fn(logp, logp_ref))
