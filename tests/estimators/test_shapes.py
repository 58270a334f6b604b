"""Every dimension name in an estimator signature is in the glossary `posttrain.shapes`."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import posttrain.estimators
from posttrain.shapes import DIMENSIONS, LOCAL_DIMENSIONS

_DIM = re.compile(r"(?:Float|Bool|Int)\[Tensor, ['\"]([^'\"]*)['\"]\]")


def _annotation_dims() -> dict[str, set[str]]:
    """dimension name -> the functions whose signature uses it."""
    out: dict[str, set[str]] = {}
    for info in pkgutil.walk_packages(posttrain.estimators.__path__, "posttrain.estimators."):
        module = importlib.import_module(info.name)
        for name, fn in vars(module).items():
            if not inspect.isfunction(fn) or fn.__module__ != info.name:
                continue
            text = " ".join(str(v) for v in fn.__annotations__.values())
            for dims in _DIM.findall(text):
                for dim in dims.split():  # "*R" a variadic axis; "n+1" an expression of names
                    for part in [dim] if dim.startswith("*") else re.split(r"[+-]", dim):
                        if part and not part.isdigit():
                            out.setdefault(part, set()).add(f"{info.name}.{name}")
    return out


def test_every_dimension_name_is_documented() -> None:
    dims = _annotation_dims()
    assert {"B", "T", "G", "K", "V"} <= set(dims), "the annotations were not read"
    unknown = {d: sorted(fns)[:3] for d, fns in dims.items() if d not in DIMENSIONS and d not in LOCAL_DIMENSIONS}
    assert not unknown, f"dimension names missing from posttrain.shapes (document them there): {unknown}"
