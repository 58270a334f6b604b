r"""Muon and AdamW as pure (init, update) pairs with explicit state, plus update-RMS measurement.

Both updates work on tensors with any leading batch dimensions (e.g. a leading seed axis
``[S, m, n]``), so toy runs can vectorise over seeds and learning rates. They return additive
updates $\Delta W$ (apply with ``W + ΔW``) and the new state; nothing is mutated.
`posttrain.llm.train.muon` wraps them as a ``torch.optim.Optimizer`` for real models.

References:
    K. Jordan et al. 2024, Muon: an optimizer for hidden layers (kellerjordan.github.io/posts/muon);
    Liu et al. 2025, Muon is scalable for LLM training (arXiv:2502.16982);
    Ruan et al. 2026, When does Muon help agentic RL? (arXiv:2607.16169);
    Loshchilov & Hutter 2019, AdamW (arXiv:1711.05101).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from enum import Enum
from typing import NamedTuple

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.registry import registry
from posttrain.shapes import Float
from posttrain.validate import check_float, check_in_range, check_positive

__all__ = [
    "NS_COEFFICIENTS",
    "AdamWState",
    "MuonScale",
    "MuonState",
    "adamw_init",
    "adamw_steady_state_rms",
    "adamw_update",
    "group_update_rms",
    "muon_init",
    "muon_scale",
    "muon_update",
    "newton_schulz5",
    "route_muon_parameters",
    "update_rms",
]

OPTIMIZERS = registry("optimizer")

NS_COEFFICIENTS: tuple[float, float, float] = (3.4445, -4.7750, 2.0315)
"""Quintic Newton-Schulz coefficients (a, b, c) that maximise the slope at 0 (Jordan 2024)."""


class MuonScale(str, Enum):
    """Shape scale $s(m, n)$ of the orthogonalised step (torch's ``adjust_lr_fn``)."""

    ORIGINAL = "original"
    """Fan-in: $\\sqrt{\\max(1, m/n)}$; update RMS $\\eta/\\sqrt{n}$ (Jordan; the paper)."""
    MATCH_RMS_ADAMW = "match_rms_adamw"
    """Moonlight: $0.2\\sqrt{\\max(m, n)}$; update RMS $0.2\\eta$."""
    NONE = "none"
    """No scaling."""


def muon_scale(m: int, n: int, mode: MuonScale | str = MuonScale.ORIGINAL) -> float:
    r"""The shape scale $s(m, n)$ for a ``d_out x d_in = m x n`` matrix.

    Examples:
        >>> muon_scale(128, 32), muon_scale(32, 128), round(muon_scale(32, 128, "match_rms_adamw"), 4)
        (2.0, 1.0, 2.2627)
    """
    try:
        mode = MuonScale(mode)
    except ValueError:
        raise DomainError(f"scale: unknown Muon scale {mode!r}; valid: {[s.value for s in MuonScale]}") from None
    if mode is MuonScale.ORIGINAL:
        return math.sqrt(max(1.0, m / n))
    if mode is MuonScale.MATCH_RMS_ADAMW:
        return 0.2 * math.sqrt(max(m, n))
    return 1.0


def newton_schulz5(
    g: Float[Tensor, "... m n"],
    *,
    steps: int = 5,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = 1e-7,
    compute_dtype: torch.dtype | None = None,
) -> Float[Tensor, "... m n"]:
    r"""Approximate orthogonalisation $O \approx PQ^\top$ of $G = P\Sigma Q^\top$ by the quintic Newton-Schulz iteration.

    $$
    X_0 = G/(\|G\|_F + \epsilon),\qquad A = XX^\top,\quad X \leftarrow aX + (bA + cA^2)X
    $$

    applied ``steps`` times on the wide orientation (transposed when ``m > n``). On singular values
    this is $\varphi^{\circ k}(\sigma/\|G\|_F)$ with $\varphi(x) = ax + bx^3 + cx^5$;
    with the default coefficients, normalised singular values in ``[3e-3, 1]`` land in about
    ``[0.68, 1.20]`` (not exactly 1, by design). Singular vectors are preserved. ``G = 0`` gives 0.

    Args:
        g: ``[..., m, n]`` float matrix (leading dimensions are a batch).
        steps: number of iterations (5).
        coefficients: ``(a, b, c)``.
        eps: added to the Frobenius norm.
        compute_dtype: dtype of the iteration; ``None`` keeps ``g``'s dtype (the paper and torch
            use ``torch.bfloat16``).

    Returns:
        ``[..., m, n]`` in ``g``'s dtype.
    """
    check_float("g", g)
    if g.ndim < 2:
        raise ShapeError(f"g: expected a matrix [..., m, n], got shape {list(g.shape)}")
    if steps < 0:
        raise DomainError(f"steps: expected a non-negative integer, got {steps!r}")
    a, b, c = coefficients
    x = g.to(compute_dtype) if compute_dtype is not None else g
    wide = x.shape[-2] <= x.shape[-1]
    if not wide:
        x = x.mT
    x = x / (torch.linalg.matrix_norm(x, keepdim=True) + eps)
    lead = x.shape[:-2]
    x = x.reshape(-1, *x.shape[-2:])  # fused baddbmm: one rounding per step in low precision
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    x = x.reshape(*lead, *x.shape[-2:])
    if not wide:
        x = x.mT
    return x.to(g.dtype)


class MuonState(NamedTuple):
    """Muon's state: one momentum buffer per matrix."""

    momentum: tuple[Tensor, ...]


def muon_init(params: Sequence[Tensor]) -> MuonState:
    """Zero momentum buffers shaped like ``params`` (each ``[..., m, n]``)."""
    for i, p in enumerate(params):
        check_float(f"params[{i}]", p)
        if p.ndim < 2:
            raise ShapeError(f"params[{i}]: Muon takes matrices [..., m, n], got shape {list(p.shape)}")
    return MuonState(tuple(torch.zeros_like(p) for p in params))


def _lr_tensor(lr: float | Tensor, like: Tensor) -> float | Tensor:
    """A float, or a per-batch-member rate ``[...]`` broadcast over the matrix axes."""
    if isinstance(lr, Tensor):
        return lr.to(like.dtype).reshape(*lr.shape, *([1] * (like.ndim - lr.ndim)))
    return float(lr)


def muon_update(
    grads: Sequence[Tensor],
    state: MuonState,
    params: Sequence[Tensor],
    *,
    lr: float | Tensor,
    momentum: float = 0.95,
    nesterov: bool = True,
    weight_decay: float = 0.01,
    ns_steps: int = 5,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    eps: float = 1e-7,
    scale: MuonScale | str = MuonScale.ORIGINAL,
    compute_dtype: torch.dtype | None = torch.bfloat16,
) -> tuple[tuple[Tensor, ...], MuonState]:
    r"""One Muon step for hidden matrices: EMA momentum, Nesterov, Newton-Schulz, shape scale, decoupled weight decay.

    $$
    B_t = \mu B_{t-1} + (1-\mu) G_t,\quad U_t = (1-\mu)G_t + \mu B_t\ \text{(Nesterov) or } B_t,
    $$

    $$
    \Delta W_t = -\eta\lambda W_{t-1} - \eta\, s(m, n)\, \mathrm{NS}_5(U_t)
    $$

    Weight decay uses the unscaled $\eta$, the shape scale only the orthogonalised step (as
    torch and Jordan's code). The EMA momentum differs from the SGD form
    $B = \mu B + G$ by a factor the scale-invariant orthogonalisation removes.

    Args:
        grads, params: matching sequences of ``[..., m, n]`` tensors (leading dims are a batch).
        state: from `muon_init`.
        lr: $\eta$, a float or a tensor of the leading batch shape (one rate per member).
        momentum: $\mu \in [0, 1)$. nesterov: use the Nesterov input.
        weight_decay: $\lambda \ge 0$. ns_steps, coefficients, eps: of `newton_schulz5`.
        scale: `MuonScale` (default fan-in ``original``).
        compute_dtype: dtype of the Newton-Schulz iteration (bf16 as in the paper; ``None`` = input).

    Returns:
        ``(updates, new_state)`` with ``updates[i]`` shaped like ``params[i]``.
    """
    if not (len(grads) == len(params) == len(state.momentum)):
        raise ShapeError(
            f"grads: expected as many tensors as params ({len(params)}) and state buffers "
            f"({len(state.momentum)}), got {len(grads)}"
        )
    check_in_range("momentum", momentum, 0.0, 1.0)
    if momentum >= 1.0:
        raise DomainError(f"momentum: expected a value in [0, 1), got {momentum!r}")
    check_positive("weight_decay", weight_decay, strict=False)
    updates, buffers = [], []
    for i, (g, b, p) in enumerate(zip(grads, state.momentum, params, strict=True)):
        check_float(f"grads[{i}]", g)
        if g.shape != p.shape or b.shape != p.shape:
            raise ShapeError(
                f"grads[{i}]: expected shape {list(p.shape)} (the shape of params[{i}]), got {list(g.shape)}"
            )
        buf = torch.lerp(b, g, 1.0 - momentum)
        u = torch.lerp(g, buf, momentum) if nesterov else buf
        o = newton_schulz5(u, steps=ns_steps, coefficients=coefficients, eps=eps, compute_dtype=compute_dtype)
        eta = _lr_tensor(lr, p)
        updates.append(-eta * weight_decay * p - eta * muon_scale(p.shape[-2], p.shape[-1], scale) * o)
        buffers.append(buf)
    return tuple(updates), MuonState(tuple(buffers))


class AdamWState(NamedTuple):
    """AdamW's state: first and second moments and the step count."""

    mu: tuple[Tensor, ...]
    nu: tuple[Tensor, ...]
    step: int


def adamw_init(params: Sequence[Tensor]) -> AdamWState:
    """Zero moments shaped like ``params``."""
    for i, p in enumerate(params):
        check_float(f"params[{i}]", p)
    return AdamWState(tuple(torch.zeros_like(p) for p in params), tuple(torch.zeros_like(p) for p in params), 0)


def adamw_update(
    grads: Sequence[Tensor],
    state: AdamWState,
    params: Sequence[Tensor],
    *,
    lr: float | Tensor,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.01,
) -> tuple[tuple[Tensor, ...], AdamWState]:
    r"""One AdamW step (decoupled weight decay, bias-corrected moments), as ``torch.optim.AdamW``.

    $$
    m_t = \beta_1 m + (1-\beta_1) g,\ v_t = \beta_2 v + (1-\beta_2) g^2,\quad
    \Delta W = -\eta\lambda W - \eta\,\frac{m_t/(1-\beta_1^t)}{\sqrt{v_t/(1-\beta_2^t)} + \epsilon}
    $$

    ``lr`` may be a tensor of the leading batch shape (one rate per batch member).
    """
    if not (len(grads) == len(params) == len(state.mu)):
        raise ShapeError(f"grads: expected {len(params)} tensors (one per param), got {len(grads)}")
    b1, b2 = betas
    check_in_range("betas[0]", b1, 0.0, 1.0)
    check_in_range("betas[1]", b2, 0.0, 1.0)
    check_positive("eps", eps)
    t = state.step + 1
    c1, c2 = 1.0 - b1**t, 1.0 - b2**t
    updates, mus, nus = [], [], []
    for i, (g, m, v, p) in enumerate(zip(grads, state.mu, state.nu, params, strict=True)):
        if g.shape != p.shape:
            raise ShapeError(
                f"grads[{i}]: expected shape {list(p.shape)} (the shape of params[{i}]), got {list(g.shape)}"
            )
        m = torch.lerp(m, g, 1.0 - b1)
        v = torch.lerp(v, g * g, 1.0 - b2)
        eta = _lr_tensor(lr, p)
        updates.append(-eta * weight_decay * p - eta * (m / c1) / ((v / c2).sqrt() + eps))
        mus.append(m)
        nus.append(v)
    return tuple(updates), AdamWState(tuple(mus), tuple(nus), t)


OPTIMIZERS.add("muon", muon_update, paper="Jordan et al. 2024; Ruan et al. 2026, arXiv:2607.16169")
OPTIMIZERS.add("adamw", adamw_update, paper="Loshchilov & Hutter 2019, arXiv:1711.05101")


def adamw_steady_state_rms(beta1: float = 0.9) -> float:
    r"""Steady-state RMS of AdamW's normalised step for i.i.d. zero-mean gradients: $\sqrt{(1-\beta_1)/(1+\beta_1)}$.

    Examples:
        >>> round(adamw_steady_state_rms(0.9), 4)
        0.2294
    """
    check_in_range("beta1", beta1, 0.0, 1.0, closed=False)
    return math.sqrt((1.0 - beta1) / (1.0 + beta1))


def update_rms(delta: Float[Tensor, "... m n"]) -> Float[Tensor, ...]:
    r"""Per-matrix update RMS $\|\Delta W\|_F / \sqrt{mn}$ over the last two axes."""
    check_float("delta", delta)
    if delta.ndim < 2:
        raise ShapeError(f"delta: expected a matrix [..., m, n], got shape {list(delta.shape)}")
    return torch.linalg.matrix_norm(delta) / math.sqrt(delta.shape[-1] * delta.shape[-2])


def group_update_rms(deltas: Sequence[Tensor]) -> Tensor:
    r"""Parameter-count-weighted quadratic mean over matrices: $\sqrt{\sum_\ell \|\Delta W_\ell\|_F^2 / \sum_\ell m_\ell n_\ell}$.

    Leading batch dimensions (e.g. seeds) are kept.
    """
    if not deltas:
        raise ShapeError("deltas: expected at least one matrix")
    total = sum(torch.linalg.matrix_norm(d) ** 2 for d in deltas)
    count = sum(d.shape[-1] * d.shape[-2] for d in deltas)
    return torch.sqrt(torch.as_tensor(total) / count)


DEFAULT_MUON_INCLUDE = (r"\.(q|k|v|o)_proj\.weight$", r"\.(gate|up|down)_proj\.weight$")
DEFAULT_MUON_EXCLUDE = (r"embed_tokens", r"lm_head")


def route_muon_parameters(
    named_parameters: Iterable[tuple[str, Tensor]],
    *,
    include: Sequence[str] = DEFAULT_MUON_INCLUDE,
    exclude: Sequence[str] = DEFAULT_MUON_EXCLUDE,
) -> tuple[list[str], list[str]]:
    """Split trainable parameter names into (Muon, AdamW) groups (docs: methods/muon.md).

    A parameter goes to Muon only if it is 2-D, matches an ``include`` regex and no ``exclude``
    regex; every other trainable parameter (embeddings, head, norms, biases) goes to AdamW. Every
    trainable parameter lands in exactly one group; no 1-D tensor ever reaches Muon.
    """
    muon: list[str] = []
    adamw: list[str] = []
    for name, p in named_parameters:
        if not p.requires_grad:
            continue
        hidden = (
            p.ndim == 2 and any(re.search(r, name) for r in include) and not any(re.search(r, name) for r in exclude)
        )
        (muon if hidden else adamw).append(name)
    return muon, adamw
