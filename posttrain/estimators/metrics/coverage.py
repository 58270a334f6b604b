r"""Sample-based coverage metrics of Hayes et al. 2026 (arXiv:2608.12679, §3.1, §5) and Ba et al. 2026 (§3.6).

Answers are integer ids ``[X, n]`` (``X`` prompts, ``n`` samples each) with ``-1`` for a failed
extraction; correctness is a boolean ``[X, n]``. Conventions: a failed extraction counts as
incorrect for bins, is excluded from answer entropy, and abstains in majority votes (docs: methods/es_solution_coverage.md).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators._numerics import zero_off_mask
from posttrain.shapes import Bool, Int
from posttrain.validate import check_tensor

__all__ = ["accuracy_bins", "answer_entropy", "majority_vote_correct"]


def _check_answers(answers: Tensor) -> Tensor:
    check_tensor("answers", answers, ndim=2)
    if answers.is_floating_point() or answers.dtype == torch.bool or answers.shape[1] == 0:
        raise ShapeError(
            f"answers: expected a non-empty integer tensor [X, n], got {answers.dtype} {list(answers.shape)}"
        )
    return answers


def accuracy_bins(correct: Bool[Tensor, "X n"], *, width: float = 0.1) -> Int[Tensor, " bins"]:
    r"""Histogram of per-prompt accuracy: bin 0 = no correct sample, last bin = all correct, between them
    $(w(i-1), wi]$ for $i = 1..\lceil 1/w\rceil$ (fractions strictly between 0 and 1).

    Examples:
        >>> accuracy_bins(torch.tensor([[0, 0], [1, 0], [1, 1]]).bool(), width=0.5).tolist()
        [1, 1, 0, 1]
    """
    check_tensor("correct", correct, ndim=2)
    if correct.dtype != torch.bool or correct.shape[1] == 0:
        raise ShapeError(f"correct: expected a non-empty bool tensor [X, n], got {correct.dtype} {list(correct.shape)}")
    if not 0.0 < width <= 1.0:
        raise DomainError(f"width: expected a value in (0, 1], got {width}")
    inner = math.ceil(1.0 / width - 1e-9)
    frac = correct.double().mean(-1)
    idx = torch.ceil(frac / width - 1e-9).long().clamp(1, inner)
    idx = torch.where(frac == 0, 0, torch.where(frac == 1, inner + 1, idx))
    return torch.bincount(idx, minlength=inner + 2)


def answer_entropy(answers: Int[Tensor, "X n"]) -> Tensor:
    r"""Per-prompt entropy (nats) of the empirical distribution of extracted answers, failures excluded.

    $H = -\sum_u f_u\log f_u = -\frac1{n_v}\sum_{i\,\text{valid}}\log f_{a_i}$ with $n_v$ the
    number of valid answers; 0 for a prompt without any. Returns ``[X]`` float64.

    Examples:
        >>> [round(h, 4) for h in answer_entropy(torch.tensor([[1, 1, 2, 2], [5, 5, 5, -1]])).tolist()]
        [0.6931, 0.0]
    """
    _check_answers(answers)
    valid = answers >= 0
    same = (answers[:, :, None] == answers[:, None, :]) & valid[:, None, :]  # [X, n, n]
    n_valid = valid.sum(-1, keepdim=True).double()
    count = same.sum(-1).double()  # multiplicity of each sample's answer
    terms = zero_off_mask(torch.log(n_valid / count.clamp_min(1.0)), valid)  # -log f >= 0
    return terms.sum(-1) / n_valid.squeeze(-1).clamp_min(1.0)


def majority_vote_correct(answers: Int[Tensor, "X n"], gold: Int[Tensor, " X"], *, k: int) -> Bool[Tensor, " X"]:
    """Whether the plurality answer among the first ``k`` samples equals ``gold`` (maj@k, per prompt).

    Failed extractions abstain; a prompt with no valid answer is incorrect. Ties go to the answer
    that appears first, a rule that does not look at answer labels, so relabelling answers
    (e.g. wrong ones) never changes the outcome.

    Examples:
        >>> majority_vote_correct(torch.tensor([[3, 4, 4, 3], [-1, -1, 7, 2]]), torch.tensor([3, 7]), k=4).tolist()
        [True, True]
    """
    _check_answers(answers)
    check_tensor("gold", gold, ndim=1)
    if gold.shape[0] != answers.shape[0]:
        raise ShapeError(f"gold: expected {answers.shape[0]} entries (one per prompt), got {list(gold.shape)}")
    if not 1 <= k <= answers.shape[1]:
        raise DomainError(f"k: expected 1 <= k <= n = {answers.shape[1]}, got {k}")
    first = answers[:, :k]
    valid = first >= 0
    counts = ((first[:, :, None] == first[:, None, :]) & valid[:, None, :]).sum(-1)  # [X, k]
    counts = torch.where(valid, counts, -1)
    winner = counts.argmax(-1)  # first index with the highest count
    picked = first.gather(-1, winner[:, None]).squeeze(-1)
    return valid.any(-1) & (picked == gold)
