"""posttrain: LLM post-training methods implemented correctly, tested as mathematics, and fast.

Subpackages: `posttrain.estimators` (pure torch estimators), `posttrain.theory`
(analytic results), `posttrain.simulators` (toys with exact answers),
`posttrain.paper_checks` (one check per paper), `posttrain.llm` (trainer on causal LMs).
"""

from posttrain.errors import ConvergenceError, DomainError, PosttrainError, RegistryError, ShapeError

__version__ = "0.1.0"  # the one version source: pyproject.toml reads it ([tool.setuptools.dynamic])

__all__ = ["ConvergenceError", "DomainError", "PosttrainError", "RegistryError", "ShapeError", "__version__"]
