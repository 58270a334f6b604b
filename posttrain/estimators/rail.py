"""RAIL: learned rollout interventions (where to branch, how many continuations, at what temperature).

Pieces, all pure or (init, update) with explicit state:

- :func:`recoverability_gain`: the realised gain of an intervention, the increase of the group's
  population reward variance when the branch rewards join it (*reconstructed*).
- :class:`ControllerState` with :func:`controller_init` / :func:`controller_update` /
  :func:`controller_predict`: one linear gain predictor per action, refitted at every step on a
  sliding window of traces with recency weights :math:`\\gamma^{t - t_k}` and a Huber loss (IRLS).
- :func:`plan_interventions`: the live decision rule, greedy per prompt by utility
  :math:`f(c, a) - \\lambda C(a)` behind the gate :math:`\\kappa`, under a per-prompt budget and at
  most J interventions, with an :math:`\\varepsilon` of random exploration at gated-out states.
- :func:`random_interventions` (shadow phase, exploration) and :func:`entropy_heuristic_states`
  (the static baseline: branch from the highest-entropy prefix).

Shapes: P prompts, S candidate states per prompt, A intervention actions (pairs (b, tau)),
D feature dimension, N traces.

Reference: Zhang et al. 2026, "Optimizing What Policies Learn From: Recoverability-aware Rollout
Intervention Learning", arXiv:2608.05080. Every formula here is *reconstructed* from descriptions
of the paper (spec 11, section 3).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators.aggregate import masked_mean
from posttrain.registry import registry
from posttrain.validate import check_float, check_mask, check_positive, check_same_shape, check_tensor

__all__ = [
    "ControllerState",
    "InterventionPlan",
    "controller_fit",
    "controller_init",
    "controller_predict",
    "controller_update",
    "entropy_heuristic_states",
    "huber",
    "plan_interventions",
    "random_interventions",
    "recency_weights",
    "recoverability_gain",
]

PAPER = "Zhang et al. 2026, RAIL, arXiv:2608.05080"


def _population_var(values: Tensor, mask: Tensor) -> Tensor:
    mean = masked_mean(values, mask, dim=-1)
    return masked_mean((values - mean.unsqueeze(-1)) ** 2, mask, dim=-1)


def recoverability_gain(
    base_rewards: Float[Tensor, "*P n"],
    branch_rewards: Float[Tensor, "*P b"],
    branch_mask: Bool[Tensor, "*P b"] | None = None,
    base_mask: Bool[Tensor, "*P n"] | None = None,
) -> Float[Tensor, " *P"]:
    r"""Realised recoverability gain :math:`\Delta = \mathrm{Var}(R\cup B) - \mathrm{Var}(R)` (*reconstructed*).

    .. math:: \mathrm{Var}(R) = \frac{1}{|R|}\sum_{r\in R}(r - \bar r)^2

    (population variance). For binary rewards :math:`\mathrm{Var}(R) = \hat p(1-\hat p) \le 1/4`.
    No branch (``branch_mask`` all False) gives 0.

    Args:
        base_rewards: ``[..., n]`` rewards of the group before the intervention.
        branch_rewards: ``[..., b]`` rewards of the new branch trajectories.
        branch_mask: optional ``[..., b]`` boolean, which branch entries exist.
        base_mask: optional ``[..., n]`` boolean, which base entries exist (variable group sizes).

    Returns:
        ``[...]`` gains.

    Example:
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


def recency_weights(
    steps: Int[Tensor, " N"], now: int, *, gamma: float = 0.99, window: int | None = None
) -> Float[Tensor, " N"]:
    r"""Normalised recency weights :math:`\omega_k = \gamma^{t-t_k}/\sum_{j\in\mathcal W_t}\gamma^{t-t_j}`.

    Only the last ``window`` entries (the most recently appended) are in :math:`\mathcal W_t`;
    the others get weight 0. Weights are non-negative, sum to 1 (when N > 0) and do not increase
    with a trace's age. Computed in log space (no underflow for old traces).

    Example:
        >>> [round(x, 4) for x in recency_weights(torch.tensor([0, 1, 1]), 1, gamma=0.5).tolist()]
        [0.2, 0.4, 0.4]
    """
    check_tensor("steps", steps, ndim=1)
    if not 0.0 < gamma <= 1.0:
        raise DomainError(f"gamma: expected a value in (0, 1], got {gamma!r}")
    n = steps.shape[0]
    log_w = (int(now) - steps).to(torch.float64) * math.log(gamma)
    if window is not None:
        w = int(check_positive("window", window))
        inside = torch.arange(n) >= n - w
        log_w = torch.where(inside, log_w, torch.full_like(log_w, -math.inf))
    if n == 0:
        return log_w
    return torch.softmax(log_w, dim=0)


def huber(error: Tensor, delta: float) -> Tensor:
    r"""Huber loss :math:`\frac12 e^2` for :math:`|e|\le\delta`, :math:`\delta(|e| - \frac12\delta)` beyond.

    Example:
        >>> huber(torch.tensor([0.5, 2.0]), 1.0).tolist()
        [0.125, 1.5]
    """
    d = check_positive("delta", delta)
    a = error.abs()
    return torch.where(a <= d, 0.5 * error**2, d * (a - 0.5 * d))


class ControllerState(NamedTuple):
    """Linear gain predictors (one per action) and their trace window."""

    coef: Tensor
    """``[A, D]`` coefficients; prediction :math:`f(c, a) = c^\\top\\beta_a`."""
    features: Tensor
    """``[N, D]`` trace contexts, oldest first (N <= window)."""
    actions: Tensor
    """``[N]`` int64 trace actions."""
    gains: Tensor
    """``[N]`` realised gains."""
    steps: Tensor
    """``[N]`` int64 step of each trace."""


def controller_init(num_actions: int, num_features: int, *, dtype: torch.dtype = torch.float64) -> ControllerState:
    """A controller with no traces; it predicts 0 for every action."""
    a, d = int(num_actions), int(num_features)
    return ControllerState(
        torch.zeros(a, d, dtype=dtype),
        torch.zeros(0, d, dtype=dtype),
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0, dtype=dtype),
        torch.zeros(0, dtype=torch.long),
    )


def controller_fit(
    features: Float[Tensor, "N D"],
    actions: Int[Tensor, " N"],
    gains: Float[Tensor, " N"],
    weights: Float[Tensor, " N"],
    num_actions: int,
    *,
    delta: float = 0.05,
    ridge: float = 1e-4,
    iters: int = 20,
) -> Float[Tensor, "A D"]:
    r"""Weighted Huber regression per action by iteratively reweighted least squares, batched over actions.

    .. math:: \beta_a = \arg\min_\beta \sum_{k: a_k = a}\omega_k\,\mathrm{Huber}_\delta(c_k^\top\beta - \Delta_k)
              + \tfrac{\lambda}{2}\|\beta\|^2

    IRLS: weighted least squares, then ``iters`` rounds reweighting each trace by
    :math:`\min(1, \delta/|e_k|)`. ``ridge`` :math:`\lambda \ge 0` keeps unseen actions at 0.

    Returns:
        ``[A, D]`` coefficients.

    Raises:
        ShapeError: ``features`` not a float ``[N, D]``; ``actions`` not an integer ``[N]``; ``gains`` or
            ``weights`` not a float ``[N]``.
        DomainError: ``num_actions < 1``, an action outside ``[0, num_actions)``, a negative weight,
            ``delta <= 0`` or ``ridge < 0``.
    """
    check_float("features", features, ndim=2)
    check_tensor("actions", actions, ndim=1)
    if actions.is_floating_point() or actions.dtype == torch.bool:
        raise ShapeError(f"actions: expected an integer dtype, got {actions.dtype}")
    if actions.shape[0] != features.shape[0]:
        raise ShapeError(f"actions: expected shape [{features.shape[0]}] (rows of features), got {list(actions.shape)}")
    check_float("gains", gains, ndim=1)
    check_float("weights", weights, ndim=1)
    check_same_shape("actions", actions, gains=gains, weights=weights)
    if int(num_actions) < 1:
        raise DomainError(f"num_actions: expected an integer >= 1, got {num_actions!r}")
    if actions.numel() and (int(actions.min()) < 0 or int(actions.max()) >= int(num_actions)):
        raise DomainError(f"actions: expected values in [0, num_actions={int(num_actions)}), got {actions.tolist()}")
    if weights.numel() and float(weights.min()) < 0:
        raise DomainError("weights: expected non-negative recency weights")
    check_positive("delta", delta)
    check_positive("ridge", ridge, strict=False)
    a, d = int(num_actions), features.shape[1]
    y = gains.to(features.dtype)
    outer = (features.unsqueeze(-1) * features.unsqueeze(-2)).reshape(-1, d * d)  # [N, D*D]
    fy = features * y.unsqueeze(-1)  # [N, D]
    eye = torch.eye(d, dtype=features.dtype) * (ridge + 1e-12)
    robust = torch.ones_like(y)
    omega = weights.to(features.dtype)
    coef = torch.zeros(a, d, dtype=features.dtype)
    for _ in range(int(iters) + 1):
        w = (omega * robust).unsqueeze(-1)
        xtwx = torch.zeros(a, d * d, dtype=features.dtype).index_add_(0, actions, w * outer).reshape(a, d, d) + eye
        xtwy = torch.zeros(a, d, dtype=features.dtype).index_add_(0, actions, w * fy)
        coef = torch.linalg.solve(xtwx, xtwy.unsqueeze(-1)).squeeze(-1)
        resid = (features * coef[actions]).sum(-1) - y  # each trace against its own action's model
        robust = (delta / resid.abs().clamp(min=1e-12)).clamp(max=1.0)
    return coef


def controller_update(
    state: ControllerState,
    features: Float[Tensor, "M D"],
    actions: Int[Tensor, " M"],
    gains: Float[Tensor, " M"],
    step: int,
    *,
    window: int = 2000,
    gamma: float = 0.99,
    delta: float = 0.05,
    ridge: float = 1e-4,
    iters: int = 20,
) -> ControllerState:
    r"""Append step ``step``'s traces, keep the last ``window``, refit on recency-weighted Huber loss.

    .. math::
        \mathcal L(\phi) = \sum_{k\in\mathcal W_t}\omega_k\,\mathrm{Huber}_\delta\big(f_\phi(c_k, a_k) - \Delta_k\big)

    Args:
        state: current :class:`ControllerState`. features: ``[M, D]``. actions: ``[M]`` in [0, A).
        gains: ``[M]`` realised gains. step: the traces' step (weights use age ``step - t_k``).
        window, gamma, delta, ridge, iters: W, :math:`\gamma`, Huber :math:`\delta`, ridge, IRLS rounds.

    Returns:
        The new state (its ``coef`` predicts for step ``step + 1``).
    """
    check_float("features", features, ndim=2)
    if features.shape[1] != state.features.shape[1]:
        raise ShapeError(f"features: expected {state.features.shape[1]} columns, got {features.shape[1]}")
    m = features.shape[0]
    if actions.shape != (m,) or gains.shape != (m,):
        raise ShapeError(f"actions/gains: expected shape [{m}], got {list(actions.shape)} and {list(gains.shape)}")
    w = int(check_positive("window", window))
    f = torch.cat([state.features, features.to(state.features.dtype)])[-w:]
    a = torch.cat([state.actions, actions.long()])[-w:]
    g = torch.cat([state.gains, gains.to(state.gains.dtype)])[-w:]
    s = torch.cat([state.steps, torch.full((m,), int(step), dtype=torch.long)])[-w:]
    if f.shape[0] == 0:
        return state
    omega = recency_weights(s, int(step), gamma=gamma).to(f.dtype)
    coef = controller_fit(f, a, g, omega, state.coef.shape[0], delta=delta, ridge=ridge, iters=iters)
    return ControllerState(coef, f, a, g, s)


def controller_predict(state: ControllerState, features: Float[Tensor, "*S D"]) -> Float[Tensor, "*S A"]:
    """Predicted gain of every action at every context: ``features @ coef.T``."""
    check_float("features", features)
    return features.to(state.coef.dtype) @ state.coef.T


class InterventionPlan(NamedTuple):
    """Chosen interventions, J rounds per prompt; inactive slots are padding."""

    state: Tensor
    """``[P, J]`` int64 candidate-state index."""
    action: Tensor
    """``[P, J]`` int64 action index."""
    active: Tensor
    """``[P, J]`` boolean, the slot is a real intervention."""
    explored: Tensor
    """``[P, J]`` boolean, the slot was chosen by exploration rather than by the gate."""


def random_interventions(
    feasible: Bool[Tensor, "P S A"], generator: torch.Generator
) -> tuple[Int[Tensor, " P"], Int[Tensor, " P"], Bool[Tensor, " P"]]:
    """One uniformly random feasible (state, action) per prompt; ``active`` False where none is feasible."""
    check_tensor("feasible", feasible, ndim=3)
    p, s, a = feasible.shape
    flat = feasible.reshape(p, s * a).to(torch.float64)
    any_ok = flat.sum(dim=-1) > 0
    probs = torch.where(any_ok.unsqueeze(-1), flat, torch.ones_like(flat))
    pick = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return pick // a, pick % a, any_ok


def plan_interventions(
    predictions: Float[Tensor, "P S A"],
    costs: Float[Tensor, " A"],
    candidate_valid: Bool[Tensor, "P S"],
    *,
    budget: float | Float[Tensor, " P"],
    max_per_prompt: int,
    kappa: float = 0.0,
    cost_weight: float = 0.005,
    explore_prob: float = 0.0,
    generator: torch.Generator | None = None,
) -> InterventionPlan:
    r"""Live decision rule: per prompt, greedily take the best (state, action) by utility while it passes the gate.

    .. math:: u(s, a) = f_\phi(c(s), a) - \lambda C(a),\qquad \text{take } \arg\max_{(s,a)} u \text{ iff } u > \kappa

    Each round (at most J = ``max_per_prompt``) considers unused candidate states and actions whose
    cost fits the prompt's remaining ``budget``; a state is branched at most once. A prompt whose
    gate closes while budget remains takes a uniformly random feasible intervention with
    probability ``explore_prob`` (bandit exploration; needs ``generator``). Decisions use only the
    predictions, never the branch rewards. Loops over the J rounds only.

    Args:
        predictions: ``[P, S, A]`` predicted gains. costs: ``[A]`` cost (extra rollouts) per action.
        candidate_valid: ``[P, S]`` which candidate states exist (unused ones).
        budget: extra rollouts allowed per prompt, a number or a ``[P]`` tensor of remaining budgets.
        max_per_prompt: J. kappa: the gate (``inf`` = never intervene). cost_weight: :math:`\lambda`.
        explore_prob: :math:`\varepsilon \in [0, 1]`. generator: explicit RNG for exploration.

    Returns:
        :class:`InterventionPlan` with ``[P, J]`` fields.

    Example:
        >>> pred = torch.tensor([[[0.1, 0.3], [0.2, 0.0]]])
        >>> plan = plan_interventions(pred, torch.tensor([2.0, 4.0]), torch.ones(1, 2, dtype=torch.bool),
        ...                           budget=4, max_per_prompt=2, cost_weight=0.0)
        >>> plan.state.tolist(), plan.action.tolist(), plan.active.tolist()
        ([[0, 0]], [[1, 0]], [[True, False]])
    """
    check_float("predictions", predictions, ndim=3)
    p, s, a = predictions.shape
    check_mask("candidate_valid", candidate_valid, (p, s))
    if costs.shape != (a,):
        raise ShapeError(f"costs: expected shape [{a}], got {list(costs.shape)}")
    if not 0.0 <= explore_prob <= 1.0:
        raise DomainError(f"explore_prob: expected a value in [0, 1], got {explore_prob!r}")
    if explore_prob > 0 and generator is None:
        raise DomainError("generator: required when explore_prob > 0")
    j_max = int(max_per_prompt)
    utility = predictions - cost_weight * costs.to(predictions.dtype)
    remaining = torch.as_tensor(budget, dtype=torch.float64).expand(p).clone()
    unused = candidate_valid.clone()
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
            rs, ra, ok = random_interventions(feasible, generator)  # type: ignore[arg-type]
            coin = torch.rand(p, generator=generator, dtype=torch.float64) < explore_prob
            explored = ~take & ok & coin
            st, ac = torch.where(explored, rs, st), torch.where(explored, ra, ac)
        active = take | explored
        out_s[:, j], out_a[:, j], out_active[:, j], out_explored[:, j] = st, ac, active, explored
        remaining = remaining - torch.where(active, costs64[ac], torch.zeros((), dtype=torch.float64))
        unused[rows, st] = unused[rows, st] & ~active
    return InterventionPlan(out_s, out_a, out_active, out_explored)


def entropy_heuristic_states(entropy: Float[Tensor, "P S"], candidate_valid: Bool[Tensor, "P S"]) -> Int[Tensor, " P"]:
    """Static baseline: the candidate state of highest policy entropy per prompt (ARPO-style trigger).

    Example:
        >>> entropy_heuristic_states(torch.tensor([[0.1, 0.9, 2.0]]), torch.tensor([[True, True, False]])).tolist()
        [1]
    """
    check_float("entropy", entropy, ndim=2)
    check_mask("candidate_valid", candidate_valid, entropy.shape)
    return torch.where(candidate_valid, entropy, torch.full_like(entropy, -math.inf)).argmax(dim=-1)


_ROLLOUT = registry("rollout_intervention")
_ROLLOUT.add("rail", plan_interventions, paper=PAPER)
_ROLLOUT.add("entropy_heuristic", entropy_heuristic_states, paper="static baseline (ARPO-style entropy trigger)")
