"""Typed options: the limits a field declares and the one validator that reads them.

An option is a field of a frozen dataclass (a config section, a stage's or a method's options) or a keyword
parameter of a callable (an estimator, an optimizer). Its annotation says everything the validator checks:

    steps: Annotated[int, Range(1, 10**8)] = 40
    top_p: Annotated[float, Range(0.0, 1.0, low_open=True)] = 1.0
    method: Annotated[str, OneOf(METHODS)] = "grpo"

`parse` turns a parsed-YAML value into the annotated type (``int``, ``float`` (YAML 1.1's ``1e-3`` string
included), ``bool``, ``str``, ``Literal``, an ``Enum`` by value, ``list``/``tuple``/``dict`` of those, ``X | None``,
a nested dataclass) and applies the metadata; anything else (a tensor, a dtype, a callable) is not settable
from a config. `from_mapping` builds a dataclass from a mapping (unknown keys name the valid ones) and runs
its cross-field ``check()``; `check_options` checks an option mapping against a dataclass or a callable's
keyword parameters. Every error is one `DomainError` line that starts with the dotted key. Values shown in
messages are cut short (`show`) and every walk over a value is bounded (`MAX_ITEMS`, `MAX_DEPTH`), so a
hostile value (a billion-laughs YAML) costs milliseconds.

A dataclass that inherits `Checked` validates its annotated fields (and runs ``check()``) when built in
Python too, so a limit is declared once and holds on both paths.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import math
import reprlib
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from posttrain.errors import DomainError

__all__ = [
    "MAX_DEPTH",
    "MAX_ITEMS",
    "Checked",
    "Matches",
    "OneOf",
    "Range",
    "check_fields",
    "check_options",
    "from_mapping",
    "option_hints",
    "parse",
    "show",
]

T = TypeVar("T")
MAX_ITEMS = 10_000
"""Most items a list or mapping option may hold (and the most any value walk visits)."""
MAX_DEPTH = 16
"""Deepest nesting of lists and mappings an option may have."""

_SHOW = reprlib.Repr()
_SHOW.maxstring, _SHOW.maxother, _SHOW.maxlist, _SHOW.maxdict, _SHOW.maxlevel = 60, 60, 6, 6, 3


def show(value: Any) -> str:
    """A short repr of ``value`` for an error message (bounded in length and in the work done)."""
    text = _SHOW.repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _fail(where: str, message: str) -> DomainError:
    return DomainError(f"{where}: {message}")


@dataclass(frozen=True)
class Range:
    """A number in ``[low, high]``; ``low_open`` / ``high_open`` exclude the end; ``None``: unbounded."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def text(self, what: str = "a number") -> str:
        if self.high is None:
            return f"{what} {'>' if self.low_open else '>='} {self.low}"
        if self.low is None:
            return f"{what} {'<' if self.high_open else '<='} {self.high}"
        return f"{what} in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"

    def check(self, where: str, value: Any) -> None:
        lo, hi = self.low, self.high
        if (lo is not None and (value < lo or (self.low_open and value == lo))) or (
            hi is not None and (value > hi or (self.high_open and value == hi))
        ):
            what = "an integer" if isinstance(value, int) else "a number"
            raise _fail(where, f"expected {self.text(what)}, got {show(value)}")


@dataclass(frozen=True)
class OneOf:
    """A name among ``names``: a tuple, or anything with ``.names()`` (a registry) or a callable, read when checked."""

    names: Any

    def valid(self) -> list[str]:
        source = self.names
        if hasattr(source, "names"):
            source = source.names()
        elif callable(source):
            source = source()
        return sorted(str(n) for n in source)

    def check(self, where: str, value: Any) -> None:
        valid = self.valid()
        if value not in valid:
            raise _fail(where, f"unknown name {show(value)}; valid: {', '.join(valid)}")


@dataclass(frozen=True)
class Matches:
    """A string that ``test`` accepts; ``what`` describes the expected form."""

    test: Callable[[str], bool]
    what: str

    def check(self, where: str, value: Any) -> None:
        if not self.test(value):
            raise _fail(where, f"expected {self.what}, got {show(value)}")


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _number(where: str, value: Any, tp: type) -> Any:
    if isinstance(value, bool):
        raise _fail(where, f"expected {'an integer' if tp is int else 'a number'}, got {show(value)}")
    if tp is int:
        if isinstance(value, int):
            return value
        raise _fail(where, f"expected an integer, got {show(value)}")
    if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            raise _fail(where, f"expected a number, got {show(value)}") from None
    if not isinstance(value, int | float):
        raise _fail(where, f"expected a number, got {show(value)}")
    try:
        out = float(value)
    except OverflowError:
        raise _fail(where, f"expected a finite number, got {show(value)}") from None
    if not math.isfinite(out):
        raise _fail(where, f"expected a finite number, got {show(value)}")
    return out


def _sequence(where: str, value: Any, args: tuple[Any, ...], origin: Any, depth: int) -> Any:
    if not isinstance(value, list | tuple):
        want = f"a list of {len(args)} items" if origin is tuple and args and args[-1] is not Ellipsis else "a list"
        raise _fail(where, f"expected {want}, got {show(value)}")
    if len(value) > MAX_ITEMS:
        raise _fail(where, f"expected at most {MAX_ITEMS} items, got {len(value)}")
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(value) != len(args):
            raise _fail(where, f"expected a list of {len(args)} items, got {show(value)}")
        return tuple(parse(f"{where}[{i}]", v, a, depth + 1) for i, (v, a) in enumerate(zip(value, args, strict=True)))
    item = args[0] if args else Any
    out = [parse(f"{where}[{i}]", v, item, depth + 1) for i, v in enumerate(value)]
    return tuple(out) if origin is tuple else out


def _mapping(where: str, value: Any, args: tuple[Any, ...], depth: int) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(where, f"expected a mapping, got {show(value)}")
    if len(value) > MAX_ITEMS:
        raise _fail(where, f"expected at most {MAX_ITEMS} keys, got {len(value)}")
    item = args[1] if len(args) == 2 else Any
    out = {}
    for k, v in value.items():
        if not isinstance(k, str):
            raise _fail(where, f"expected string keys, got {show(k)}")
        out[k] = parse(f"{where}.{k}", v, item, depth + 1)
    return out


def _free(where: str, value: Any, depth: int) -> Any:
    """An ``Any`` value: numbers finite, strings/lists/mappings within the size and depth limits."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return _number(where, value, float)
    if isinstance(value, list | tuple):
        return _sequence(where, value, (), list, depth)
    if isinstance(value, Mapping):
        return _mapping(where, value, (), depth)
    raise _fail(where, f"expected a YAML value, got {show(value)}")


def _union(where: str, value: Any, args: tuple[Any, ...], depth: int) -> Any:
    if value is None and type(None) in args:
        return None
    options = [a for a in args if a is not type(None)]
    errors = []
    for option in options:
        try:
            return parse(where, value, option, depth)
        except DomainError as exc:
            errors.append(str(exc))
    if len(errors) == 1:
        raise DomainError(errors[0])
    settable = [e for e in errors if "not settable" not in e]
    raise DomainError(settable[0] if len(settable) == 1 else f"{where}: {show(value)} fits none of {type_text(args)}")


def type_text(tp: Any) -> str:
    """A readable name of an annotation."""
    if isinstance(tp, tuple):
        return " | ".join(type_text(t) for t in tp)
    if typing.get_origin(tp) is typing.Annotated:
        return type_text(typing.get_args(tp)[0])
    return str(getattr(tp, "__name__", None) or tp).replace("typing.", "")


def parse(where: str, value: Any, tp: Any, depth: int = 0) -> Any:
    """``value`` (parsed YAML) checked and converted to the annotation ``tp``; `DomainError` naming ``where``."""
    if depth > MAX_DEPTH:
        raise _fail(where, f"nested deeper than {MAX_DEPTH} levels")
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        out = parse(where, value, args[0], depth)
        if out is not None:
            for meta in args[1:]:
                if hasattr(meta, "check"):
                    meta.check(where, out)
        return out
    if tp is Any or tp is object:
        return _free(where, value, depth)
    if origin in (typing.Union, types.UnionType):
        return _union(where, value, args, depth)
    if origin is typing.Literal:
        if not any(type(value) is type(a) and value == a for a in args):
            raise _fail(where, f"unknown name {show(value)}; valid: {', '.join(map(str, args))}")
        return value
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except (ValueError, TypeError):
            raise _fail(where, f"unknown name {show(value)}; valid: {', '.join(str(m.value) for m in tp)}") from None
    if _is_dataclass_type(tp):
        return value if isinstance(value, tp) else from_mapping(tp, value, where)
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        return _sequence(where, value, args, tuple if origin is tuple or tp is tuple else list, depth)
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        return _mapping(where, value, args, depth)
    if tp in (int, float):
        return _number(where, value, tp)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _fail(where, f"expected true or false, got {show(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise _fail(where, f"expected a string, got {show(value)}")
    raise _fail(where, f"not settable from a config (its type is {type_text(tp)})")


_HINTS: dict[Any, dict[str, Any]] = {}


def _field_hints(cls: Any) -> dict[str, Any]:
    """The resolved annotations (``Annotated`` kept) of a dataclass, once per class."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls, include_extras=True)
    return hints


def _prefixed(where: str, message: str, names: Iterable[str]) -> str:
    """A message raised inside a class (``"field: ..."``) with the dotted key in front."""
    head = message.split(":", 1)[0]
    if not where or head.startswith(where):
        return message
    if head.split(".")[0].split("[")[0] in set(names):
        return f"{where}.{message}"
    return f"{where}: {message}"


def from_mapping(cls: type[T], raw: Any, where: str) -> T:
    """A frozen dataclass from a parsed YAML mapping: unknown keys name the valid ones, every field is parsed by
    `parse` (sections recurse), errors raised by the class itself get the key ``where`` in front."""
    if not isinstance(raw, Mapping):
        raise _fail(where or "config", f"expected a mapping, got {show(raw)}")
    names = [f.name for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    unknown = sorted(str(k) for k in raw if k not in names)
    if unknown:
        raise _fail(where or "config", f"unknown key(s) {', '.join(unknown)}; valid: {', '.join(names)}")
    hints = _field_hints(cls)
    kwargs = {name: parse(f"{where}.{name}" if where else name, value, hints[name]) for name, value in raw.items()}
    try:
        return cls(**kwargs)
    except DomainError as exc:
        raise DomainError(_prefixed(where, str(exc), names)) from None


def check_fields(obj: Any) -> None:
    """Check every annotated field of the dataclass ``obj`` against its limits, then its ``check()`` (if any)."""
    hints = _field_hints(type(obj))
    for f in dataclasses.fields(obj):
        parse(f.name, getattr(obj, f.name), hints[f.name])
    check = getattr(obj, "check", None)
    if callable(check):
        check()


class Checked:
    """Base of an options dataclass whose limits also hold when it is built in Python (`check_fields`)."""

    def __post_init__(self) -> None:
        check_fields(self)


def option_hints(target: Any, *, skip: Iterable[str] = ()) -> tuple[dict[str, Any], list[str], bool]:
    """``(annotations, required names, accepts any name)`` of the options of ``target``: a dataclass (its fields)
    or a callable (its keyword parameters with a default, or keyword-only); ``skip``: ones the caller passes."""
    skipped = set(skip)
    if _is_dataclass_type(target):
        fields = [f for f in dataclasses.fields(target) if f.init]
        hints = _field_hints(target)
        required = [
            f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        return {f.name: hints[f.name] for f in fields}, required, False
    fn = inspect.unwrap(target.__init__ if isinstance(target, type) else target)  # type: ignore[misc]
    params = list(inspect.signature(fn).parameters.values())
    try:
        resolved = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # a third-party class whose annotations do not resolve: names only
        resolved = {}
    options, required = {}, []
    for p in params:
        if p.name in skipped or p.name == "self":
            continue
        if p.kind is p.KEYWORD_ONLY or (p.kind is p.POSITIONAL_OR_KEYWORD and p.default is not p.empty):
            options[p.name] = resolved.get(p.name, Any)
            if p.default is p.empty:
                required.append(p.name)
    return options, required, any(p.kind is p.VAR_KEYWORD for p in params)


def check_options(where: str, target: Any, options: Mapping[str, Any], *, skip: Iterable[str] = ()) -> dict[str, Any]:
    """An option mapping checked against ``target`` (see `option_hints`) without building it; returns the parsed
    values. Unknown names list the valid ones, a required one that is missing is named, each value is parsed
    against its annotation.

    Examples:
        >>> from posttrain.llm.rollout.tasks import Multiple
        >>> check_options("data.options", Multiple, {"high": 9})
        {'high': 9}
        >>> check_options("data.options", Multiple, {"hihg": 9})
        Traceback (most recent call last):
        ...
        posttrain.errors.DomainError: data.options: unknown option(s) hihg; valid: low, high, bound
    """
    if not isinstance(options, Mapping):
        raise _fail(where, f"expected a mapping, got {show(options)}")
    hints, required, open_ended = option_hints(target, skip=skip)
    unknown = sorted(str(k) for k in options if k not in hints)
    if unknown and not open_ended:
        raise _fail(where, f"unknown option(s) {', '.join(unknown)}; valid: {', '.join(hints) or '(none)'}")
    missing = [name for name in required if name not in options]
    if missing:
        raise _fail(f"{where}.{missing[0]}", "required (no default)")
    return {k: parse(f"{where}.{k}", v, hints.get(k, Any)) for k, v in options.items()}
