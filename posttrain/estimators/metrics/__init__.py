"""Metrics: pass@k, entropies, answer coverage and the diagnostics of the methods.

| module | |
| --- | --- |
| `passk` | unbiased pass@k and mean@k |
| `entropy` | token entropy and the entropy lens |
| `coverage` | answer coverage of sampled solutions |
| `diagnostics` | diagnostics of the methods: advantage inversions, top-K overlap, sign conflicts, headroom recovery |
"""

from __future__ import annotations

from posttrain.estimators.metrics.coverage import accuracy_bins, answer_entropy, majority_vote_correct
from posttrain.estimators.metrics.diagnostics import headroom_recovery, inversion_rate, sign_conflict_rate, topk_overlap
from posttrain.estimators.metrics.entropy import EntropyLens, domain_means, entropy_lens, token_entropy
from posttrain.estimators.metrics.passk import mean_at_k, pass_at_k

__all__ = [
    "EntropyLens",
    "accuracy_bins",
    "answer_entropy",
    "domain_means",
    "entropy_lens",
    "headroom_recovery",
    "inversion_rate",
    "majority_vote_correct",
    "mean_at_k",
    "pass_at_k",
    "sign_conflict_rate",
    "token_entropy",
    "topk_overlap",
]
