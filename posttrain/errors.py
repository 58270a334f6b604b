"""Exception hierarchy of posttrain.

``PosttrainError`` is the root. ``ShapeError`` (wrong rank, size or dtype) and ``DomainError``
(a value outside its allowed range: an empty mask, ``eps <= 0``, ``k > n``) are both
``ValueError`` subclasses, so code that catches ``ValueError`` keeps working.
``ConvergenceError`` is raised when a numerical solver does not reach an optimal status.
"""

from __future__ import annotations


class PosttrainError(Exception):
    """Root of every error raised on purpose by posttrain."""


class ShapeError(PosttrainError, ValueError):
    """An argument has the wrong rank, size, or dtype."""


class DomainError(PosttrainError, ValueError):
    """An argument's value is outside the set the function is defined on."""


class ConvergenceError(PosttrainError, RuntimeError):
    """A solver stopped without an optimal (or optimal-inaccurate) status."""


class RegistryError(PosttrainError, KeyError):
    """Unknown or duplicate name in one of posttrain's registries."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""
