"""The shared-feature tree student against the tabular simulator: it is a tabular policy whose table is phi @ W."""

from __future__ import annotations

import torch

from posttrain.simulators import SeedRNG, TabularSpec, enumerate_sequences, sample_sequences, token_logp
from posttrain.simulators.feature_tree import FeatureStudent, train_shared
from posttrain.simulators.teacher_tabular import TeacherStep, exact_success

SPEC = TabularSpec(vocab=3, horizon=3)


def _student_and_weights(runs: int = 4) -> tuple[FeatureStudent, torch.Tensor]:
    student = FeatureStudent.random(SPEC, [5, 6], prompts=3, dim=4)
    gen = torch.Generator().manual_seed(0)
    return student, torch.randn(runs, 4, SPEC.vocab, generator=gen, dtype=torch.float64)


def _table(student: FeatureStudent, weights: torch.Tensor) -> torch.Tensor:
    """``[R, G, N, V]`` the dense logit table of each run (run r reads seed r % S's features)."""
    s = student.features.shape[0]
    feats = student.features[torch.arange(weights.shape[0]) % s]  # [R, G, N, D]
    return torch.einsum("rgnd,rdv->rgnv", feats, weights)


def test_token_log_probs_and_success_equal_the_tabular_policy_of_its_table() -> None:
    student, w = _student_and_weights()
    table = _table(student, w)
    seqs, _ = enumerate_sequences(SPEC)
    tokens = seqs[torch.randint(0, seqs.shape[0], (4, 3, 5), generator=torch.Generator().manual_seed(1))]
    assert torch.allclose(student.token_logp(w, tokens), token_logp(SPEC, table, tokens), atol=1e-12)
    correct = seqs[torch.tensor([[0, 4], [9, 26], [13, 14]])].expand(4, 3, 2, 3)
    assert torch.allclose(student.success(w, correct), exact_success(SPEC, table, correct), atol=1e-12)


def test_samples_are_the_tabular_samples_of_its_table() -> None:
    """Same uniforms, same inverse-CDF draws: the sampler is the tabular sampler reading phi @ W on the fly."""
    student, w = _student_and_weights()
    tokens, mask = student.sample(w, 6, SeedRNG.from_seeds([3, 4, 3, 4]))
    want, want_mask, _ = sample_sequences(SPEC, _table(student, w), 6, SeedRNG.from_seeds([3, 4, 3, 4]))
    assert torch.equal(tokens, want) and torch.equal(mask, want_mask)


def test_sample_frequencies_match_the_exact_sequence_probabilities() -> None:
    """Monte Carlo: 20,000 draws of one prompt against the enumerated probabilities, within 4 standard errors."""
    student, w = _student_and_weights(runs=2)
    tokens, _ = student.sample(w, 20_000, SeedRNG.from_seeds([9, 10]))
    seqs, _ = enumerate_sequences(SPEC)
    index = (tokens[0, 0].unsqueeze(1) == seqs.unsqueeze(0)).all(-1).to(torch.float64).argmax(-1)
    freq = torch.bincount(index, minlength=seqs.shape[0]).to(torch.float64) / 20_000
    p = student.token_logp(w, seqs.expand(2, 3, -1, -1)).sum(-1).exp()[0, 0]
    assert torch.allclose(p.sum(), torch.tensor(1.0, dtype=torch.float64))
    assert bool(((freq - p).abs() <= 4 * (p * (1 - p) / 20_000).sqrt() + 1e-12).all())


def test_runs_train_independently() -> None:
    """Each run's loss is its own token mean: a run trained alone ends where it ends in a batch of runs."""
    student, w = _student_and_weights()

    def reward(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (tokens == 0).all(-1).to(torch.float64)

    def loss(ctx: TeacherStep) -> torch.Tensor:  # REINFORCE on the raw reward, one value per token
        return -ctx.logp * ctx.rewards.reshape(-1, 1)

    both = train_shared(student, w, loss, reward, steps=3, k=4, seeds=[3, 4, 3, 4], lr=0.1)
    half = train_shared(student, w[2:], loss, reward, steps=3, k=4, seeds=[3, 4], lr=0.1)
    assert not torch.equal(both, w)
    assert torch.allclose(both[2:], half, atol=1e-12)
