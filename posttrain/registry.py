"""Named registries: one per kind of thing (advantage estimators, policy losses, KL estimators,
paper checks, ...).

A registry maps a name to an `Entry` (the object, a one-line summary taken from its
docstring, and the paper it comes from). Registering a taken name raises at import time; looking
up an unknown name raises `RegistryError` listing the valid names.
Config and CLI code resolve names here, at the edge; estimators never see a registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from posttrain.errors import RegistryError

__all__ = ["REGISTRIES", "Entry", "Registry", "registry"]

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered object with the facts ``posttrain list`` prints."""

    name: str
    obj: T
    summary: str
    paper: str


def _first_line(obj: object) -> str:
    doc = getattr(obj, "__doc__", None) or ""
    for line in doc.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


class Registry(Generic[T]):
    """A name table for one kind of object."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, *, paper: str = "", summary: str | None = None) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name``; a taken name raises ``RegistryError``."""

        def deco(obj: T) -> T:
            self.add(name, obj, paper=paper, summary=summary)
            return obj

        return deco

    def add(self, name: str, obj: T, *, paper: str = "", summary: str | None = None) -> None:
        """Register ``obj`` under ``name`` (non-decorator form)."""
        if not name or not isinstance(name, str):
            raise RegistryError(f"{self.kind} registry: name must be a non-empty string, got {name!r}")
        if name in self._entries:
            raise RegistryError(f"{self.kind} registry: the name {name!r} is already registered")
        self._entries[name] = Entry(name, obj, summary if summary is not None else _first_line(obj), paper)

    def get(self, name: str) -> T:
        """The object registered as ``name``; unknown names list the valid ones."""
        return self.entry(name).obj

    def entry(self, name: str) -> Entry[T]:
        """The full entry registered as ``name``."""
        try:
            return self._entries[name]
        except KeyError:
            valid = ", ".join(sorted(self._entries)) or "(none)"
            raise RegistryError(f"unknown {self.kind} {name!r}; valid names: {valid}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(sorted(self._entries.values(), key=lambda e: e.name))

    def __len__(self) -> int:
        return len(self._entries)


REGISTRIES: dict[str, Registry[object]] = {}


def registry(kind: str) -> Registry[object]:
    """The process-wide registry for ``kind``, created on first use."""
    if kind not in REGISTRIES:
        REGISTRIES[kind] = Registry(kind)
    return REGISTRIES[kind]
