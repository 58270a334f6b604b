r"""Population diversity and coverage of evolution strategies (Ba et al. 2026, arXiv:2608.27351, §3.1, App. A).

For a population of ``P`` perturbed policies $\pi_i(\cdot\mid x)$ with success probabilities
$p_i(x)$:

- policy Jensen-Shannon diversity $\mathrm{JS}^{pol} = \frac1P\sum_i \mathrm{KL}(\pi_i\|\bar\pi)
  = H(\bar\pi) - \frac1P\sum_i H(\pi_i)$;
- its verifier projection $\mathrm{JS}^{succ} = h(\bar p) - \frac1P\sum_i h(p_i)$, with
  $0 \le \mathrm{JS}^{succ} \le \mathrm{JS}^{pol}$ (data processing);
- the pass@P link (Lemma 2): one response per member, $P^{pop} = 1-\prod_i(1-p_i) \ge
  P^{same} = 1-(1-\bar p)^P$, with $P^{pop}-P^{same}\approx P\bar p(1-\bar p)^{P-1}\mathrm{JS}^{succ}$;
- Lemma 1's small-$\sigma$ expectation $\frac{\sigma^2}2(1-\frac1P)\operatorname{tr}\mathcal I_x$;
- Lemma 3's reward-weighted success and Proposition 1's pass@K bound.

Also the exact coverage metrics of Hayes et al. 2026 (arXiv:2608.12679) computed from success
probabilities: pass@k, the expected bin-0 fraction, expected regressions / progressions against a
base policy, and a regression-weighted entropy. Probabilities live on the last axis; leading axes
are batch axes (prompts, seeds).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.validate import check_finite, check_float, check_positive, value_checks_enabled

__all__ = [
    "PopulationCoverage",
    "bernoulli_kl",
    "binary_entropy",
    "categorical_entropy",
    "exact_pass_at_k",
    "expected_policy_js",
    "first_order_entropy_change",
    "pass_at_k_lower_bound",
    "policy_js_diversity",
    "population_coverage",
    "population_pass",
    "population_pass_gap",
    "regression_progression",
    "reward_weighted_success",
    "softmax_fisher_trace",
    "success_js_diversity",
    "zero_bin_fraction",
]


def _check_prob(name: str, p: Tensor, *, ndim_min: int = 1) -> Tensor:
    check_float(name, p)
    if p.ndim < ndim_min or (p.ndim and p.shape[-1] == 0):
        raise ShapeError(
            f"{name}: expected at least {ndim_min} dimension(s) with a non-empty last axis, got {list(p.shape)}"
        )
    check_finite(name, p)
    if value_checks_enabled() and bool(((p < 0) | (p > 1)).any()):
        raise DomainError(f"{name}: expected probabilities in [0, 1]")
    return p


def _check_simplex(name: str, probs: Tensor) -> Tensor:
    _check_prob(name, probs)
    if value_checks_enabled():
        tol = 1e-6 if probs.dtype == torch.float64 else 1e-4
        if bool(((probs.sum(-1) - 1).abs() > tol).any()):
            raise DomainError(f"{name}: expected each distribution on the last axis to sum to 1")
    return probs


def binary_entropy(p: Tensor) -> Tensor:
    r"""Binary entropy in nats, $h(p) = -p\log p - (1-p)\log(1-p)$, with $h(0)=h(1)=0$.

    Examples:
        >>> round(float(binary_entropy(torch.tensor(0.5))), 6)
        0.693147
    """
    _check_prob("p", p, ndim_min=0)
    return -(torch.special.xlogy(p, p) + torch.special.xlogy(1 - p, 1 - p))


def bernoulli_kl(p: Tensor, q: Tensor) -> Tensor:
    r"""$\mathrm{KL}(\mathrm{Bern}(p)\|\mathrm{Bern}(q)) = p\log\frac pq + (1-p)\log\frac{1-p}{1-q}$ (nats)."""
    _check_prob("p", p, ndim_min=0)
    _check_prob("q", q, ndim_min=0)
    return (
        torch.special.xlogy(p, p)
        - torch.special.xlogy(p, q)
        + torch.special.xlogy(1 - p, 1 - p)
        - torch.special.xlogy(1 - p, 1 - q)
    )


def categorical_entropy(probs: Float[Tensor, "... V"]) -> Float[Tensor, ...]:
    r"""Entropy $-\sum_v \pi_v\log\pi_v$ over the last axis (nats)."""
    _check_simplex("probs", probs)
    return -torch.special.xlogy(probs, probs).sum(-1)


def policy_js_diversity(probs: Float[Tensor, "... P V"]) -> Float[Tensor, ...]:
    r"""Policy JS diversity $\frac1P\sum_i\mathrm{KL}(\pi_i\|\bar\pi_P)$ of ``P`` member distributions.

    Computed as the mean KL to the mixture (non-negative term by term), in ``[0, log P]``.

    Args:
        probs: ``[..., P, V]`` member distributions over ``V`` responses.

    Returns:
        ``[...]`` diversity in nats.

    Examples:
        >>> round(float(policy_js_diversity(torch.tensor([[1., 0.], [0., 1.]]))), 6)  # log 2
        0.693147
    """
    _check_simplex("probs", probs)
    if probs.ndim < 2:
        raise ShapeError(f"probs: expected shape [..., P, V], got {list(probs.shape)}")
    mix = probs.mean(-2, keepdim=True)
    kl = (torch.special.xlogy(probs, probs) - torch.special.xlogy(probs, mix)).sum(-1)
    return kl.mean(-1).clamp_min(0.0)


def success_js_diversity(success: Float[Tensor, "... P"]) -> Float[Tensor, ...]:
    r"""Verifier-projected JS diversity $h(\bar p) - \frac1P\sum_i h(p_i)$ of member success probabilities.

    Examples:
        >>> round(float(success_js_diversity(torch.tensor([0., 1.]))), 6)
        0.693147
    """
    _check_prob("success", success)
    return (binary_entropy(success.mean(-1)) - binary_entropy(success).mean(-1)).clamp_min(0.0)


def population_pass(success: Float[Tensor, "... P"]) -> tuple[Tensor, Tensor]:
    r"""Lemma 2: $(P^{pop}, P^{same}) = (1-\prod_i(1-p_i),\ 1-(1-\bar p)^P)$, one response per member.

    Examples:
        >>> [round(float(t), 4) for t in population_pass(torch.tensor([0., 1.]))]
        [1.0, 0.75]
    """
    _check_prob("success", success)
    pop = -torch.expm1(torch.log1p(-success).sum(-1))
    same = -torch.expm1(success.shape[-1] * torch.log1p(-success.mean(-1)))
    return pop, same


def population_pass_gap(success: Float[Tensor, "... P"]) -> Tensor:
    r"""Lemma 2's gain $P^{pop}-P^{same} = (1-\bar p)^P - \prod_i(1-p_i)$, computed without cancellation.

    As $-(1-\bar p)^P\,\mathrm{expm1}\big(\sum_i\mathrm{log1p}(-(p_i-\bar p)/(1-\bar p))\big)$, accurate
    when the gain is far below float precision of the two pass rates (small perturbations, large P).

    Examples:
        >>> round(float(population_pass_gap(torch.tensor([0., 1.]))), 4)
        0.25
    """
    _check_prob("success", success)
    mean = success.mean(-1, keepdim=True)
    u = 1.0 - mean
    safe_u = torch.where(u > 0, u, torch.ones_like(u))
    log_ratio = torch.log1p(-(success - mean) / safe_u).sum(-1)
    gap = -(safe_u.squeeze(-1) ** success.shape[-1]) * torch.expm1(log_ratio)
    return torch.where(u.squeeze(-1) > 0, gap, torch.zeros_like(gap))


@dataclass(frozen=True)
class PopulationCoverage:
    """Prompt-averaged coverage diagnostics of a population (Ba et al. 2026, Algorithm D)."""

    mean_success: Tensor
    js_success: Tensor
    pass_population: Tensor
    pass_same: Tensor


def population_coverage(success: Float[Tensor, "... X P"]) -> PopulationCoverage:
    """Average `success_js_diversity` and `population_pass` over the prompt axis ``X``."""
    _check_prob("success", success)
    if success.ndim < 2:
        raise ShapeError(f"success: expected shape [..., X, P], got {list(success.shape)}")
    pop, same = population_pass(success)
    return PopulationCoverage(
        mean_success=success.mean((-1, -2)),
        js_success=success_js_diversity(success).mean(-1),
        pass_population=pop.mean(-1),
        pass_same=same.mean(-1),
    )


def softmax_fisher_trace(probs: Float[Tensor, "... V"]) -> Float[Tensor, ...]:
    r"""Trace of the Fisher information of a softmax w.r.t. its logits: $1 - \sum_v\pi_v^2$."""
    _check_simplex("probs", probs)
    return 1.0 - probs.square().sum(-1)


def expected_policy_js(fisher_trace: Tensor, *, sigma: float, population: int) -> Tensor:
    r"""Lemma 1: $\mathbb E[\mathrm{JS}^{pol}_P] \approx \frac{\sigma^2}{2}(1-\frac1P)\mathrm{tr}\,\mathcal I_x$.

    The trace must be taken in the coordinates that are perturbed (e.g. logits for a softmax bandit).
    """
    sigma = check_positive("sigma", sigma)
    if population < 1:
        raise DomainError(f"population: expected >= 1, got {population}")
    return 0.5 * sigma**2 * (1.0 - 1.0 / population) * fisher_trace


def reward_weighted_success(weights: Float[Tensor, " P"], success: Float[Tensor, "... P"]) -> Tensor:
    r"""Lemma 3: weighted-mixture success $p_w = \sum_i w_i p_i = \bar p + P\,\mathrm{Cov}_i(w_i, p_i)$.

    ``weights`` must lie on the simplex.
    """
    _check_simplex("weights", weights)
    _check_prob("success", success)
    if weights.shape[-1] != success.shape[-1]:
        raise ShapeError(f"weights: expected {success.shape[-1]} entries (one per member), got {list(weights.shape)}")
    return (success * weights).sum(-1)


def pass_at_k_lower_bound(p_w: Tensor, p_plus: Tensor, *, k: int) -> Tensor:
    r"""Proposition 1's lower bound on $f_K(p_+)$, per prompt.

    $$
    f_K(p_+) \ge f_K(p_w) - K\sqrt{\mathrm{KL}(\mathrm{Bern}(p_w)\|\mathrm{Bern}(p_+))/2}
    $$


    $f_K(p) = 1-(1-p)^K$ is K-Lipschitz and Pinsker bounds $|p_w-p_+|$.
    """
    if k < 1:
        raise DomainError(f"k: expected >= 1, got {k}")
    return exact_pass_at_k(p_w, k=k) - k * (bernoulli_kl(p_w, p_plus).clamp_min(0.0) / 2).sqrt()


def exact_pass_at_k(p: Tensor, *, k: int) -> Tensor:
    r"""Pass@k of a policy with success probability ``p``: $1-(1-p)^k$ (elementwise)."""
    _check_prob("p", p, ndim_min=0)
    if k < 1:
        raise DomainError(f"k: expected >= 1, got {k}")
    return -torch.expm1(k * torch.log1p(-p))


def zero_bin_fraction(p: Float[Tensor, "... X"], *, n: int) -> Tensor:
    r"""Expected fraction of prompts with no correct answer among ``n`` samples: $\mathrm{mean}_x(1-p(x))^n$."""
    return 1.0 - exact_pass_at_k(p, k=n).mean(-1)


def regression_progression(
    p_base: Float[Tensor, "... X"], p: Float[Tensor, "... X"], *, n: int
) -> tuple[Tensor, Tensor, Tensor]:
    r"""Expected regression and progression counts of a tuned policy vs a base (any-correct among ``n``).

    $\mathrm{reg} = \sum_x [1-(1-p_0)^n](1-p)^n$, $\mathrm{prog} = \sum_x (1-p_0)^n[1-(1-p)^n]$.
    Returns ``(reg, prog, weights)`` with ``weights [..., X]`` the per-prompt regression probability.
    """
    if p_base.shape != getattr(p, "shape", None):
        raise ShapeError("p: expected the shape of p_base")
    solved0, solved = exact_pass_at_k(p_base, k=n), exact_pass_at_k(p, k=n)
    reg_w = solved0 * (1 - solved)
    return reg_w.sum(-1), ((1 - solved0) * solved).sum(-1), reg_w


def first_order_entropy_change(
    probs: Float[Tensor, "... V"], advantages: Float[Tensor, "... V"], *, eta: float
) -> Tensor:
    r"""First-order entropy change $\Delta H \approx -\eta\,\mathrm{Cov}_{a\sim\pi}(\log\pi_a, \pi_aA_a)$.

    For the logit step $\Delta z_a = \eta\pi_aA_a$ of a tabular softmax (Cui et al. 2025, cited by Ba et
    al. 2026, §3.2).
    """
    _check_simplex("probs", probs)
    check_float("advantages", advantages)
    if advantages.shape != probs.shape:
        raise ShapeError(f"advantages: expected shape {list(probs.shape)}, got {list(advantages.shape)}")
    logp = torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))
    step = probs * advantages
    cov = (probs * logp * step).sum(-1) - (probs * logp).sum(-1) * (probs * step).sum(-1)
    return -eta * cov
