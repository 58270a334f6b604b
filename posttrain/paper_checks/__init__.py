"""One check per paper: a claim, seeded experiments, a table and a verdict.

Checks register a :class:`~posttrain.paper_checks.base.PaperCheck` in :data:`CHECKS` under the
paper's two-digit id when their module is imported; :func:`load_all` imports every module listed
in :data:`MODULES`. ``posttrain check`` runs them (see ``_harness.py``).
"""

from __future__ import annotations

import importlib
from typing import Any

from posttrain.registry import Registry, registry

__all__ = ["CHECKS", "MODULES", "load_all", "register_check"]

CHECKS: Registry[Any] = registry("paper_check")

# One line per check module; a module registers its check on import.
MODULES: list[str] = []


def register_check(check: Any) -> Any:
    """Register a :class:`PaperCheck` under its id (summary = its claim)."""
    CHECKS.add(check.id, check, paper=check.paper, summary=check.claim)
    return check


def load_all() -> None:
    """Import every check module (each registers itself)."""
    for name in MODULES:
        importlib.import_module(name)
