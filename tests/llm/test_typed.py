"""The one validator of typed options (`posttrain.llm.typed`) and the strict YAML loader (`posttrain.llm.config.load`)."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest

from posttrain.errors import DomainError
from posttrain.llm.config.load import MAX_NODES, apply_overrides, parse_yaml, read_yaml_mapping
from posttrain.llm.typed import Checked, OneOf, Range, check_options, from_mapping, parse, show


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass(frozen=True)
class Inner(Checked):
    k: Annotated[int, Range(1, 10)] = 2
    pair: tuple[Annotated[float, Range(0.0, 1.0, high_open=True)], float] = (0.5, 2.0)

    def check(self) -> None:
        if self.k == 7:
            raise DomainError("k: seven is refused by the cross-field check")


@dataclass(frozen=True)
class Outer(Checked):
    name: Annotated[str, OneOf(("a", "b"))] = "a"
    rate: Annotated[float, Range(0.0, None, low_open=True)] = 1.0
    mode: Literal["x", "y"] = "x"
    color: Color = Color.RED
    inner: Inner = field(default_factory=Inner)
    extra: Inner | None = None
    table: dict[str, int] = field(default_factory=dict)
    free: dict[str, Any] = field(default_factory=dict)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"name": "c"}, "x.name: unknown name 'c'; valid: a, b"),
        ({"rate": 0}, "x.rate: expected a number > 0.0, got 0.0"),
        ({"rate": "1e-3x"}, "x.rate: expected a number, got '1e-3x'"),
        ({"rate": True}, "x.rate: expected a number, got True"),
        ({"mode": "z"}, "x.mode: unknown name 'z'; valid: x, y"),
        ({"color": "green"}, "x.color: unknown name 'green'; valid: red, blue"),
        ({"inner": {"k": 0}}, "x.inner.k: expected an integer in [1, 10], got 0"),
        ({"inner": {"k": 2.0}}, "x.inner.k: expected an integer, got 2.0"),
        ({"inner": {"k": 7}}, "x.inner.k: seven is refused by the cross-field check"),
        ({"inner": {"pair": [1.0, 2.0]}}, "x.inner.pair[0]: expected a number in [0.0, 1.0), got 1.0"),
        ({"inner": {"pair": [0.5]}}, "x.inner.pair: expected a list of 2 items, got [0.5]"),
        ({"extra": {"q": 1}}, "x.extra: unknown key(s) q; valid: k, pair"),
        ({"table": {"a": "1"}}, "x.table.a: expected an integer, got '1'"),
        ({"free": {"a": [float("nan")]}}, "x.free.a[0]: expected a finite number, got nan"),
        ({"nope": 1}, "x: unknown key(s) nope; valid: name, rate, mode, color, inner, extra, table, free"),
    ],
)
def test_every_error_is_one_line_naming_the_dotted_key(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(DomainError) as info:
        from_mapping(Outer, raw, "x")
    assert str(info.value) == message


def test_values_are_converted_to_their_annotation() -> None:
    got = from_mapping(Outer, {"rate": "1e-3", "color": "blue", "inner": {"pair": [0.25, 3]}, "extra": None}, "x")
    assert got.rate == 1e-3 and got.color is Color.BLUE and got.inner.pair == (0.25, 3.0) and got.extra is None
    assert isinstance(got.inner.pair, tuple) and isinstance(got.inner.pair[1], float)


def test_limits_hold_when_built_in_python() -> None:
    with pytest.raises(DomainError, match=r"^k: expected an integer in \[1, 10\], got 11$"):
        Inner(k=11)
    with pytest.raises(DomainError, match="seven"):
        Inner(k=7)


def test_check_options_reads_a_callables_annotated_keywords() -> None:
    def target(x: int, *, scale: Annotated[float, Range(0.0, 2.0)] = 1.0, tag: str = "t", need: int) -> None: ...

    assert check_options("o", target, {"scale": 2, "need": 1}) == {"scale": 2.0, "need": 1}
    with pytest.raises(DomainError, match=r"^o\.scale: expected a number in \[0.0, 2.0\], got 3.0$"):
        check_options("o", target, {"scale": 3.0, "need": 1})
    with pytest.raises(DomainError, match=r"^o\.need: required"):
        check_options("o", target, {})
    with pytest.raises(DomainError, match=r"^o: unknown option\(s\) x; valid: scale, tag, need$"):
        check_options("o", target, {"x": 1, "need": 1})


def test_unsettable_types_are_refused_by_name() -> None:
    import torch

    with pytest.raises(DomainError, match=r"^o\.dtype: not settable from a config"):
        parse("o.dtype", "float32", torch.dtype)


def _laughs(levels: int) -> str:
    names = [f"l{i}" for i in range(levels)]
    lines = [f"{names[0]}: &{names[0]} [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for prev, name in itertools.pairwise(names):
        lines.append(f"{name}: &{name} [{', '.join(f'*{prev}' for _ in range(9))}]")
    return "\n".join(lines) + "\n"


def test_aliases_are_bounded_in_what_they_expand_to_and_in_time() -> None:
    small = parse_yaml(_laughs(3), "f")  # 9^3 values: aliases are allowed
    assert len(small["l2"]) == 9
    start = time.process_time()
    with pytest.raises(DomainError, match=rf"^f:\d+:\d+: refused: the document expands to more than {MAX_NODES}"):
        parse_yaml(_laughs(9), "f")  # 9^9: refused while composing, never expanded
    assert time.process_time() - start < 1.0


def test_show_is_bounded() -> None:
    nested: list[Any] = [1] * 9
    for _ in range(8):
        nested = [nested] * 9  # shared lists: 9^9 leaves
    start = time.process_time()
    text = show(nested)
    assert len(text) <= 120 and time.process_time() - start < 0.1
    assert len(show("x" * 10**6)) < 100


def test_strict_loader_files(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\nb: {c: 2, c: 3}\n")
    with pytest.raises(DomainError, match=rf"^{path}:2:11: refused: duplicate key 'c'$"):
        read_yaml_mapping(path)
    path.write_text("base: &b {x: 1}\nuse: {<<: *b, x: 2}\n")  # a merge key may repeat a merged key
    assert read_yaml_mapping(path)["use"] == {"x": 2}
    path.write_bytes(b"\xef\xbb\xbfa: 1\n")  # a UTF-8 byte order mark is fine
    assert read_yaml_mapping(path) == {"a": 1}


def test_overrides_parse_like_files() -> None:
    assert apply_overrides({}, ["a.b=none", "a.c=[1, 2]", "d=1e-3"]) == {"a": {"b": None, "c": [1, 2]}, "d": "1e-3"}
    with pytest.raises(DomainError, match=r"^--set a=\{x: 1, x: 2\}:"):
        apply_overrides({}, ["a={x: 1, x: 2}"])
