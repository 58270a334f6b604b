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
"""

from __future__ import annotations

from jaxtyping import Bool, Float, Int
from torch import Tensor

__all__ = [
    "DIMENSIONS",
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

TokenFloat = Float[Tensor, "B T"]
TokenMask = Bool[Tensor, "B T"]
SeqFloat = Float[Tensor, " B"]
GroupFloat = Float[Tensor, "G K"]
