"""The dimension vocabulary of posttrain and jaxtyping aliases.

Every tensor in a signature uses these letters, and a letter never changes meaning:

|  |  |
| --- | --- |
| G | prompts / groups |
| K | samples (rollouts) per prompt |
| B | flat sequences; ``B = G * K`` when a batch is grouped |
| T | token positions of a response |
| V | vocabulary size |
| A | arms of a bandit |
| S | SDE time steps |
| D | state or parameter dimension |
| P | evolution-strategies population |
| N | Monte Carlo draws |

Masks are boolean and explicit (``Bool[Tensor, "B T"]``); log-space quantities are named
(``logp``, ``log_ratio``); tensor roles keep fixed names: ``logp``, ``logp_old``, ``logp_ref``,
``logp_teacher``, ``ratio``, ``mask``, ``rewards``, ``advantages``.

The estimators import ``Bool``, ``Float`` and ``Int`` from here, and a test reads every estimator
signature: each dimension name in it is one of `DIMENSIONS` or `LOCAL_DIMENSIONS` (names local to
one family of functions, with their meaning), so a new letter is documented before it is used.
Known double uses, kept because the papers write them so and documented where they occur: ``K``
is also the size of a top-K support in ``[B, T, K]`` tables (distillation, SIS); ``D`` also the
number of domains / teachers of multi-teacher distillation; ``S`` and ``P`` also the candidate
states and the prompts of rollout interventions.
"""

from __future__ import annotations

from jaxtyping import Bool, Float, Int
from torch import Tensor

__all__ = [
    "DIMENSIONS",
    "LOCAL_DIMENSIONS",
    "Bool",
    "Float",
    "GroupFloat",
    "Int",
    "SeqFloat",
    "Tensor",
    "TokenFloat",
    "TokenMask",
]

DIMENSIONS: dict[str, str] = {
    "G": "prompts / groups",
    "K": "samples per prompt",
    "B": "flat sequences (G*K when grouped)",
    "T": "token positions",
    "V": "vocabulary",
    "A": "bandit arms",
    "S": "SDE time steps",
    "D": "state or parameter dimension",
    "P": "ES population",
    "N": "Monte Carlo draws",
}

LOCAL_DIMENSIONS: dict[str, str] = {
    "M": "samples of a group beside another K (Tsallis traces, a group with its oracle row, kernel neighbours, a controller window)",
    "m": "rows of a weight matrix",
    "n": "columns of a weight matrix; samples per question (coverage); policy rows of a group (OraRL); branches",
    "b": "branch points of a trace",
    "X": "evaluation questions",
    "C": "replay buffer capacity in groups; domains of a mean by domain",
    "R": "selected buffer rows",
    "A": "intervention actions",
    "bins": "histogram bins",
    "*R": "leading batch axes of independent runs or seeds",
    "*S": "leading batch axes (seeds, methods)",
    "*P": "leading prompt axes",
    "*G": "leading group axes",
    "...": "any leading axes",
}
"""Dimension names used by one family of functions (their meaning there); see the module docstring."""

TokenFloat = Float[Tensor, "B T"]
TokenMask = Bool[Tensor, "B T"]
SeqFloat = Float[Tensor, " B"]
GroupFloat = Float[Tensor, "G K"]
