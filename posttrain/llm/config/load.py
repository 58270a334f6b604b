"""Reading YAML for configs: one strict, bounded loader for files and ``--set`` overrides.

- the safe loader (plain data only); a key given twice in one mapping is refused (``file:line:column``);
- anchors and aliases are allowed, but the document they expand to is bounded (`MAX_NODES` values,
  `MAX_NESTING` levels) and a recursive alias is refused, so a "billion laughs" file fails at once instead
  of expanding 9^9 lists in whatever reads it next;
- a file is UTF-8 text of at most `MAX_BYTES` bytes holding a mapping; an empty one (or one of comments
  only) is refused: it would silently train every default;
- ``--set section.key=value``: the value is parsed by the same loader (``--set optim.lr=1e-4``,
  ``--set algorithm.kl=null``; ``none`` also means null).

Every failure is one `DomainError` line naming the file (with line and column where YAML gives them) or the
``--set`` item. Nothing here knows the run config's sections: `posttrain flops` reads its files the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from posttrain.errors import DomainError

__all__ = ["MAX_BYTES", "MAX_NESTING", "MAX_NODES", "apply_overrides", "parse_yaml", "read_yaml", "read_yaml_mapping"]

MAX_BYTES = 1 << 20
"""Largest config file or ``--set`` value (1 MiB)."""
MAX_NODES = 100_000
"""Most values (scalars, lists, mappings) a document may expand to, aliases counted at every use."""
MAX_NESTING = 64
"""Deepest nesting of lists and mappings in a document."""

_MERGE = "tag:yaml.org,2002:merge"


class _Refused(yaml.YAMLError):
    """A document the loader will not build (duplicate key, too large, recursive)."""

    def __init__(self, problem: str, mark: Any = None) -> None:
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


def _expanded_size(root: yaml.Node) -> None:
    """Raise `_Refused` when ``root`` expands (aliases counted at every use) to more than `MAX_NODES` values or
    `MAX_NESTING` levels, or holds a recursive alias. Linear in the number of distinct nodes."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if done:
            open_.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            if size[key] > MAX_NODES:
                raise _Refused(
                    f"the document expands to more than {MAX_NODES} values (through aliases?)", node.start_mark
                )
            if depth[key] > MAX_NESTING:
                raise _Refused(f"nested deeper than {MAX_NESTING} levels", node.start_mark)
            continue
        if key in size:
            continue
        if key in open_:
            raise _Refused("a recursive alias (a value that contains itself)", node.start_mark)
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys and documents too large to expand."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE:
                if key_node.value in seen:
                    raise _Refused(f"duplicate key {key_node.value!r}", key_node.start_mark)
                seen.add(key_node.value)
        return super().construct_mapping(node, deep)

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        _expanded_size(node)
        return self.construct_document(node)


def parse_yaml(text: str, where: str, *, marks: bool = True) -> Any:
    """``text`` parsed by the strict loader; any failure is one ``DomainError`` line ``where[:line:column]: ...``."""
    if len(text) > MAX_BYTES:
        raise DomainError(f"{where}: {len(text)} characters; at most {MAX_BYTES} are read")
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) if marks else None
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark is not None else where
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        kind = "refused" if isinstance(exc, _Refused) else "YAML syntax error"
        raise DomainError(f"{at}: {kind}: {problem}") from None
    except RecursionError:
        raise DomainError(f"{where}: refused: nested deeper than {MAX_NESTING} levels") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise DomainError(f"{where}: refused: {str(exc).splitlines()[0]}") from None


def read_yaml(path: str | Path) -> Any:
    """A YAML file read by the strict loader: UTF-8, at most `MAX_BYTES`; each failure names the file."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_BYTES:
            raise DomainError(f"{path}: {path.stat().st_size} bytes; a config file is at most {MAX_BYTES}")
        data = path.read_bytes()
    except OSError as exc:
        raise DomainError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DomainError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    return parse_yaml(text, str(path))


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """`read_yaml` of a file that must hold a mapping (an empty file, or one of comments only, is refused)."""
    raw = read_yaml(path)
    if raw is None:
        raise DomainError(f"{path}: the file is empty; expected a YAML mapping of config sections")
    if not isinstance(raw, Mapping):
        raise DomainError(f"{path}: expected a YAML mapping at the top level, got a {type(raw).__name__}")
    return dict(raw)


def apply_overrides(raw: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` strings to a raw mapping; values are parsed by the strict loader.

    Examples:
        >>> apply_overrides({"optim": {"lr": 0.1}}, ["optim.lr=0.001", "algorithm.method=rloo"])
        {'optim': {'lr': 0.001}, 'algorithm': {'method': 'rloo'}}
    """
    out: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in raw.items()}
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(p.strip() for p in parts):
            raise DomainError(f"--set: expected section.key=value, got {item[:80]!r}")
        node = out
        for p in parts[:-1]:
            child = node.get(p)
            node[p] = dict(child) if isinstance(child, Mapping) else {}
            node = node[p]
        value = parse_yaml(text, f"--set {item[:80]}", marks=False)
        node[parts[-1]] = None if isinstance(value, str) and value.lower() == "none" else value
    return out
