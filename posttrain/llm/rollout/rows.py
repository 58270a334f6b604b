"""The rows a file-backed task (``jsonl``, ``dataset``) reads: every one checked at load, named by its number.

A row's prompt and answer (and domain label, when a task has one) must be present, not null (nor a float
NaN, how a parquet file stores a missing number) and not blank. A prompt must be text; an answer or a
label may be text or a number (written as text, ``7`` -> ``"7"``). Rows are counted from 1, as an editor
counts lines.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from posttrain.errors import DomainError

__all__ = ["cell_text"]


def cell_text(key: str, where: str, row: Any, column: str, *, text_only: bool = False) -> str:
    """``row[column]`` as non-blank text, or ``DomainError`` naming ``key`` and ``where`` (e.g. "row 3 of 'd.jsonl'").

    Args:
        key: the config key the column comes from (``data.options.prompt``).
        where: the row, as a person finds it in the file.
        row: the parsed row (a mapping; anything else is refused).
        column: the column name.
        text_only: refuse numbers too (a prompt is text).

    Examples:
        >>> cell_text("data.options.answer", "row 1 of 'd.jsonl'", {"answer": 7}, "answer")
        '7'
    """
    if not isinstance(row, Mapping):
        raise DomainError(f"{key}: {where} is not a JSON object (got {type(row).__name__})")
    value = row.get(column)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        raise DomainError(f"{key}: {where} has no value in column {column!r}")
    allowed: tuple[type, ...] = (str,) if text_only else (str, int, float)
    if not isinstance(value, allowed):
        expected = "text" if text_only else "text or a number"
        raise DomainError(f"{key}: {where} column {column!r} holds {type(value).__name__}, expected {expected}")
    text = str(value)
    if not text.strip():
        raise DomainError(f"{key}: {where} has an empty {column!r}")
    return text
