"""The student-teacher tabular helpers against the tabular simulator's own exact quantities."""

from __future__ import annotations

import torch

from posttrain.simulators import TabularSpec, enumerate_sequences, sequence_logp, token_logp
from posttrain.simulators.teacher_tabular import exact_success, node_log_probs, visited_token_logp


def _table(seed: int, spec: TabularSpec) -> torch.Tensor:
    return torch.randn(
        2, 3, spec.num_nodes, spec.vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )


def test_visited_log_probs_match_the_simulator() -> None:
    spec = TabularSpec(vocab=3, horizon=3, eos=2)
    table = _table(0, spec)
    tokens = torch.randint(0, 3, (2, 3, 4, 3), generator=torch.Generator().manual_seed(1))
    tokens = torch.where(spec.response_mask(tokens), tokens, 0)  # canonical padding after EOS
    assert torch.allclose(visited_token_logp(spec, table, tokens), token_logp(spec, table, tokens), atol=1e-12)
    full = node_log_probs(spec, table, tokens)
    assert torch.allclose(full.exp().sum(-1), torch.ones(2, 3, 4, 3, dtype=torch.float64))


def test_exact_success_equals_the_enumerated_sum() -> None:
    spec = TabularSpec(vocab=3, horizon=3)
    table = _table(2, spec)
    seqs, _ = enumerate_sequences(spec)
    correct = seqs[torch.tensor([[1, 5], [7, 20], [0, 26]])].expand(2, 3, 2, 3)  # distinct per prompt
    probs = sequence_logp(spec, table).exp()
    want = probs.gather(-1, torch.tensor([[1, 5], [7, 20], [0, 26]]).expand(2, 3, 2)).sum(-1)
    assert torch.allclose(exact_success(spec, table, correct), want, atol=1e-12)
