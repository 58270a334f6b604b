"""Divergences between policies: sample KL estimators and exact / top-K reverse KL.

| module | |
| --- | --- |
| `kl` | Schulman's k1, k2, k3 estimators and the straight-through combination |
| `reverse_kl` | reverse KL over the full vocabulary or a top-K support |
"""

from __future__ import annotations

from posttrain.estimators.divergences.kl import k1_kl, k2_kl, k3_kl, straight_through
from posttrain.estimators.divergences.reverse_kl import full_reverse_kl, topk_reverse_kl, topk_reverse_kl_reward

__all__ = [
    "full_reverse_kl",
    "k1_kl",
    "k2_kl",
    "k3_kl",
    "straight_through",
    "topk_reverse_kl",
    "topk_reverse_kl_reward",
]
