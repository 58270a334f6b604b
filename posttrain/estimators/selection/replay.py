"""Headroom-Drift Replay (HDR): a FIFO buffer of GRPO groups, ranked by headroom, gated by policy drift.

The buffer is an explicit, immutable `ReplayBuffer` (a NamedTuple of tensors, oldest group
first); `replay_add` (ingress + FIFO eviction) and `replay_select` (rank, gate, refresh)
return new buffers and never touch a random generator, so the fresh on-policy stream of a trainer
is unchanged by replay. The scores `headroom` and `policy_drift` are pure functions.

Shapes: a buffer of C groups, K responses each, T token positions: ``[C, K, T]`` token tensors,
``[C, K]`` rewards/advantages, ``[C]`` per-group scalars. The four rules of the paper's comparison
(HDR, naive recency replay, headroom-only, drift-only) are `ReplayRule` values registered in
``registry("replay")``.

Reference: Park & Chang 2026, "Headroom-Drift Replay: A Primitive for Principled Replay Control in
GRPO", arXiv:2609.03941 (Sec. 3, Algorithm 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

import torch
from torch import Tensor

from posttrain.errors import ShapeError
from posttrain.estimators.aggregation import masked_mean
from posttrain.registry import registry
from posttrain.shapes import Bool, Float, Int
from posttrain.validate import (
    check_choice,
    check_float,
    check_mask,
    check_nonempty_mask,
    check_positive,
    check_same_shape,
    check_tensor,
)

__all__ = [
    "REPLAY_RULES",
    "ReplayBuffer",
    "ReplayOrder",
    "ReplayRule",
    "ReplaySelection",
    "headroom",
    "mixed_outcome",
    "policy_drift",
    "replay_add",
    "replay_init",
    "replay_rule",
    "replay_select",
    "replay_take",
]

PAPER = "Park & Chang 2026, Headroom-Drift Replay, arXiv:2609.03941"


def _pooled_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean over the last two axes (responses x tokens) of the valid entries; 0 if none."""
    flat = values.flatten(start_dim=-2)
    return masked_mean(flat, mask.flatten(start_dim=-2), dim=-1)


def _check_group_tokens(name: str, x: Tensor, mask: Tensor) -> None:
    check_float(name, x)
    if x.ndim < 2:
        raise ShapeError(f"{name}: expected shape [..., K, T], got {list(x.shape)}")
    check_mask("mask", mask, x.shape)
    if mask.numel():  # an empty buffer is valid; a non-empty one without a token is not
        check_nonempty_mask("mask", mask)


def headroom(
    logp: Float[Tensor, "*G K T"], advantages: Float[Tensor, "*G K"], mask: Bool[Tensor, "*G K T"]
) -> Float[Tensor, " *G"]:
    r"""Headroom of a group under a policy: how much directional correction its tokens still admit.

    $$
    h_{ij} = \begin{cases}1-\pi(a_{ij}|s_{ij}) & A_i > 0\\ \pi(a_{ij}|s_{ij}) & A_i < 0\\ 0 & A_i = 0\end{cases},
    \qquad \mathrm{Headroom}(g;\pi) = \frac{1}{|\mathcal T(g)|}\sum_{(i,j)\in\mathcal T(g)} h_{ij} \in [0, 1]
    $$

    pooled over all valid tokens of the group (longer responses weigh more). A group without
    valid tokens gets 0.

    Args:
        logp: ``[..., K, T]`` log-probs $\log\pi(a_{ij}|s_{ij})$ of the stored tokens.
        advantages: ``[..., K]`` stored per-response advantages (only their signs matter).
        mask: ``[..., K, T]`` boolean valid-token mask.

    Returns:
        ``[...]`` headroom per group.

    Examples:
        >>> lp = torch.log(torch.tensor([[0.25, 0.5], [0.5, 0.5]]))
        >>> m = torch.tensor([[True, True], [True, False]])
        >>> float(headroom(lp, torch.tensor([1.0, -1.0]), m))  # (0.75 + 0.5 + 0.5) / 3
        0.5833333134651184
    """
    _check_group_tokens("logp", logp, mask)
    check_float("advantages", advantages)
    if advantages.shape != logp.shape[:-1]:
        raise ShapeError(f"advantages: expected shape {list(logp.shape[:-1])}, got {list(advantages.shape)}")
    p = logp.detach().exp()
    sign = torch.sign(advantages.detach()).unsqueeze(-1)
    h = torch.where(sign > 0, 1.0 - p, torch.where(sign < 0, p, torch.zeros_like(p)))
    return _pooled_mean(h, mask)


def policy_drift(
    logp: Float[Tensor, "*G K T"], logp_gen: Float[Tensor, "*G K T"], mask: Bool[Tensor, "*G K T"]
) -> Float[Tensor, " *G"]:
    r"""Policy drift of a stored group: mean squared log-prob change over its valid tokens.

    $$
    \mathrm{Drift}(g;\theta_t) = \frac{1}{|\mathcal T(g)|}\sum_{(i,j)\in\mathcal T(g)}
                  \big(\log\pi_{\theta_t}(a_{ij}|s_{ij}) - \ell^{gen}_{ij}\big)^2 \ \ge 0
    $$

    Proposition 2 of the paper: $|H_t(g) - H_{ref}(g)| \le \sqrt{\mathrm{Drift}(g;\theta_t)}$.

    Args:
        logp: ``[..., K, T]`` current log-probs of the stored tokens.
        logp_gen: ``[..., K, T]`` log-probs under the generating policy (trainer numerics).
        mask: ``[..., K, T]`` boolean valid-token mask.

    Returns:
        ``[...]`` drift per group.

    Examples:
        >>> d = policy_drift(torch.tensor([[0.1, -0.3]]), torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool))
        >>> round(float(d), 6)
        0.05
    """
    _check_group_tokens("logp", logp, mask)
    check_float("logp_gen", logp_gen)
    check_same_shape("logp", logp, logp_gen=logp_gen)
    return _pooled_mean((logp.detach() - logp_gen.detach()) ** 2, mask)


def mixed_outcome(rewards: Float[Tensor, "G K"], *, success_threshold: float | None = None) -> Bool[Tensor, " G"]:
    r"""Ingress rule: a group is a replay candidate iff it has at least one success and one failure.

    Success is $r_i > 0$ (single reward) or $r_i \ge$ ``success_threshold`` (multi-reward
    settings, the paper uses 0.9 for an answer-based indicator).

    Examples:
        >>> mixed_outcome(torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.95, 0.5]]), success_threshold=0.9).tolist()
        [True, False, True]
    """
    check_float("rewards", rewards, ndim=2)
    success = rewards > 0 if success_threshold is None else rewards >= float(success_threshold)
    return success.any(dim=-1) & (~success).any(dim=-1)


class ReplayBuffer(NamedTuple):
    """FIFO buffer of stored groups, oldest first (row c is older than row c + 1)."""

    tokens: Tensor
    """``[C, K, T]`` int64 response tokens (or actions)."""
    mask: Tensor
    """``[C, K, T]`` boolean valid-token mask."""
    rewards: Tensor
    """``[C, K]`` rewards."""
    advantages: Tensor
    """``[C, K]`` advantages computed at generation (stored, never recomputed)."""
    logp_gen: Tensor
    """``[C, K, T]`` log-probs of the generating policy."""
    prompt: Tensor
    """``[C]`` int64 prompt index."""
    h_ref: Tensor
    """``[C]`` headroom at generation (immutable)."""
    h_cache: Tensor
    """``[C]`` ranking key, refreshed whenever a group is scanned."""
    t_gen: Tensor
    """``[C]`` int64 step of generation."""

    @property
    def size(self) -> int:
        return int(self.h_ref.shape[0])


def replay_init(num_samples: int, length: int, *, dtype: torch.dtype = torch.float32) -> ReplayBuffer:
    """An empty buffer for groups of ``num_samples`` responses of ``length`` tokens."""
    k, t = int(num_samples), int(length)
    f = torch.zeros((0, k), dtype=dtype)
    ft = torch.zeros((0, k, t), dtype=dtype)
    i = torch.zeros((0,), dtype=torch.long)
    return ReplayBuffer(
        torch.zeros((0, k, t), dtype=torch.long), torch.zeros((0, k, t), dtype=torch.bool), f, f, ft, i,
        torch.zeros((0,), dtype=dtype), torch.zeros((0,), dtype=dtype), i,
    )  # fmt: skip


def replay_take(buffer: ReplayBuffer, index: Int[Tensor, " R"] | Bool[Tensor, " C"]) -> ReplayBuffer:
    """The groups at ``index`` (integer positions or a boolean row mask), as a buffer of the same layout."""
    return ReplayBuffer(*(field[index] for field in buffer))


def replay_add(
    buffer: ReplayBuffer,
    *,
    tokens: Int[Tensor, "G K T"],
    mask: Bool[Tensor, "G K T"],
    rewards: Float[Tensor, "G K"],
    advantages: Float[Tensor, "G K"],
    logp_gen: Float[Tensor, "G K T"],
    prompt: Int[Tensor, " G"],
    step: int,
    capacity: int,
    success_threshold: float | None = None,
) -> ReplayBuffer:
    r"""Ingress (phase E): append the step's mixed-outcome groups, then evict the oldest beyond ``capacity``.

    Groups with all-equal outcomes or without valid tokens never enter. $H_{ref} = H_{cache}
    = \mathrm{Headroom}(g; \pi_{gen})$. Call after the step's update (no same-step replay).

    Args:
        buffer: the current buffer. tokens, mask, rewards, advantages, logp_gen, prompt: the fresh
            groups (``[G, K, T]``, ``[G, K]``, ``[G]``). step: the generation step. capacity: C > 0.
        success_threshold: see `mixed_outcome`.

    Returns:
        The new buffer (at most ``capacity`` groups, oldest first).
    """
    cap = int(check_positive("capacity", capacity))
    check_tensor("tokens", tokens, ndim=3)
    check_mask("mask", mask, tokens.shape)
    check_float("logp_gen", logp_gen, ndim=3)
    check_same_shape("tokens", tokens, logp_gen=logp_gen)
    check_float("rewards", rewards, ndim=2)
    check_same_shape("rewards", rewards, advantages=advantages)
    if rewards.shape != tokens.shape[:2] or prompt.shape != tokens.shape[:1]:
        raise ShapeError(
            f"rewards/prompt: expected shapes {list(tokens.shape[:2])} and {list(tokens.shape[:1])}, "
            f"got {list(rewards.shape)} and {list(prompt.shape)}"
        )
    if tokens.shape[1:] != buffer.tokens.shape[1:]:
        raise ShapeError(
            f"tokens: expected groups of shape {list(buffer.tokens.shape[1:])}, got {list(tokens.shape[1:])}"
        )
    keep = mixed_outcome(rewards, success_threshold=success_threshold) & mask.flatten(1).any(dim=-1)
    h = headroom(logp_gen, advantages, mask)
    rows = keep.nonzero().squeeze(-1)  # the entering groups, in order
    start = max(buffer.size + int(rows.numel()) - cap, 0)  # FIFO eviction: drop the oldest `start` rows
    if rows.numel() == 0:  # nothing enters (the common case of an all-equal batch): no copy
        return buffer if start == 0 else replay_take(buffer, slice(start, None))  # type: ignore[arg-type]
    fresh = ReplayBuffer(
        tokens[rows], mask[rows], rewards[rows].to(buffer.rewards.dtype), advantages[rows].to(buffer.advantages.dtype),
        logp_gen.detach()[rows].to(buffer.logp_gen.dtype), prompt[rows].long(), h[rows].to(buffer.h_ref.dtype),
        h[rows].to(buffer.h_cache.dtype), torch.full((rows.numel(),), int(step), dtype=torch.long),
    )  # fmt: skip
    merged = ReplayBuffer(*(torch.cat([old, new]) for old, new in zip(buffer, fresh, strict=True)))
    return merged if start == 0 else replay_take(merged, slice(start, None))  # type: ignore[arg-type]


class ReplayOrder(str, Enum):
    """The scan order of `replay_select`."""

    HEADROOM = "headroom"
    """Cached headroom, highest first (HDR phase B)."""
    RECENCY = "recency"
    """Newest first (naive replay)."""


@dataclass(frozen=True)
class ReplayRule:
    """A replay rule: scan order and whether the drift gate applies."""

    order: ReplayOrder
    gated: bool

    def threshold(self, tau: float) -> float:
        """The drift threshold this rule uses (``inf`` when ungated)."""
        return float(tau) if self.gated else math.inf


REPLAY_RULES = registry("replay")
for _name, _rule, _summary in (
    ("hdr", ReplayRule(ReplayOrder.HEADROOM, True), "Headroom-Drift Replay: headroom order, drift gate"),
    ("naive_recency", ReplayRule(ReplayOrder.RECENCY, False), "Naive replay of the most recent groups"),
    ("headroom_only", ReplayRule(ReplayOrder.HEADROOM, False), "Headroom ranking without the drift gate"),
    ("drift_only", ReplayRule(ReplayOrder.RECENCY, True), "Recency order with the drift gate"),
):
    REPLAY_RULES.add(_name, _rule, paper=PAPER, summary=_summary)


def replay_rule(name: str) -> ReplayRule:
    """The `ReplayRule` registered as ``name``: hdr, naive_recency, headroom_only or drift_only."""
    rule = REPLAY_RULES.get(name)
    if not isinstance(rule, ReplayRule):
        raise TypeError(f"replay registry entry {name!r} is not a ReplayRule")
    return rule


class ReplaySelection(NamedTuple):
    """Outcome of one scan; ``[C]`` tensors are indexed like the buffer."""

    rows: Tensor
    """``[R]`` buffer rows admitted, in scan order (R <= k_rep)."""
    drift: Tensor
    """``[C]`` drift of every group under the current policy."""
    runtime_headroom: Tensor
    """``[C]`` headroom of every group under the current policy."""
    scanned: Tensor
    """``[C]`` boolean: the scan evaluated this group (its cache was refreshed)."""
    admitted: Tensor
    """``[C]`` boolean: admitted to this step's update."""


def replay_select(
    buffer: ReplayBuffer,
    logp: Float[Tensor, "C K T"],
    *,
    k_rep: int,
    tau: float,
    order: ReplayOrder | str = ReplayOrder.HEADROOM,
    step: int | None = None,
) -> tuple[ReplaySelection, ReplayBuffer]:
    r"""Rank, gate and refresh (phases B-C): admit up to ``k_rep`` groups with drift at most ``tau``.

    Groups are visited in ``order`` (cached headroom descending, or newest first); each visited
    group has its drift and runtime headroom computed from ``logp`` (one teacher-forced pass) and
    its ``h_cache`` refreshed; it is admitted iff $\mathrm{Drift} \le \tau$; the scan stops
    after the ``k_rep``-th admission. Vectorised: the visited prefix is where the count of earlier
    admissions is below ``k_rep``. ``tau = inf`` disables the gate. Groups with
    ``t_gen >= step`` are never admitted. Uses no randomness.

    Args:
        buffer: the buffer. logp: ``[C, K, T]`` current log-probs of every stored token.
        k_rep: replay budget K_rep >= 0. tau: drift threshold >= 0 (``math.inf`` allowed).
        order: a `ReplayOrder`. step: the current step, or None.

    Returns:
        ``(ReplaySelection, new buffer with refreshed h_cache)``.

    Examples:
        >>> buf = replay_init(2, 1)
        >>> buf = replay_add(buf, tokens=torch.zeros(3, 2, 1, dtype=torch.long),
        ...     mask=torch.ones(3, 2, 1, dtype=torch.bool), rewards=torch.tensor([[1., 0.]] * 3),
        ...     advantages=torch.tensor([[1., -1.]] * 3),
        ...     logp_gen=torch.log(torch.tensor([[[0.5], [0.5]], [[0.1], [0.9]], [[0.9], [0.1]]])),
        ...     prompt=torch.arange(3), step=0, capacity=4)
        >>> sel, buf = replay_select(buf, buf.logp_gen, k_rep=2, tau=1e-3, step=1)
        >>> sel.rows.tolist(), sel.scanned.tolist()
        ([1, 0], [True, True, False])
    """
    if k_rep < 0:
        raise ShapeError(f"k_rep: expected an integer >= 0, got {k_rep!r}")
    check_positive("tau", tau, strict=False)
    check_same_shape("buffer.logp_gen", buffer.logp_gen, logp=logp)
    rule_order = check_choice("order", order, ReplayOrder)
    drift = policy_drift(logp, buffer.logp_gen, buffer.mask)
    h_now = headroom(logp, buffer.advantages, buffer.mask)
    c = buffer.size
    if rule_order is ReplayOrder.HEADROOM:
        perm = torch.argsort(-buffer.h_cache, stable=True)
    else:
        perm = torch.arange(c - 1, -1, -1)
    eligible = drift <= tau
    if step is not None:
        eligible = eligible & (buffer.t_gen < int(step))
    ok = eligible[perm]
    before = torch.cumsum(ok.long(), dim=0) - ok.long()
    visited = before < int(k_rep)
    admitted_sorted = ok & visited
    scanned = torch.zeros(c, dtype=torch.bool)
    scanned[perm] = visited
    admitted = torch.zeros(c, dtype=torch.bool)
    admitted[perm] = admitted_sorted
    new_cache = torch.where(scanned, h_now.to(buffer.h_cache.dtype), buffer.h_cache)
    sel = ReplaySelection(perm[admitted_sorted], drift, h_now, scanned, admitted)
    return sel, buffer._replace(h_cache=new_cache)
