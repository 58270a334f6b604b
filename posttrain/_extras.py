"""Which optional extra provides a missing module, for one-line error messages.

The core install (``pip install posttrain``: torch, numpy, scipy, jaxtyping) is enough for
`posttrain.estimators`, `posttrain.simulators` and the verl plug-in; everything else comes
from an extra declared in ``pyproject.toml``.
"""

from __future__ import annotations

__all__ = ["EXTRA_OF_MODULE", "FULL", "missing_extra_message"]

EXTRA_OF_MODULE: dict[str, str] = {
    "typer": "cli",
    "rich": "cli",
    "yaml": "cli",
    "sympy": "theory",
    "cvxpy": "theory",
    "matplotlib": "plots",
    "transformers": "llm",
    "accelerate": "llm",
    "safetensors": "llm",
    "tokenizers": "llm",
    "math_verify": "llm",
    "trl": "trl",
    "vllm": "vllm",
    "verl": "verl",
    "wandb": "wandb",
    "hypothesis": "testing",
    "gguf": "real",
    "mkdocs": "docs",
}
"""Top-level module name -> the extra of ``pyproject.toml`` that installs it."""

FULL = frozenset({"cli", "theory", "plots"})
"""The extras that ``[full]`` combines."""


def missing_extra_message(exc: ModuleNotFoundError) -> str | None:
    """One line naming the extra that provides the module ``exc`` is about, or ``None`` if no extra does.

    Examples:
        >>> missing_extra_message(ModuleNotFoundError("No module named 'cvxpy'", name="cvxpy"))
        "posttrain: this needs 'cvxpy', from the [theory] extra: pip install 'posttrain[theory]' (or [full])"
        >>> missing_extra_message(ModuleNotFoundError("No module named 'nope'", name="nope")) is None
        True
    """
    top = (exc.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    if extra is None:
        return None
    also = " (or [full])" if extra in FULL else ""
    return f"posttrain: this needs {top!r}, from the [{extra}] extra: pip install 'posttrain[{extra}]'{also}"
