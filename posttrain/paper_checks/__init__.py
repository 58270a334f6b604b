"""One check per paper: a claim, seeded experiments, a table and a verdict.

Checks register themselves in :data:`CHECKS` (a :class:`posttrain.registry.Registry`) under the
paper's two-digit id; ``posttrain check`` runs them.
"""

from __future__ import annotations

from typing import Any

from posttrain.registry import Registry, registry

__all__ = ["CHECKS"]

CHECKS: Registry[Any] = registry("paper_check")
