"""RAIL: learned rollout interventions (where to branch, how many continuations, at what temperature).

Pieces, all pure or (init, update) with explicit state:

- `recoverability_gain`: the realised gain of an intervention, the increase of the group's
  population reward variance when the branch rewards join it (*reconstructed*).
- `ControllerState` with `controller_init` / `controller_update` /
  `controller_predict`: one linear gain predictor per action, refitted at every step on a
  sliding window of traces with recency weights $\\gamma^{t - t_k}$ and a Huber loss (IRLS).
- `plan_interventions`: the live decision rule, greedy per prompt by utility
  $f(c, a) - \\lambda C(a)$ behind the gate $\\kappa$, under a per-prompt budget and at
  most J interventions, with an $\\varepsilon$ of random exploration at gated-out states.
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


def recency_weights(
    steps: Int[Tensor, "*R N"],
    now: int,
    *,
    gamma: float = 0.99,
    window: int | None = None,
    mask: Bool[Tensor, "*R N"] | None = None,
) -> Float[Tensor, "*R N"]:
    r"""Normalised recency weights $\omega_k = \gamma^{t-t_k}/\sum_{j\in\mathcal W_t}\gamma^{t-t_j}$.

    Only the last ``window`` entries (the most recently appended) are in $\mathcal W_t$;
    the others get weight 0. With ``steps`` and ``mask`` of shape ``[*R, N]`` (one row per run) only the masked entries
    count, the window keeps each run's last ``window`` masked entries, and each row is normalised
    on its own (a row with no entry is all 0). Weights are non-negative, sum to 1 (when there is an
    entry) and do not increase with a trace's age. Computed in log space (no underflow for old traces).

    Examples:
        >>> [round(x, 4) for x in recency_weights(torch.tensor([0, 1, 1]), 1, gamma=0.5).tolist()]
        [0.2, 0.4, 0.4]
    """
    check_tensor("steps", steps)
    if steps.ndim < 1:
        raise ShapeError(f"steps: expected a [..., N] integer tensor, got shape {list(steps.shape)}")
    if not 0.0 < gamma <= 1.0:
        raise DomainError(f"gamma: expected a value in (0, 1], got {gamma!r}")
    n = steps.shape[-1]
    log_w = (int(now) - steps).to(torch.float64) * math.log(gamma)
    inside = torch.ones(steps.shape, dtype=torch.bool) if mask is None else mask
    if mask is not None and (mask.dtype != torch.bool or mask.ndim < 1 or mask.shape[-1] != n):
        raise ShapeError(f"mask: expected a boolean [..., {n}] tensor, got {mask.dtype} {list(mask.shape)}")
    if window is not None:
        w = int(check_positive("window", window))
        from_end = inside.flip(-1).to(torch.long).cumsum(-1).flip(-1)  # masked entries at or after each one
        inside = inside & (from_end <= w)
    log_w = torch.where(inside, log_w, torch.full_like(log_w, -math.inf))
    if n == 0:
        return log_w
    weights = torch.softmax(log_w, dim=-1)
    return torch.where(inside.any(-1, keepdim=True), weights, torch.zeros_like(weights))


def huber(error: Tensor, delta: float) -> Tensor:
    r"""Huber loss $\frac12 e^2$ for $|e|\le\delta$, $\delta(|e| - \frac12\delta)$ beyond.

    Examples:
        >>> huber(torch.tensor([0.5, 2.0]), 1.0).tolist()
        [0.125, 1.5]
    """
    d = check_positive("delta", delta)
    a = error.abs()
    return torch.where(a <= d, 0.5 * error**2, d * (a - 0.5 * d))


class ControllerState(NamedTuple):
    """Linear gain predictors (one per action) and their trace window, optionally one per run (``*R``)."""

    coef: Tensor
    """``[*R, A, D]`` coefficients; prediction $f(c, a) = c^\\top\\beta_a$."""
    features: Tensor
    """``[*R, N, D]`` trace contexts, oldest first."""
    actions: Tensor
    """``[*R, N]`` int64 trace actions."""
    gains: Tensor
    """``[*R, N]`` realised gains."""
    steps: Tensor
    """``[*R, N]`` int64 step of each trace."""
    valid: Tensor | None = None
    """``[*R, N]`` boolean, the trace belongs to the run's window (``None``: all do)."""


def controller_init(
    num_actions: int, num_features: int, *, runs: Sequence[int] = (), dtype: torch.dtype = torch.float64
) -> ControllerState:
    """A controller with no traces (one per run when ``runs`` gives the batch shape ``*R``); it predicts 0."""
    a, d, r = int(num_actions), int(num_features), tuple(int(x) for x in runs)
    return ControllerState(
        torch.zeros(*r, a, d, dtype=dtype),
        torch.zeros(*r, 0, d, dtype=dtype),
        torch.zeros(*r, 0, dtype=torch.long),
        torch.zeros(*r, 0, dtype=dtype),
        torch.zeros(*r, 0, dtype=torch.long),
        torch.zeros(*r, 0, dtype=torch.bool),
    )


def controller_fit(
    features: Float[Tensor, "*R N D"],
    actions: Int[Tensor, "*R N"],
    gains: Float[Tensor, "*R N"],
    weights: Float[Tensor, "*R N"],
    num_actions: int,
    *,
    delta: float = 0.05,
    ridge: float = 1e-4,
    iters: int = 20,
) -> Float[Tensor, "*R A D"]:
    r"""Weighted Huber regression per action by iteratively reweighted least squares, batched over actions.

    $$
    \beta_a = \arg\min_\beta \sum_{k: a_k = a}\omega_k\,\mathrm{Huber}_\delta(c_k^\top\beta - \Delta_k)
                  + \tfrac{\lambda}{2}\|\beta\|^2
    $$

    IRLS: weighted least squares, then ``iters`` rounds reweighting each trace by
    $\min(1, \delta/|e_k|)$. ``ridge`` $\lambda \ge 0$ keeps unseen actions at 0.
    Leading dimensions ``*R`` are independent runs, each with its own fit (a trace of weight 0
    takes no part).

    Returns:
        ``[*R, A, D]`` coefficients.

    Raises:
        ShapeError: ``features`` not a float ``[*R, N, D]``; ``actions`` not an integer ``[*R, N]``; ``gains``
            or ``weights`` not a float ``[*R, N]``.
        DomainError: ``num_actions < 1``, an action outside ``[0, num_actions)``, a negative weight,
            ``delta <= 0`` or ``ridge < 0``.
    """
    check_float("features", features)
    if features.ndim < 2:
        raise ShapeError(f"features: expected a [..., N, D] float tensor, got shape {list(features.shape)}")
    check_tensor("actions", actions)
    if actions.is_floating_point() or actions.dtype == torch.bool:
        raise ShapeError(f"actions: expected an integer dtype, got {actions.dtype}")
    if actions.shape != features.shape[:-1]:
        raise ShapeError(
            f"actions: expected shape {list(features.shape[:-1])} (rows of features), got {list(actions.shape)}"
        )
    check_float("gains", gains)
    check_float("weights", weights)
    check_same_shape("actions", actions, gains=gains, weights=weights)
    if int(num_actions) < 1:
        raise DomainError(f"num_actions: expected an integer >= 1, got {num_actions!r}")
    if actions.numel() and (int(actions.min()) < 0 or int(actions.max()) >= int(num_actions)):
        raise DomainError(f"actions: expected values in [0, num_actions={int(num_actions)}), got {actions.tolist()}")
    if weights.numel() and float(weights.min()) < 0:
        raise DomainError("weights: expected non-negative recency weights")
    check_positive("delta", delta)
    check_positive("ridge", ridge, strict=False)
    a, d, runs = int(num_actions), features.shape[-1], features.shape[:-2]
    r = math.prod(runs)
    x = features.reshape(-1, d)  # [R*N, D]: runs flattened, run k's action j is model k*A + j
    act = (actions.reshape(r, -1) + a * torch.arange(r).unsqueeze(-1)).reshape(-1)
    y = gains.reshape(-1).to(features.dtype)
    outer = (x.unsqueeze(-1) * x.unsqueeze(-2)).reshape(-1, d * d)  # [R*N, D*D]
    fy = x * y.unsqueeze(-1)  # [R*N, D]
    eye = torch.eye(d, dtype=features.dtype) * (ridge + 1e-12)
    robust = torch.ones_like(y)
    omega = weights.reshape(-1).to(features.dtype)
    coef = torch.zeros(r * a, d, dtype=features.dtype)
    for _ in range(int(iters) + 1):
        w = (omega * robust).unsqueeze(-1)
        xtwx = torch.zeros(r * a, d * d, dtype=features.dtype).index_add_(0, act, w * outer).reshape(r * a, d, d) + eye
        xtwy = torch.zeros(r * a, d, dtype=features.dtype).index_add_(0, act, w * fy)
        coef, info = torch.linalg.solve_ex(xtwx, xtwy)  # deterministic per system, whatever the batch
        if bool((info != 0).any()):  # singular (ridge 0, an action never tried): least squares on those only
            bad = info != 0
            coef[bad] = torch.linalg.lstsq(xtwx[bad], xtwy[bad].unsqueeze(-1)).solution.squeeze(-1)
        resid = (x * coef[act]).sum(-1) - y  # each trace against its own action's model
        robust = (delta / resid.abs().clamp(min=1e-12)).clamp(max=1.0)
    return coef.reshape(*runs, a, d)


def controller_update(
    state: ControllerState,
    features: Float[Tensor, "*R M D"],
    actions: Int[Tensor, "*R M"],
    gains: Float[Tensor, "*R M"],
    step: int,
    *,
    valid: Bool[Tensor, "*R M"] | None = None,
    window: int = 2000,
    gamma: float = 0.99,
    delta: float = 0.05,
    ridge: float = 1e-4,
    iters: int = 20,
) -> ControllerState:
    r"""Append step ``step``'s traces, keep the last ``window``, refit on recency-weighted Huber loss.

    $$
    \mathcal L(\phi) = \sum_{k\in\mathcal W_t}\omega_k\,\mathrm{Huber}_\delta\big(f_\phi(c_k, a_k) - \Delta_k\big)
    $$

    Args:
        state: current `ControllerState`. features: ``[*R, M, D]``. actions: ``[*R, M]`` in [0, A).
        gains: ``[*R, M]`` realised gains. step: the traces' step (weights use age ``step - t_k``).
        valid: optional ``[*R, M]`` boolean, which of the new traces exist (runs may add different numbers).
        window, gamma, delta, ridge, iters: W (per run: its last W traces), $\gamma$, Huber
            $\delta$, ridge, IRLS rounds.

    Returns:
        The new state (its ``coef`` predicts for step ``step + 1``).
    """
    check_float("features", features)
    runs = state.coef.shape[:-2]
    if features.ndim != len(runs) + 2 or features.shape[:-2] != runs or features.shape[-1] != state.features.shape[-1]:
        raise ShapeError(
            f"features: expected shape [{', '.join(map(str, runs))}{', ' if runs else ''}M, "
            f"{state.features.shape[-1]}], got {list(features.shape)}"
        )
    m = features.shape[-2]
    if actions.shape != features.shape[:-1] or gains.shape != features.shape[:-1]:
        raise ShapeError(
            f"actions/gains: expected shape {list(features.shape[:-1])}, got {list(actions.shape)} and {list(gains.shape)}"
        )
    new_valid = torch.ones(features.shape[:-1], dtype=torch.bool) if valid is None else valid
    check_mask("valid", new_valid, tuple(features.shape[:-1]))
    w = int(check_positive("window", window))
    old_valid = torch.ones(state.actions.shape, dtype=torch.bool) if state.valid is None else state.valid
    f = torch.cat([state.features, features.to(state.features.dtype)], dim=-2)
    a = torch.cat([state.actions, actions.long()], dim=-1)
    g = torch.cat([state.gains, gains.to(state.gains.dtype)], dim=-1)
    s = torch.cat([state.steps.expand(*runs, -1), torch.full((*runs, m), int(step), dtype=torch.long)], dim=-1)
    mask = torch.cat([old_valid, new_valid], dim=-1)
    if s.shape[-1] == 0:
        return state
    if s.shape[-1] > w:  # each run keeps its own last W traces, in order (the length never depends on other runs)
        idx = torch.sort(mask.to(torch.int8), dim=-1, stable=True).indices[..., -w:]
        f = f.gather(-2, idx.unsqueeze(-1).expand(*idx.shape, f.shape[-1]))
        a, g, s, mask = a.gather(-1, idx), g.gather(-1, idx), s.gather(-1, idx), mask.gather(-1, idx)
    if not runs:
        s = s.reshape(-1)
    omega = recency_weights(s, int(step), gamma=gamma, mask=mask).to(f.dtype)
    coef = controller_fit(f, a, g, omega, state.coef.shape[-2], delta=delta, ridge=ridge, iters=iters)
    return ControllerState(coef, f, a, g, s, mask)


def controller_predict(state: ControllerState, features: Float[Tensor, "*R *S D"]) -> Float[Tensor, "*R *S A"]:
    """Predicted gain of every action at every context: ``features @ coef.T``, run by run over ``*R``."""
    check_float("features", features)
    runs = state.coef.shape[:-2]
    if features.shape[: len(runs)] != runs:
        raise ShapeError(f"features: expected leading run shape {list(runs)}, got {list(features.shape)}")
    flat = features.to(state.coef.dtype).reshape(*runs, -1, features.shape[-1])
    pred = flat @ state.coef.transpose(-1, -2)
    return pred.reshape(*features.shape[:-1], state.coef.shape[-2])


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


Generators = torch.Generator | Sequence[torch.Generator]
"""One generator, or one per run (the leading dimension of the planners' inputs)."""


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
