r"""Controlled RLVR settings of paper 06 (Clay et al. 2026, arXiv:2608.24949): rewards, prior mass, envs.

- Rewards (Appendix C, D of the paper): the sparse target reward with an anti-rambling penalty, the
  dense edit-distance (Levenshtein) reward and the exponential process reward of the AIME problem
  (the check draws its spurious ``U[0, 1]`` rewards from its own per-seed streams). All batched over
  leading dimensions; the edit distance is a DP over one string's positions with each row solved in
  closed form by a cumulative minimum.
- `prior_mass`: the sampled estimate of $m(\pi) = P(\tau \in y)$ with its binomial SE.
- `TargetTask`: a Markov tabular policy (position and previous token) and one target
  sequence, with the exact target probability and the SFT+/SFT- edits (gradient steps on
  $\log\pi(\tau)$).
- `DomainTask`: a linear softmax over ``M`` answers with features in per-domain blocks plus
  shared dimensions; exact per-prompt accuracy and entropy (for the prompt-breadth experiment).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.simulators.tabular import TabularSpec, token_logp
from posttrain.validate import check_positive, check_tensor

__all__ = [
    "PRM_WEIGHTS",
    "DomainTask",
    "TargetTask",
    "dense_edit_reward",
    "edit_distance",
    "prior_mass",
    "process_reward",
    "sparse_target_reward",
]

PRM_WEIGHTS: tuple[float, ...] = (0.05, 0.05, 0.10, 0.15, 0.25)


def _check_tokens(name: str, x: object) -> Tensor:
    t = check_tensor(name, x)
    if t.is_floating_point() or t.dtype == torch.bool or t.ndim < 1:
        raise ShapeError(f"{name}: expected an integer tensor [..., L], got {t.dtype} of shape {list(t.shape)}")
    return t


def _check_lengths(name: str, lengths: Tensor, tokens: Tensor) -> Tensor:
    _check_tokens(name, lengths.unsqueeze(-1))
    if bool((lengths < 0).any()) or bool((lengths > tokens.shape[-1]).any()):
        raise DomainError(f"{name}: expected lengths in [0, {tokens.shape[-1]}]")
    return lengths


def edit_distance(
    a: Int[Tensor, "... La"], a_len: Int[Tensor, ...], b: Int[Tensor, "... Lb"], b_len: Int[Tensor, ...]
) -> Int[Tensor, ...]:
    r"""Levenshtein distance between the prefixes ``a[..., :a_len]`` and ``b[..., :b_len]`` (batched).

    $$
    D(i,0)=i,\ D(0,j)=j,\ D(i,j)=\min\big(D(i-1,j)+1,\ D(i,j-1)+1,\ D(i-1,j-1)+1[a_i\ne b_j]\big).
    $$

    Row ``i`` is computed at once: with $c_j = \min(D(i-1,j)+1, D(i-1,j-1)+1[a_i\ne b_j])$,
    $D(i,j) = \min_{k\le j}(c_k + j - k) = j + \mathrm{cummin}_k(c_k - k)$. Leading dimensions
    broadcast; padding after the lengths is ignored.

    Examples:
        >>> edit_distance(torch.tensor([1, 2, 3]), torch.tensor(3), torch.tensor([2, 3, 4, 5]), torch.tensor(4)).item()
        3
    """
    for name, x in (("a", a), ("b", b)):
        _check_tokens(name, x)
    _check_lengths("a_len", a_len, a)
    _check_lengths("b_len", b_len, b)
    la, lb = a.shape[-1], b.shape[-1]
    lead = torch.broadcast_shapes(a.shape[:-1], b.shape[:-1], a_len.shape, b_len.shape)
    a, b = a.expand(*lead, la), b.expand(*lead, lb)
    j = torch.arange(lb + 1, device=a.device)
    row = j.expand(*lead, lb + 1)
    rows = [row]
    for i in range(1, la + 1):
        cost = (a[..., i - 1, None] != b).to(row.dtype)  # [..., Lb]
        c = torch.minimum(row[..., 1:] + 1, row[..., :-1] + cost)
        c = torch.cat([torch.full((*lead, 1), i, dtype=row.dtype, device=a.device), c], -1)
        row = j + torch.cummin(c - j, dim=-1).values
        rows.append(row)
    table = torch.stack(rows, -2)  # [..., La+1, Lb+1]
    a_idx = a_len.expand(lead)[..., None, None].expand(*lead, 1, lb + 1)
    return table.gather(-2, a_idx)[..., 0, :].gather(-1, b_len.expand(lead)[..., None])[..., 0]


def dense_edit_reward(
    y: Int[Tensor, "... L"], y_len: Int[Tensor, ...], target: Int[Tensor, " Lt"]
) -> Float[Tensor, ...]:
    r"""Dense reward $\max(0, 1 - D(y, \tau)/\max(|y|, |\tau|))$ (paper 06, Appendix C).

    Examples:
        >>> dense_edit_reward(torch.tensor([3, 1, 4, 0]), torch.tensor(3), torch.tensor([3, 1, 5])).item()
        0.6666666666666667
    """
    _check_tokens("target", target)
    d = edit_distance(y, y_len, target, torch.tensor(target.shape[-1], device=target.device))
    n = torch.clamp(torch.maximum(y_len, torch.tensor(target.shape[-1])), min=1)
    return (1.0 - d.to(torch.float64) / n).clamp_min(0.0)


def sparse_target_reward(
    y: Int[Tensor, "... L"], y_len: Int[Tensor, ...], target: Int[Tensor, " Lt"], *, max_len: int
) -> Float[Tensor, ...]:
    r"""Sparse reward with the anti-rambling penalty (paper 06, Appendix C).

    $$
    r = \max(0.5,\ 1 - s/n)\ \text{if}\ \tau \subseteq y\ \text{else}\ 0,
    $$

    ``s`` the tokens of ``y`` beyond the target's (``|y| - |tau|``), ``n = max_len``.

    Examples:
        >>> y = torch.tensor([[9, 3, 1, 4, 0], [3, 1, 4, 0, 0], [3, 1, 0, 0, 0]])
        >>> sparse_target_reward(y, torch.tensor([4, 3, 3]), torch.tensor([3, 1, 4]), max_len=5).tolist()
        [0.8, 1.0, 0.0]
    """
    _check_tokens("y", y)
    _check_tokens("target", target)
    _check_lengths("y_len", y_len, y)
    n = check_positive("max_len", max_len)
    lt = target.shape[-1]
    if lt > y.shape[-1]:
        return torch.zeros(torch.broadcast_shapes(y.shape[:-1], y_len.shape), dtype=torch.float64)
    windows = y.unfold(-1, lt, 1)  # [..., L - Lt + 1, Lt]
    starts = torch.arange(windows.shape[-2], device=y.device)
    hit = ((windows == target).all(-1) & (starts + lt <= y_len[..., None])).any(-1)
    extra = (y_len - lt).clamp_min(0).to(torch.float64)
    return torch.where(hit, torch.clamp(1.0 - extra / n, min=0.5), torch.zeros((), dtype=torch.float64))


def process_reward(
    milestones: Bool[Tensor, "... 5"],
    answer: Int[Tensor, ...],
    *,
    looped: Bool[Tensor, ...],
    boxed: Bool[Tensor, ...],
    correct: int = 117,
    near_miss: int = 118,
) -> Float[Tensor, ...]:
    r"""Exponential process reward of the AIME problem (paper 06, Appendix D).

    $$
    r_{base} = 1\ (\text{answer} = 117),\ 0.6\ (118),\ \textstyle\sum_i w_im_i\ \text{otherwise};\quad
                  r = \max(0, r_{base} - 0.3\cdot1[\text{looped} \wedge \text{answer}\ne117] - 0.5\cdot1[\neg\text{boxed}]),
    $$

    ``w = (0.05, 0.05, 0.10, 0.15, 0.25)`` (`PRM_WEIGHTS`) over the judge's five milestones.

    Examples:
        >>> m = torch.tensor([[True, True, True, False, False], [True] * 5])
        >>> process_reward(m, torch.tensor([5, 117]), looped=torch.tensor([False, True]),
        ...                boxed=torch.tensor([True, True])).tolist()
        [0.2, 1.0]
    """
    check_tensor("milestones", milestones)
    if milestones.dtype != torch.bool or milestones.ndim < 1 or milestones.shape[-1] != len(PRM_WEIGHTS):
        raise ShapeError(
            f"milestones: expected a bool tensor [..., 5], got {milestones.dtype} {list(milestones.shape)}"
        )
    w = torch.tensor(PRM_WEIGHTS, dtype=torch.float64, device=milestones.device)
    base = (milestones.to(torch.float64) * w).sum(-1)
    base = torch.where(answer == near_miss, 0.6, base)
    base = torch.where(answer == correct, 1.0, base)
    penalty = 0.3 * (looped & (answer != correct)).to(torch.float64) + 0.5 * (~boxed).to(torch.float64)
    return (base - penalty).clamp_min(0.0)


def prior_mass(hits: Bool[Tensor, "... N"]) -> tuple[Tensor, Tensor]:
    r"""Sampled prior mass $\hat m = \frac1N\sum_n 1[\tau \in y_n]$ and its binomial standard error.

    The SE is $\sqrt{\hat m(1-\hat m)/N}$.

    Examples:
        >>> [round(float(x), 4) for x in prior_mass(torch.tensor([True, False, False, False]))]
        [0.25, 0.2165]
    """
    check_tensor("hits", hits)
    if hits.dtype != torch.bool or hits.ndim < 1 or hits.shape[-1] == 0:
        raise ShapeError(f"hits: expected a non-empty bool tensor [..., N], got {hits.dtype} {list(hits.shape)}")
    m = hits.to(torch.float64).mean(-1)
    return m, (m * (1 - m) / hits.shape[-1]).sqrt()


@dataclass(frozen=True)
class TargetTask:
    """One prompt, a Markov tabular policy ``z [*R, 1, 1 + (L-1)V, V]`` and a target ``tau [L]`` (docs: methods/demystifying.md, 7A)."""

    spec: TabularSpec
    target: Tensor

    @classmethod
    def make(cls, vocab: int, target: tuple[int, ...]) -> TargetTask:
        spec = TabularSpec(vocab=vocab, horizon=len(target), context="markov")
        return cls(spec, torch.tensor(target, dtype=torch.long))

    def target_logp(self, table: Float[Tensor, "*R 1 N V"]) -> Float[Tensor, "*R"]:
        r"""Exact $\log\pi(\tau)$ per run (differentiable)."""
        lead = table.shape[:-3]
        tokens = self.target.expand(*lead, 1, 1, self.spec.horizon)
        return token_logp(self.spec, table, tokens).sum(-1)[..., 0, 0]

    def edit(self, table: Tensor, *, lr: Tensor | float, steps: int) -> Tensor:
        r"""SFT+ (``lr > 0``, ascent on $\log\pi(\tau)$) or SFT- (``lr < 0``): ``steps`` full gradient steps.

        ``lr`` may be a tensor ``[*R]`` (one rate per run).
        """
        rate = torch.as_tensor(lr, dtype=table.dtype)
        rate = rate.reshape(*rate.shape, *([1] * 3)) if rate.ndim else rate
        for _ in range(int(steps)):
            z = table.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(self.target_logp(z).sum(), z)
            table = table.detach() + rate * grad
        return table.detach()


@dataclass(frozen=True)
class DomainTask:
    r"""Linear softmax $\pi(a\mid x) = \mathrm{softmax}(W\phi(x))_a$ over ``M`` answers, prompts in domains.

    ``features [P, F]`` (``F = domains * block + shared``), ``domain [P]``, ``correct [P]`` (the argmax of
    the true weights), ``w_star [M, F]``. Built by `make` as in the paper (docs: methods/demystifying.md), 7B.
    """

    features: Tensor
    domain: Tensor
    correct: Tensor
    w_star: Tensor

    @classmethod
    def make(
        cls,
        *,
        domains: int = 3,
        per_domain: int = 200,
        block: int = 12,
        shared: int = 4,
        answers: int = 8,
        shared_scale: float = 0.3,
        generator: torch.Generator,
    ) -> DomainTask:
        p = domains * per_domain
        dom = torch.arange(domains).repeat_interleave(per_domain)
        feats = torch.zeros(p, domains * block + shared, dtype=torch.float64)
        own = torch.randn(p, block, generator=generator, dtype=torch.float64) / math.sqrt(block)
        cols = dom[:, None] * block + torch.arange(block)
        feats.scatter_(1, cols, own)
        feats[:, domains * block :] = shared_scale * torch.randn(p, shared, generator=generator, dtype=torch.float64)
        feats[:, domains * block :] /= math.sqrt(shared)
        w_star = torch.randn(answers, feats.shape[1], generator=generator, dtype=torch.float64)
        return cls(feats, dom, (feats @ w_star.T).argmax(-1), w_star)

    def logits(self, weights: Float[Tensor, "*R M F"], prompts: Int[Tensor, "*R Q"]) -> Float[Tensor, "*R Q M"]:
        if weights.ndim < 2 or weights.shape[-1] != self.features.shape[1]:
            raise ShapeError(f"weights: expected [*R, M, {self.features.shape[1]}], got {list(weights.shape)}")
        return self.features[prompts] @ weights.transpose(-1, -2)

    def accuracy(self, weights: Tensor, prompts: Tensor) -> Tensor:
        r"""Mean exact accuracy $E_x\pi(a^*\mid x)$ over ``prompts`` ``[*R, Q]`` → ``[*R]``."""
        p = torch.softmax(self.logits(weights, prompts), -1)
        return p.gather(-1, self.correct[prompts][..., None])[..., 0].mean(-1)

    def entropy(self, weights: Tensor, prompts: Tensor) -> Tensor:
        """Mean answer entropy (nats) over ``prompts`` → ``[*R]``."""
        logp = torch.log_softmax(self.logits(weights, prompts), -1)
        return -(logp.exp() * logp).sum(-1).mean(-1)
