r"""Bias and variance of an estimator's gradient against the exact policy gradient, on two exact toys.

Toys (`default_toys`): a softmax bandit (3 prompts, 5 arms, one correct arm each) and a tabular
autoregressive policy (vocabulary 3 with EOS, horizon 3: 15 sequences per prompt, 2 prompts with 2
correct sequences each), both at fixed random parameters $\theta$. Their exact expected reward
$J(\theta)$ and KL are sums over every arm / sequence, so autograd gives the exact gradient.

One draw of the estimator samples $K$ responses per prompt and differentiates, per kind:

- advantage: $\hat g = \nabla_\theta \frac1K\sum_{k,t} A_{kt}\log\pi_\theta(y_{kt}\mid y_{k,<t})$
  (the policy-gradient form: token sum per sequence, mean over the group), target $\nabla J(\theta)$;
- loss: $\hat g = -\nabla_\theta \frac1K\sum_{k,t} L_{kt}$ with RLOO advantages (unbiased), both
  *on-policy* (``logp_old = logp``) and *off-policy*: responses drawn from $\theta_{old}$, the loss
  evaluated at $\theta = \theta_{old} + \Delta$ (a fixed perturbation, exact KL in the report),
  target $\nabla J(\theta)$ (an importance-weighted unclipped loss is unbiased there; a clip is not);
- kl: $\hat g = \nabla_\theta \frac1K \sum_{k,t} k(\log\pi_\theta, \log\pi_{ref})$ with $y \sim \pi_\theta$
  (the estimator used as a loss term), target $\nabla\,\mathrm{KL}(\pi_\theta\|\pi_{ref})$; and its value
  $\frac1K\sum_{k,t} k$ against the exact sequence KL.

Statistics over $N$ independent draws (`GradientStats`): the scale
$c = \langle \hat g, g\rangle / \|g\|^2$ (1 when unbiased along $g$; Dr.GRPO's is $(K-1)/K$) with its
Monte Carlo standard error; the relative bias $\|E\hat g - g\|/\|g\|$ with the noise floor
$\mathrm{tr}\,\Sigma / N$ subtracted from its square; the relative variance
$E\|\hat g - E\hat g\|^2/\|g\|^2$ with its standard error; and Hotelling's test of $E\hat g = g$
(pseudo-inverse of the sample covariance, F approximation; parameters with fewer than `MIN_NONZERO`
non-zero draws left out, their share of $\|g\|$ reported) together with a normal test of $c = 1$
(which alone catches an estimator with no variance), Bonferroni-combined. The estimator is flagged
*biased* when that gives $p <$ `BIAS_P` (six tests per estimator: 2 toys x 3 group sizes). The
calibration under unbiased estimators is measured in ``tests/arena/test_planted.py``.
Draws are vectorised; an estimator whose groups (rows, for losses) are not independent of each
other is called once per draw on its own batch, with fewer draws (`Budget`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy import stats as sps
from torch import Tensor

from posttrain.arena.kinds import Kind, Subject, advantage_tokens, kl_values, loss_values
from posttrain.estimators import rloo_advantages, zero_off_mask
from posttrain.simulators import SoftmaxBandit, TabularEnv, TabularSpec, TargetVerifier
from posttrain.simulators.bandits import bandit_kl, expected_reward

__all__ = ["BIAS_P", "Budget", "GradientStats", "Toy", "ValueStats", "default_toys", "gradient_stats"]

BIAS_P = 1e-4
"""Level of the bias flag per (toy, group size): six tests per estimator, family-wise below 1e-3."""
MIN_NONZERO = 50
"""Non-zero draws a parameter needs to enter the Hotelling test."""


@dataclass(frozen=True)
class Budget:
    """Monte Carlo draws per (toy, group size): vectorised, and when called once per draw."""

    draws: int = 20_000
    looped_draws: int = 2_000
    group_sizes: tuple[int, ...] = (2, 4, 8)
    seed: int = 0


@dataclass(frozen=True, eq=False)
class Toy:
    """An exact toy at fixed parameters ``theta [G, ...]``; ``other`` is the behaviour policy of the
    off-policy probe (losses) or the reference policy (KL)."""

    name: str
    env: Any
    theta: Tensor
    other: Tensor

    def reward(self, params: Tensor) -> Tensor:
        if isinstance(self.env, SoftmaxBandit):
            return expected_reward(params, self.env.rewards)
        return self.env.expected_reward(params)  # type: ignore[no-any-return]

    def kl(self, params: Tensor, ref: Tensor) -> Tensor:
        if isinstance(self.env, SoftmaxBandit):
            return bandit_kl(params, ref)
        return self.env.kl(params, ref)  # type: ignore[no-any-return]

    def off_policy_kl(self) -> float:
        """Exact mean KL(pi_theta || pi_other) over prompts."""
        return float(self.kl(self.theta, self.other).mean())


def default_toys(seed: int = 0) -> tuple[Toy, Toy]:
    """The bandit and the tabular toy of the module docstring (fixed seeds)."""
    g = torch.Generator().manual_seed(seed)
    bandit = SoftmaxBandit.with_correct_arms(num_prompts=3, num_arms=5, num_correct=1, generator=g)
    logits = bandit.prior_logits(scale=1.0, generator=g)
    spec = TabularSpec(vocab=3, horizon=3, eos=2)
    tab = TabularEnv(spec, TargetVerifier.random(spec, num_prompts=2, num_correct=2, generator=g))
    table = 0.7 * torch.randn(2, spec.num_nodes, 3, generator=g, dtype=torch.float64)
    shift = 0.3  # the scale of the off-policy / reference perturbation
    return (
        Toy("bandit", bandit, logits, logits + shift * torch.randn(logits.shape, generator=g, dtype=torch.float64)),
        Toy("tabular", tab, table, table + shift * torch.randn(table.shape, generator=g, dtype=torch.float64)),
    )


@dataclass(frozen=True)
class GradientStats:
    """Monte Carlo statistics of one estimator's gradient at one (toy, group size) (module docstring).

    ``unvisited``: the share of the exact gradient's norm on parameters with fewer than `MIN_NONZERO`
    non-zero draws (contexts that sampled responses rarely reached, or reached only in groups whose
    advantages were all 0); they are left out of the Hotelling test (a mean of a few rare values is
    far from normal), and this share bounds what that leaves untested.
    """

    toy: str
    k: int
    draws: int
    scale: float
    scale_se: float
    bias: float
    variance: float
    variance_se: float
    cosine: float
    p_value: float
    unvisited: float = 0.0

    @property
    def biased(self) -> bool:
        return self.p_value < BIAS_P


@dataclass(frozen=True)
class ValueStats:
    """A KL estimator's value: mean over draws against the exact sequence KL, and its variance."""

    toy: str
    k: int
    draws: int
    mean: float
    mean_se: float
    exact: float
    variance: float


def _hotelling(y: np.ndarray) -> float:
    """p-value of ``E y = 0`` for draws ``y [N, D]`` (Hotelling's T^2 on the range of the sample
    covariance, F approximation; 1 when there is nothing to test)."""
    n = y.shape[0]
    if y.shape[1] == 0:
        return 1.0
    mean = y.mean(0)
    w, v = np.linalg.eigh(np.cov(y, rowvar=False).reshape(y.shape[1], y.shape[1]))
    keep = w > 1e-12 * max(float(np.max(w)), 1e-300)
    r = int(keep.sum())
    if r == 0 or n <= r:
        return 1.0
    proj = v[:, keep].T @ mean
    t2 = n * float(proj @ (proj / w[keep]))
    return float(sps.f.sf((n - r) / (r * (n - 1)) * t2, r, n - r))


def _scale_p(scale: np.ndarray) -> float:
    """Two-sided normal p-value of ``E scale = 1`` (0 for a constant scale other than 1)."""
    se = float(scale.std(ddof=1)) / math.sqrt(scale.size)
    gap = abs(float(scale.mean()) - 1.0)
    if se == 0.0:
        return 1.0 if gap < 1e-12 else 0.0
    return float(2.0 * sps.norm.sf(gap / se))


def _summarise(toy: str, k: int, draws: Tensor, target: Tensor) -> GradientStats:
    y, g = draws.double().numpy(), target.double().numpy().reshape(-1)
    n, g2 = y.shape[0], float(g @ g)
    observed = (y != 0).sum(0) >= MIN_NONZERO
    scale = y @ g / g2
    mean = y.mean(0)
    dev = ((y - mean) ** 2).sum(1) / g2
    noise = float(dev.mean()) / n
    bias2 = float(((mean - g) ** 2).sum()) / g2 - noise
    cosine = float(mean @ g / (np.linalg.norm(mean) * math.sqrt(g2) + 1e-300))
    p_value = min(1.0, 2.0 * min(_hotelling(y[:, observed] - g[observed]), _scale_p(scale)))
    return GradientStats(
        toy, k, n, float(scale.mean()), float(scale.std(ddof=1) / math.sqrt(n)), math.sqrt(max(bias2, 0.0)),
        float(dev.mean()), float(dev.std(ddof=1) / math.sqrt(n)), cosine, p_value,
        float(np.linalg.norm(g[~observed]) / math.sqrt(g2)),
    )  # fmt: skip


def _expand(x: Tensor, n: int) -> Tensor:
    return x.unsqueeze(0).expand(n, *x.shape).clone()


def _exact_grad(f: Callable[[Tensor], Tensor], theta: Tensor) -> Tensor:
    leaf = theta.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(f(leaf).sum(), leaf)
    return grad


def _per_draw(fn: Callable[..., Tensor], independent: bool, *tensors: Tensor) -> Tensor:
    """``fn`` on the whole ``[N * ...]`` batch, or draw by draw (each ``[N, ...]`` split on its first axis)."""
    if independent:
        return fn(*(t.reshape(-1, *t.shape[2:]) for t in tensors))
    return torch.cat([fn(*parts) for parts in zip(*tensors, strict=True)])


def _draws(
    s: Subject, toy: Toy, k: int, n: int, independent: bool, gen: torch.Generator, off_policy: bool
) -> tuple[Tensor, Tensor | None]:
    """``[N, D]`` gradient draws (and ``[N]`` value draws for KL estimators)."""
    sample_from = toy.other if off_policy else toy.theta
    with torch.no_grad():
        roll = toy.env.sample(_expand(sample_from, n), k, gen)
    tokens, mask = roll.tokens, roll.mask  # [N, G, K, T]
    t = tokens.shape[-1]
    leaf = _expand(toy.theta, n).requires_grad_(True)
    logp = toy.env.token_logp(leaf, tokens)
    flat_mask = mask.reshape(n, -1, t)
    values: Tensor | None = None
    if s.kind is Kind.ADVANTAGE:
        with torch.no_grad():
            adv = _per_draw(lambda r, m: advantage_tokens(s, r, m), independent, roll.rewards, flat_mask)
        surrogate = (zero_off_mask(adv.reshape(logp.shape), mask) * logp).sum() / k
    elif s.kind is Kind.LOSS:
        adv = rloo_advantages(roll.rewards.reshape(-1, k)).reshape(n, -1)
        old = roll.logp.reshape(n, -1, t) if off_policy else logp.detach().reshape(n, -1, t)

        def loss(lp: Tensor, lo: Tensor, a: Tensor, m: Tensor) -> Tensor:
            return zero_off_mask(loss_values(s, lp, lo, a, m), m)

        surrogate = -_per_draw(loss, independent, logp.reshape(n, -1, t), old, adv, flat_mask).sum() / k
    else:
        ref = toy.env.token_logp(_expand(toy.other, n), tokens)
        kl = zero_off_mask(kl_values(s, logp.reshape(-1, t), ref.reshape(-1, t)), mask.reshape(-1, t))
        values = kl.reshape(n, -1).sum(-1).detach() / k
        surrogate = kl.sum() / k
    (grad,) = torch.autograd.grad(surrogate, leaf, allow_unused=True)
    grad = torch.zeros_like(leaf) if grad is None else grad
    return grad.reshape(n, -1), values


def gradient_stats(
    s: Subject, toys: tuple[Toy, ...], *, independent: bool, budget: Budget = Budget(), off_policy: bool = False
) -> tuple[list[GradientStats], list[ValueStats]]:
    """`GradientStats` per (toy, group size) for ``s`` (and `ValueStats` for a KL estimator).

    ``independent``: the estimator may be called on many draws' groups at once (its groups, or rows,
    do not interact); otherwise it is called per draw with ``budget.looped_draws`` draws.
    """
    n = budget.draws if independent else budget.looped_draws
    grads, values = [], []
    for i, toy in enumerate(toys):
        if s.kind is Kind.KL:
            target = _exact_grad(lambda th, toy=toy: toy.kl(th, toy.other), toy.theta)  # type: ignore[misc]
            exact_kl = float(toy.kl(toy.theta, toy.other).sum())
        else:
            target = _exact_grad(toy.reward, toy.theta)
        for k in budget.group_sizes:
            gen = torch.Generator().manual_seed(budget.seed * 1_000_003 + 101 * i + k)
            draws, vals = _draws(s, toy, k, n, independent, gen, off_policy)
            grads.append(_summarise(toy.name, k, draws, target))
            if vals is not None:
                v = vals.double()
                se = float(v.std() / math.sqrt(n))
                values.append(ValueStats(toy.name, k, n, float(v.mean()), se, exact_kl, float(v.var())))
    return grads, values
