r"""The RAIL controller: one linear gain predictor per intervention action, refitted online.

`ControllerState` with `controller_init` / `controller_fit` / `controller_update` /
`controller_predict`: refitted at every step on a sliding window of traces with recency weights
$\gamma^{t - t_k}$ (`recency_weights`) and a Huber loss (`huber`, IRLS). Optional leading batch
dimensions ``*R`` give every run its own coefficients and window. The decision rule that uses the
predictions is `posttrain.estimators.selection.interventions.plan_interventions`.

Reference: Zhang et al. 2026, arXiv:2608.05080; every formula here is *reconstructed* from
descriptions of the paper (docs: methods/rail.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.shapes import Bool, Float, Int
from posttrain.validate import check_float, check_mask, check_positive, check_same_shape, check_tensor

__all__ = [
    "ControllerState",
    "controller_fit",
    "controller_init",
    "controller_predict",
    "controller_update",
    "huber",
    "recency_weights",
]


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
