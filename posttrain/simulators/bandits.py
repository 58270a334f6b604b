r"""Softmax bandits: G prompts, A arms, a reward per arm, and the exact answers next to the sampler.

The policy is a logits tensor ``[*seeds, G, A]`` with $\pi_g = \mathrm{softmax}(\theta_g)$;
the environment (`SoftmaxBandit`) holds the per-arm rewards ``[G, A]``. An arm is
*correct* when its reward is 1 (a binary verifier; several correct arms per prompt are allowed;
dense rewards in ``[0, 1]`` work everywhere except that only reward-1 arms count as successes).
A bandit is a horizon-1 environment for `posttrain.simulators.loop`: its responses are
``[*seeds, G, K, 1]`` token tensors with an all-True mask, so the same estimator functions as the
LLM trainer apply.

Exact quantities (all differentiable where that makes sense, all batched over ``*seeds`` and G):
success probability $p_g=\sum_{a\in C_g}\pi_{ga}$, expected reward
$\sum_a \pi_{ga} r_{ga}$, its gradient $\pi_g\odot(r_g-\bar r_g)$, entropy, pass@k
$1-(1-p_g)^k$, and $\mathrm{KL}(\pi\|\pi_{ref})$.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.simulators._base import Generatorish, Rollout, sample_categorical, uniform
from posttrain.theory.es_coverage import exact_pass_at_k
from posttrain.validate import check_finite, check_float, check_tensor

__all__ = [
    "SoftmaxBandit",
    "bandit_entropy",
    "bandit_kl",
    "expected_reward",
    "reward_gradient",
    "sample_arms",
    "success_prob",
]


def _check_logits(logits: Tensor, num_arms: int | None = None) -> Tensor:
    check_float("logits", logits)
    if logits.ndim < 2:
        raise ShapeError(f"logits: expected shape [*seeds, G, A], got {list(logits.shape)}")
    if num_arms is not None and logits.shape[-1] != num_arms:
        raise ShapeError(f"logits: expected A = {num_arms} arms in the last axis, got shape {list(logits.shape)}")
    return logits


def sample_arms(logits: Float[Tensor, "*seeds G A"], k: int, generator: Generatorish) -> Int[Tensor, "*seeds G K"]:
    """Draw ``k`` arms per prompt from $\\mathrm{softmax}(\\theta)$, one uniform per draw.

    Examples:
        >>> g = torch.Generator().manual_seed(0)
        >>> sample_arms(torch.tensor([[0.0, -1e9]]), 4, g).tolist()
        [[0, 0, 0, 0]]
    """
    _check_logits(logits)
    if int(k) < 1:
        raise DomainError(f"k: expected at least 1 sample per prompt, got {k!r}")
    u = uniform(generator, (*logits.shape[:-1], int(k)))
    return sample_categorical(logits, u)


def success_prob(logits: Float[Tensor, "*seeds G A"], correct: Bool[Tensor, "G A"]) -> Float[Tensor, "*seeds G"]:
    r"""Exact success probability $p_g = \sum_{a \in C_g} \pi_{ga}$ (differentiable).

    Examples:
        >>> success_prob(torch.zeros(1, 4), torch.tensor([[True, True, False, False]])).tolist()
        [0.5]
    """
    _check_logits(logits, correct.shape[-1])
    probs = torch.softmax(logits, dim=-1)
    return torch.where(correct, probs, torch.zeros((), dtype=probs.dtype)).sum(-1)


def expected_reward(logits: Float[Tensor, "*seeds G A"], rewards: Float[Tensor, "G A"]) -> Float[Tensor, "*seeds G"]:
    r"""Exact expected reward $J_g = \sum_a \pi_{ga} r_{ga}$ (differentiable)."""
    _check_logits(logits, rewards.shape[-1])
    return (torch.softmax(logits, dim=-1) * rewards.to(logits.dtype)).sum(-1)


def reward_gradient(logits: Float[Tensor, "*seeds G A"], rewards: Float[Tensor, "G A"]) -> Float[Tensor, "*seeds G A"]:
    r"""Exact policy gradient $\nabla_{\theta_g} J_g = \pi_g \odot (r_g - J_g)$ of the expected reward.

    Examples:
        >>> reward_gradient(torch.zeros(1, 2), torch.tensor([[1.0, 0.0]])).tolist()
        [[0.25, -0.25]]
    """
    _check_logits(logits, rewards.shape[-1])
    probs = torch.softmax(logits, dim=-1)
    r = rewards.to(logits.dtype)
    return probs * (r - (probs * r).sum(-1, keepdim=True))


def bandit_entropy(logits: Float[Tensor, "*seeds G A"]) -> Float[Tensor, "*seeds G"]:
    r"""Entropy $-\sum_a \pi_a \log \pi_a$ in nats (0-probability arms contribute 0)."""
    _check_logits(logits)
    logp = torch.log_softmax(logits, dim=-1)
    return -torch.special.xlogy(logp.exp(), logp.exp()).sum(-1)


def bandit_kl(
    logits: Float[Tensor, "*seeds G A"], ref_logits: Float[Tensor, "*seeds G A"]
) -> Float[Tensor, "*seeds G"]:
    r"""Exact $\mathrm{KL}(\pi\|\pi_{ref}) = \sum_a \pi_a(\log\pi_a - \log\pi^{ref}_a)$ per prompt.

    Reverse KL; swap the arguments for the forward one.
    """
    _check_logits(logits)
    logp = torch.log_softmax(logits, dim=-1)
    logq = torch.log_softmax(ref_logits.to(logits.dtype), dim=-1)
    p = logp.exp()
    return torch.where(p > 0, p * (logp - logq), torch.zeros((), dtype=p.dtype)).sum(-1)


@dataclass(frozen=True, eq=False)
class SoftmaxBandit:
    """G prompts with A arms each and a reward per (prompt, arm); the policy is a logits tensor.

    Attributes:
        rewards: ``[G, A]`` rewards in ``[0, 1]``; arms with reward 1 are the correct ones.

    Examples:
        >>> g = torch.Generator().manual_seed(0)
        >>> env = SoftmaxBandit.with_correct_arms(num_prompts=2, num_arms=4, num_correct=1, generator=g)
        >>> logits = torch.zeros(2, 4, dtype=torch.float64)
        >>> env.exact_metrics(logits)["success"].item()
        0.25
        >>> r = env.sample(logits, 3, torch.Generator().manual_seed(1))
        >>> r.tokens.shape, r.rewards.shape
        (torch.Size([2, 3, 1]), torch.Size([2, 3]))
    """

    rewards: Float[Tensor, "G A"]
    pass_ks: tuple[int, ...] = field(default=(1, 8))

    def __post_init__(self) -> None:
        check_float("rewards", self.rewards, ndim=2)
        check_finite("rewards", self.rewards)
        if bool(((self.rewards < 0) | (self.rewards > 1)).any()):
            raise DomainError("rewards: expected values in [0, 1]")

    @classmethod
    def with_correct_arms(
        cls, *, num_prompts: int, num_arms: int, num_correct: int, generator: torch.Generator
    ) -> SoftmaxBandit:
        """Binary bandit with ``num_correct`` correct arms per prompt drawn uniformly without replacement."""
        if not 1 <= num_correct <= num_arms:
            raise DomainError(f"num_correct: expected 1 <= num_correct <= num_arms={num_arms}, got {num_correct}")
        keys = torch.rand(num_prompts, num_arms, generator=generator, dtype=torch.float64)
        ranks = keys.argsort(dim=-1).argsort(dim=-1)
        return cls((ranks < num_correct).to(torch.float64))

    def prior_logits(
        self, *, scale: float, generator: torch.Generator, boost: float = 0.0, seeds: int | None = None
    ) -> Float[Tensor, "*seeds G A"]:
        """Initial logits $\\mathcal N(0, \\text{scale}^2)$ plus ``boost`` on the correct arms (a prior of chosen quality).

        ``seeds`` adds a leading seed axis (drawn from the one generator, seed after seed).
        """
        lead = () if seeds is None else (int(seeds),)
        noise = scale * torch.randn(*lead, *self.rewards.shape, generator=generator, dtype=torch.float64)
        return noise + boost * self.correct.to(torch.float64)

    @property
    def correct(self) -> Bool[Tensor, "G A"]:
        return self.rewards >= 1.0

    @property
    def horizon(self) -> int:
        return 1

    def sample(self, params: Float[Tensor, "*seeds G A"], k: int, generator: Generatorish) -> Rollout:
        """``k`` arms per prompt as one-token responses ``[*seeds, G, K, 1]`` with their rewards."""
        _check_logits(params, self.rewards.shape[-1])
        arms = sample_arms(params, k, generator)
        logp = torch.log_softmax(params.detach(), dim=-1).gather(-1, arms)
        rewards = self.rewards.expand(*params.shape[:-2], *self.rewards.shape).to(params.dtype).gather(-1, arms)
        tokens = arms.unsqueeze(-1)
        return Rollout(tokens, torch.ones_like(tokens, dtype=torch.bool), logp.unsqueeze(-1), rewards)

    def token_logp(self, params: Float[Tensor, "*seeds G A"], tokens: Int[Tensor, "*seeds G K 1"]) -> Tensor:
        """``[*seeds, G, K, 1]`` log-probs of the sampled arms (differentiable in ``params``)."""
        _check_logits(params, self.rewards.shape[-1])
        check_tensor("tokens", tokens, ndim=params.ndim + 1)
        return torch.log_softmax(params, dim=-1).gather(-1, tokens.squeeze(-1)).unsqueeze(-1)

    def exact_metrics(self, params: Float[Tensor, "*seeds G A"]) -> dict[str, Tensor]:
        """Means over prompts: ``success``, ``reward``, ``entropy``, ``pass@k`` for ``k`` in ``pass_ks``."""
        with torch.no_grad():
            p = success_prob(params, self.correct)
            out = {
                "success": p.mean(-1),
                "reward": expected_reward(params, self.rewards).mean(-1),
                "entropy": bandit_entropy(params).mean(-1),
            }
            for k in self.pass_ks:
                out[f"pass@{k}"] = exact_pass_at_k(p.clamp(max=1.0), k=k).mean(-1)  # a softmax sum may round above 1
        return out
