"""The ``posttrain arena`` command's body: load the function, judge it, print the summary, write the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posttrain.errors import DomainError

__all__ = ["main"]


def main(function: str, *, kind: str | None, baselines: str | None, seeds: int, out: str | None, console: Any) -> None:
    """Run `posttrain.arena.judge` on ``function`` (``module:function`` or ``file.py:function``).

    Raises:
        DomainError: the function does not load or has no accepted signature, an unknown kind, fewer
            than 2 seeds, or a missing extra (hypothesis, matplotlib) named in one line.
        RegistryError: an unknown baseline.
    """
    try:
        from posttrain.arena import judge, load_function
        from posttrain.arena.summary import print_summary
    except ImportError as exc:  # hypothesis ([testing]) or rich ([cli]) missing
        raise DomainError(str(exc).splitlines()[0]) from None
    if out is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise DomainError('--out draws a figure with matplotlib: pip install "posttrain[plots]"') from None
    spec, fn = load_function(function)
    names = [b.strip() for b in baselines.split(",") if b.strip()] if baselines else None
    report = judge(fn, kind=kind, baselines=names, seeds=seeds, name=spec, out=out)
    paths = None
    if out is not None:
        paths = {
            "markdown": Path(out) / "report.md",
            "json": Path(out) / "report.json",
            "figure": Path(out) / "arena.png",
        }
    print_summary(report, paths, console)
