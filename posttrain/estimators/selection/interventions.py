r"""RAIL: learned rollout interventions (where to branch, how many continuations, at what temperature).

Pieces, all pure or (init, update) with explicit state:

- `recoverability_gain`: the realised gain of an intervention, the increase of the group's
  population reward variance when the branch rewards join it (*reconstructed*).
- the controller (`posttrain.estimators.selection.controller`): one linear gain predictor per
  action, refitted at every step on a sliding window of traces with recency weights
  $\gamma^{t - t_k}$ and a Huber loss (IRLS).
- `plan_interventions`: the live decision rule, greedy per prompt by utility
  $f(c, a) - \lambda C(a)$ behind the gate $\kappa$, under a per-prompt budget and at
  most J interventions, with an $\varepsilon$ of random exploration at gated-out states.
- `random_interventions` (shadow phase, exploration) and `entropy_heuristic_states`
  (the static baseline: branch from the highest-entropy prefix).

Shapes: P prompts, S candidate states per prompt, A intervention actions (pairs (b, tau)),
D feature dimension, N traces. The controller and the planners also take optional leading batch
dimensions (``*R``, e.g. independent runs or seeds): every run then has its own coefficients, its
own trace window and, for the planners, its own generator; runs never share a fit or a draw.

Reference: Zhang et al. 2026, "Optimizing What Policies Learn From: Recoverability-aware Rollout
Intervention Learning", arXiv:2608.05080. Every formula here is *reconstructed* from descriptions
of the paper (docs: methods/rail.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators.aggregation import masked_mean
from posttrain.registry import registry
from posttrain.shapes import Bool, Float, Int
from posttrain.validate import check_float, check_mask, check_tensor

__all__ = [
    "InterventionPlan",
    "entropy_heuristic_states",
    "plan_interventions",
    "random_interventions",
    "recoverability_gain",
]


PAPER = "Zhang et al. 2026, RAIL, arXiv:2608.05080"

Generators = torch.Generator | Sequence[torch.Generator]
"""One generator, or one per run (the leading dimension of the planners' inputs)."""


def _population_var(values: Tensor, mask: Tensor) -> Tensor:
    mean = masked_mean(values, mask, dim=-1)
    return masked_mean((values - mean.unsqueeze(-1)) ** 2, mask, dim=-1)


def recoverability_gain(
    base_rewards: Float[Tensor, "*P n"],
    branch_rewards: Float[Tensor, "*P b"],
    branch_mask: Bool[Tensor, "*P b"] | None = None,
    base_mask: Bool[Tensor, "*P n"] | None = None,
) -> Float[Tensor, " *P"]:
    r"""Realised recoverability gain $\Delta = \mathrm{Var}(R\cup B) - \mathrm{Var}(R)$ (*reconstructed*).

    $$
    \mathrm{Var}(R) = \frac{1}{|R|}\sum_{r\in R}(r - \bar r)^2
    $$

    (population variance). For binary rewards $\mathrm{Var}(R) = \hat p(1-\hat p) \le 1/4$.
    No branch (``branch_mask`` all False) gives 0.

    Args:
        base_rewards: ``[..., n]`` rewards of the group before the intervention.
        branch_rewards: ``[..., b]`` rewards of the new branch trajectories.
        branch_mask: optional ``[..., b]`` boolean, which branch entries exist.
        base_mask: optional ``[..., n]`` boolean, which base entries exist (variable group sizes).

    Returns:
        ``[...]`` gains.

    Examples:
        >>> recoverability_gain(torch.tensor([0., 0., 0., 1.]), torch.tensor([1., 1.])).item()
        0.0625
    """
    check_float("base_rewards", base_rewards)
    check_float("branch_rewards", branch_rewards)
    if base_rewards.shape[:-1] != branch_rewards.shape[:-1]:
        raise ShapeError(
            f"branch_rewards: expected leading shape {list(base_rewards.shape[:-1])}, got {list(branch_rewards.shape)}"
        )
    if branch_mask is None:
        branch_mask = torch.ones_like(branch_rewards, dtype=torch.bool)
    check_mask("branch_mask", branch_mask, branch_rewards.shape)
    if base_mask is None:
        base_mask = torch.ones_like(base_rewards, dtype=torch.bool)
    check_mask("base_mask", base_mask, base_rewards.shape)
    both = torch.cat([base_rewards, branch_rewards], dim=-1)
    both_mask = torch.cat([base_mask, branch_mask], dim=-1)
    gain = _population_var(both, both_mask) - _population_var(base_rewards, base_mask)
    return torch.where(branch_mask.any(dim=-1), gain, torch.zeros((), dtype=gain.dtype))  # exactly 0 with no branch


class InterventionPlan(NamedTuple):
    """Chosen interventions, J rounds per prompt; inactive slots are padding."""

    state: Tensor
    """``[*R, P, J]`` int64 candidate-state index."""
    action: Tensor
    """``[*R, P, J]`` int64 action index."""
    active: Tensor
    """``[*R, P, J]`` boolean, the slot is a real intervention."""
    explored: Tensor
    """``[*R, P, J]`` boolean, the slot was chosen by exploration rather than by the gate."""


def _uniform(generator: Generators | None, lead: torch.Size) -> Tensor:
    """``[*lead]`` uniforms in [0, 1); a sequence of generators gives row ``r`` from generator ``r``."""
    if generator is None:
        raise DomainError("generator: required for random interventions")
    if isinstance(generator, torch.Generator):
        return torch.rand(lead, generator=generator, dtype=torch.float64)
    gens = tuple(generator)
    if len(lead) < 2 or len(gens) != lead[0]:
        raise ShapeError(f"generator: expected one generator per run ({lead[0] if lead else 0}), got {len(gens)}")
    return torch.stack([torch.rand(lead[1:], generator=g, dtype=torch.float64) for g in gens])


def random_interventions(
    feasible: Bool[Tensor, "*R P S A"], generator: Generators
) -> tuple[Int[Tensor, "*R P"], Int[Tensor, "*R P"], Bool[Tensor, "*R P"]]:
    """One uniformly random feasible (state, action) per prompt; ``active`` False where none is feasible.

    One uniform per prompt, inverted on the feasible pairs in (state, action) order; with leading
    run dimensions ``*R`` and one generator per run (a sequence), a run's draws depend only on its
    own generator.
    """
    check_tensor("feasible", feasible)
    if feasible.ndim < 3 or feasible.dtype != torch.bool:
        raise ShapeError(
            f"feasible: expected a boolean [..., P, S, A] tensor, got {feasible.dtype} {list(feasible.shape)}"
        )
    s, a = feasible.shape[-2:]
    lead = feasible.shape[:-2]
    count = feasible.reshape(*lead, s * a).to(torch.long).cumsum(-1)  # feasible pairs up to each position
    total = count[..., -1]
    any_ok = total > 0
    target = (_uniform(generator, lead) * total).floor().to(torch.long).clamp(max=(total - 1).clamp(min=0))
    pick = (count <= target.unsqueeze(-1)).sum(-1).clamp(max=s * a - 1)  # first position whose count exceeds it
    return pick // a, pick % a, any_ok


def plan_interventions(
    predictions: Float[Tensor, "*R P S A"],
    costs: Float[Tensor, " A"],
    candidate_valid: Bool[Tensor, "*R P S"],
    *,
    budget: float | Float[Tensor, "*R P"],
    max_per_prompt: int,
    kappa: float = 0.0,
    cost_weight: float = 0.005,
    explore_prob: float = 0.0,
    generator: Generators | None = None,
) -> InterventionPlan:
    r"""Live decision rule: per prompt, greedily take the best (state, action) by utility while it passes the gate.

    $$
    u(s, a) = f_\phi(c(s), a) - \lambda C(a),\qquad \text{take } \arg\max_{(s,a)} u \text{ iff } u > \kappa
    $$

    Each round (at most J = ``max_per_prompt``) considers unused candidate states and actions whose
    cost fits the prompt's remaining ``budget``; a state is branched at most once. A prompt whose
    gate closes while budget remains takes a uniformly random feasible intervention with
    probability ``explore_prob`` (bandit exploration; needs ``generator``). Decisions use only the
    predictions, never the branch rewards. Loops over the J rounds only. Leading dimensions ``*R``
    are independent runs; pass one generator per run to keep their exploration draws apart.

    Args:
        predictions: ``[*R, P, S, A]`` predicted gains. costs: ``[A]`` cost (extra rollouts) per action.
        candidate_valid: ``[*R, P, S]`` which candidate states exist (unused ones).
        budget: extra rollouts allowed per prompt, a number or a ``[*R, P]`` tensor of remaining budgets.
        max_per_prompt: J. kappa: the gate (``inf`` = never intervene). cost_weight: $\lambda$.
        explore_prob: $\varepsilon \in [0, 1]$. generator: explicit RNG (or one per run) for exploration.

    Returns:
        `InterventionPlan` with ``[*R, P, J]`` fields.

    Examples:
        >>> pred = torch.tensor([[[0.1, 0.3], [0.2, 0.0]]])
        >>> plan = plan_interventions(pred, torch.tensor([2.0, 4.0]), torch.ones(1, 2, dtype=torch.bool),
        ...                           budget=4, max_per_prompt=2, cost_weight=0.0)
        >>> plan.state.tolist(), plan.action.tolist(), plan.active.tolist()
        ([[0, 0]], [[1, 0]], [[True, False]])
    """
    check_float("predictions", predictions)
    if predictions.ndim < 3:
        raise ShapeError(f"predictions: expected a [..., P, S, A] tensor, got shape {list(predictions.shape)}")
    lead, (s, a) = predictions.shape[:-2], predictions.shape[-2:]
    check_mask("candidate_valid", candidate_valid, (*lead, s))
    if costs.shape != (a,):
        raise ShapeError(f"costs: expected shape [{a}], got {list(costs.shape)}")
    if not 0.0 <= explore_prob <= 1.0:
        raise DomainError(f"explore_prob: expected a value in [0, 1], got {explore_prob!r}")
    if explore_prob > 0 and generator is None:
        raise DomainError("generator: required when explore_prob > 0")
    j_max = int(max_per_prompt)
    p = math.prod(lead)
    utility = (predictions - cost_weight * costs.to(predictions.dtype)).reshape(p, s, a)
    remaining = torch.as_tensor(budget, dtype=torch.float64).expand(lead).reshape(p).clone()
    unused = candidate_valid.reshape(p, s).clone()
    out_s = torch.zeros(p, j_max, dtype=torch.long)
    out_a = torch.zeros(p, j_max, dtype=torch.long)
    out_active = torch.zeros(p, j_max, dtype=torch.bool)
    out_explored = torch.zeros(p, j_max, dtype=torch.bool)
    rows = torch.arange(p)
    costs64 = costs.to(torch.float64)
    for j in range(j_max):
        feasible = unused.unsqueeze(-1) & (costs64.view(1, 1, a) <= remaining.view(p, 1, 1))
        u = torch.where(feasible, utility, torch.full_like(utility, -math.inf)).reshape(p, s * a)
        best = u.argmax(dim=-1)
        take = feasible.reshape(p, -1).any(dim=-1) & (u[rows, best] > kappa)
        st, ac = best // a, best % a
        explored = torch.zeros(p, dtype=torch.bool)
        if explore_prob > 0:
            rs, ra, ok = (x.reshape(p) for x in random_interventions(feasible.reshape(*lead, s, a), generator))  # type: ignore[arg-type]
            coin = _uniform(generator, lead).reshape(p) < explore_prob
            explored = ~take & ok & coin
            st, ac = torch.where(explored, rs, st), torch.where(explored, ra, ac)
        active = take | explored
        out_s[:, j], out_a[:, j], out_active[:, j], out_explored[:, j] = st, ac, active, explored
        remaining = remaining - torch.where(active, costs64[ac], torch.zeros((), dtype=torch.float64))
        unused[rows, st] = unused[rows, st] & ~active
    return InterventionPlan(*(x.reshape(*lead, j_max) for x in (out_s, out_a, out_active, out_explored)))


def entropy_heuristic_states(entropy: Float[Tensor, "P S"], candidate_valid: Bool[Tensor, "P S"]) -> Int[Tensor, " P"]:
    """Static baseline: the candidate state of highest policy entropy per prompt (ARPO-style trigger).

    Examples:
        >>> entropy_heuristic_states(torch.tensor([[0.1, 0.9, 2.0]]), torch.tensor([[True, True, False]])).tolist()
        [1]
    """
    check_float("entropy", entropy, ndim=2)
    check_mask("candidate_valid", candidate_valid, entropy.shape)
    return torch.where(candidate_valid, entropy, torch.full_like(entropy, -math.inf)).argmax(dim=-1)


_ROLLOUT = registry("rollout_intervention")

_ROLLOUT.add("rail", plan_interventions, paper=PAPER)

_ROLLOUT.add("entropy_heuristic", entropy_heuristic_states, paper="static baseline (ARPO-style entropy trigger)")
