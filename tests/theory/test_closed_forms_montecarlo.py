"""Closed forms with no other test against simulation: each against Monte-Carlo draws, Z = 4 standard errors.

- `es_coverage.softmax_fisher_trace` and Lemma 1's `expected_policy_js`: the policy JS diversity of P
  members whose logits are perturbed by $\\sigma\\varepsilon$ has mean $\\frac{\\sigma^2}{2}(1-\\frac1P)\\,
  \\mathrm{tr}\\,\\mathcal I$ as $\\sigma\\to0$; measured at $\\sigma = 0.02$, where the $O(\\sigma^4)$ term is below
  1% of the value (the tolerance adds it: 1% of the prediction);
- `es_coverage.zero_bin_fraction` and `regression_progression`: expected counts of prompts with no correct
  answer among n samples and of regressions / progressions, against sampled answers;
- `simulators.interval_grounding`: the exact answer distribution $\\exp$ `answer_log_probs` and the exact
  expected tIoU against `sample_answers`.

Each test also rejects a mutant (the closed form x 1.05 or x 0.95) at the same tolerance.
"""

from __future__ import annotations

import math

import torch

from posttrain.simulators._base import SeedRNG
from posttrain.simulators.interval_grounding import IntervalTask, answer_log_probs, sample_answers, tiou
from posttrain.theory.es_coverage import (
    expected_policy_js,
    policy_js_diversity,
    regression_progression,
    softmax_fisher_trace,
    zero_bin_fraction,
)

Z = 4.0
F64 = torch.float64


def _mean_se(x: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return x.mean(dim), x.std(dim) / math.sqrt(x.shape[dim])


def test_fisher_trace_is_the_expected_squared_score() -> None:
    """$E_{a\\sim\\pi}\\|e_a-\\pi\\|^2 = 1-\\sum\\pi^2$ (enumerated) and its sampled mean."""
    probs = torch.softmax(torch.tensor([1.0, 0.2, -0.5, -1.3, 0.0], dtype=F64), 0)
    score = torch.eye(5, dtype=F64) - probs  # row a: e_a - pi
    enumerated = (probs * score.square().sum(-1)).sum()
    assert torch.isclose(enumerated, softmax_fisher_trace(probs), rtol=1e-12)
    arms = torch.multinomial(probs, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    mean, se = _mean_se(score[arms].square().sum(-1))
    assert abs(float(mean - softmax_fisher_trace(probs))) <= Z * float(se)
    assert abs(float(mean - 1.05 * softmax_fisher_trace(probs))) > Z * float(se)


def test_lemma1_policy_js_of_perturbed_logits() -> None:
    sigma, draws, v = 0.02, 20_000, 6
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0, 0.2], dtype=F64)
    probs = torch.softmax(logits, 0)
    gen = torch.Generator().manual_seed(0)
    for population in (2, 8):
        eps = torch.randn(draws, population, v, generator=gen, dtype=F64)
        js = policy_js_diversity(torch.softmax(logits + sigma * eps, -1))  # [draws]
        mean, se = _mean_se(js)
        predicted = float(expected_policy_js(softmax_fisher_trace(probs), sigma=sigma, population=population))
        slack = Z * float(se) + 0.01 * predicted  # MC error + the O(sigma^4) remainder
        assert abs(float(mean) - predicted) <= slack, (population, float(mean), predicted)
        for wrong in (1.05 * predicted, 0.95 * predicted):
            assert abs(float(mean) - wrong) > slack, (population, wrong)


def test_zero_bins_regressions_and_progressions_against_sampled_answers() -> None:
    gen = torch.Generator().manual_seed(0)
    prompts, n, reps = 40, 8, 20_000
    p_base, p = torch.rand(prompts, generator=gen, dtype=F64) * 0.6, torch.rand(prompts, generator=gen, dtype=F64)
    solved_base = (torch.rand(reps, prompts, n, generator=gen, dtype=F64) < p_base[:, None]).any(-1)
    solved = (torch.rand(reps, prompts, n, generator=gen, dtype=F64) < p[:, None]).any(-1)
    measured = {
        "zero bins": (~solved).to(F64).mean(-1),
        "regressions": (solved_base & ~solved).to(F64).sum(-1),
        "progressions": (~solved_base & solved).to(F64).sum(-1),
    }
    reg, prog, _ = regression_progression(p_base, p, n=n)
    exact = {"zero bins": float(zero_bin_fraction(p, n=n)), "regressions": float(reg), "progressions": float(prog)}
    for name, values in measured.items():
        mean, se = _mean_se(values)
        assert abs(float(mean) - exact[name]) <= Z * float(se), name
        assert abs(float(mean) - 1.05 * exact[name]) > Z * float(se), name


def test_interval_grounding_sampler_draws_the_exact_answer_distribution() -> None:
    task = IntervalTask.random(1, prompts=3, bins=6, dim=4)
    gen = torch.Generator().manual_seed(1)
    a = task.bins
    params = (
        torch.randn(1, 4, a, generator=gen, dtype=F64),
        torch.randn(1, 4, a, generator=gen, dtype=F64),
        torch.randn(1, a, a, generator=gen, dtype=F64),
    )
    n = 100_000
    start, end = sample_answers(task.features, params, n, SeedRNG.from_seeds([0]))  # [1, G, n]
    probs = answer_log_probs(task.features, params).exp()  # [1, G, A, A]
    counts = torch.zeros_like(probs).flatten(-2).scatter_add_(-1, start * a + end, torch.ones_like(start, dtype=F64))
    freq = counts.view_as(probs) / n
    se = (probs * (1 - probs) / n).sqrt()
    assert bool(((freq - probs).abs() <= Z * se + 1e-12).all())
    reward = tiou(start, end, task.gt_start[..., None], task.gt_end[..., None])  # [1, G, n]
    exact = (probs * task.reward_table()).sum((-1, -2))  # [1, G]
    mean, err = reward.mean(-1), reward.std(-1) / math.sqrt(n)
    assert bool(((mean - exact).abs() <= Z * err).all())
    assert bool(((mean - 1.05 * exact).abs() > Z * err).any())
