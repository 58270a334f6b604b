r"""Student-teacher toys on tabular autoregressive policies (docs: methods/opd_then_rl.md, methods/opd2.md).

Builds on `posttrain.simulators.tabular` (sampling, log-probs, enumeration). What it adds:

- `node_log_probs`: the full next-token distribution ``[*seeds, G, K, T, V]`` of any table at
  the prefixes of sampled tokens (teacher and teacher-base expectations, exact top-K = V);
- `exact_success`: exact p@1 from the (distinct) correct sequences of each prompt;
- `stack_methods`: several methods trained side by side in one batched run;
- `train_with_teacher`: an on-policy loop (sample, score, per-token loss, per-seed token-mean,
  Adam) whose method is one callable ``loss_fn(TeacherStep) -> [B, T]``. The loop never looks at
  what the method is; the method decides itself whether it needs a teacher forward at a step.

Seeds are a leading axis of every tensor (``[S, G, ...]``); environments may differ per seed
(docs: methods/opd_then_rl.md: environment seed = training seed). Each seed's loss is its own token mean, so with an
elementwise optimiser (Adam) the seeds are independent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.errors import ShapeError
from posttrain.estimators import masked_mean, zero_off_mask
from posttrain.simulators._base import SeedRNG
from posttrain.simulators.tabular import TabularSpec, sample_sequences, visited_logit_rows, visited_rows

__all__ = [
    "TeacherStep",
    "TrainResult",
    "exact_success",
    "fixed_token_logp",
    "match_reward",
    "node_log_probs",
    "split_step",
    "stack_methods",
    "train_methods",
    "train_with_teacher",
    "visited_token_logp",
]


@dataclass(frozen=True)
class TeacherStep:
    """What a method sees at one step; rows are ``B = S * G * K`` (seed, prompt, sample) row-major."""

    step: int
    """1-based step counter."""
    rewards: Tensor
    """``[S * G, K]`` rewards."""
    logp: Tensor
    """``[B, T]`` student log-probs of the sampled tokens (with gradient)."""
    logp_old: Tensor
    """``[B, T]`` the same, detached (rollout-time policy; one update per batch)."""
    mask: Tensor
    """``[B, T]`` response mask."""
    tokens: Tensor
    """``[S, G, K, T]`` sampled tokens."""
    theta: Tensor
    """``[S, G, N, V]`` student logits (with gradient)."""
    history: Tensor
    """``[step, S]`` the tracked validation score after steps 0 .. step-1 (row 0: initial policy)."""


@dataclass(frozen=True)
class TrainResult:
    theta: Tensor
    """``[S, G, N, V]`` final logits (detached)."""
    curve: Tensor
    """``[steps + 1, S]`` tracked score after each step (row 0: before training)."""


def _rows_token_logp(spec: TabularSpec, rows: Tensor, tokens: Tensor) -> Tensor:
    """``[*seeds, G, K, T]`` log-prob of each token from its prefix's logit row ``rows [*seeds * G * K * T, V]``."""
    logp = torch.log_softmax(rows, dim=-1).gather(-1, tokens.reshape(-1, 1)).reshape(tokens.shape)
    return zero_off_mask(logp, spec.response_mask(tokens))


def node_log_probs(spec: TabularSpec, table: Tensor, tokens: Tensor) -> Tensor:
    """``[*seeds, G, K, T, V]`` log-softmax of ``table [*seeds, G, N, V]`` at every prefix of ``tokens``.

    Copies the visited rows first and normalises only those (differentiable; far cheaper than
    normalising the whole table when few nodes are visited).
    """
    return torch.log_softmax(visited_logit_rows(spec, table, tokens), dim=-1).reshape(*tokens.shape, spec.vocab)


def visited_token_logp(spec: TabularSpec, table: Tensor, tokens: Tensor) -> Tensor:
    """``[*seeds, G, K, T]`` log-prob of each token given its prefix (differentiable), 0 off the response mask.

    Same values as `posttrain.simulators.tabular.token_logp`, from the visited rows only (as `node_log_probs`).
    """
    return _rows_token_logp(spec, visited_logit_rows(spec, table, tokens), tokens)


def fixed_token_logp(spec: TabularSpec, table: Tensor) -> Callable[[Tensor], Tensor]:
    """`visited_token_logp` for a table that never changes (a teacher): normalised once, then one gather per call.

    ``tokens [*seeds, G, K, T] -> [*seeds, G, K, T]`` with the same values as
    ``visited_token_logp(spec, table, tokens)`` (log-softmax is row-wise), no gradient.
    """
    log_probs = torch.log_softmax(table.detach(), dim=-1).flatten(-2)  # [*seeds, G, N * V]

    def token_logp(tokens: Tensor) -> Tensor:
        if tokens.ndim != table.ndim:
            raise ShapeError(f"tokens: expected rank {table.ndim} ([*seeds, G, K, T]), got {list(tokens.shape)}")
        edges = (spec.prefix_nodes(tokens) * spec.vocab + tokens).reshape(*log_probs.shape[:-1], -1)
        logp = log_probs.gather(-1, edges).reshape(tokens.shape)
        return zero_off_mask(logp, spec.response_mask(tokens))

    return token_logp


def exact_success(spec: TabularSpec, table: Tensor, correct: Tensor) -> Tensor:
    """``[*seeds, G]`` exact probability of producing one of the **distinct** correct sequences ``correct [*seeds, G, C, T]``.

    Sums the C sequence probabilities (cheaper than enumerating all $V^T$ sequences when C is small).
    """
    return visited_token_logp(spec, table, correct).sum(-1).exp().sum(-1)


def split_step(ctx: TeacherStep, parts: int) -> list[TeacherStep]:
    """Split a step of ``parts * S`` seed rows into ``parts`` steps of ``S`` rows (views; gradients flow).

    One ``split`` per field, so the backward joins the parts' gradients in one pass.
    """
    s_all = ctx.theta.shape[0]
    if s_all % parts:
        raise ShapeError(f"parts: {parts} does not divide the {s_all} seed rows")
    n = s_all // parts
    rows, bt = ctx.rewards.shape[0] // parts, ctx.logp.shape[0] // parts
    fields = zip(
        ctx.rewards.split(rows), ctx.logp.split(bt), ctx.logp_old.split(bt), ctx.mask.split(bt),
        ctx.tokens.split(n), ctx.theta.split(n), ctx.history.split(n, dim=1), strict=True,
    )  # fmt: skip
    return [TeacherStep(ctx.step, *f) for f in fields]


def stack_methods(methods: Sequence[Callable[[TeacherStep], Tensor]]) -> Callable[[TeacherStep], Tensor]:
    """Run several methods side by side: method ``i`` owns the ``i``-th block of seed rows.

    With ``theta0`` and the environment tensors repeated per method (and the sampling seeds
    repeated too), every method sees the same environment and sampling stream per seed, and
    the batched run costs far less than the methods one after another.
    """

    def loss(ctx: TeacherStep) -> Tensor:
        return torch.cat([fn(part) for fn, part in zip(methods, split_step(ctx, len(methods)), strict=True)])

    return loss


def train_with_teacher(
    spec: TabularSpec,
    theta0: Tensor,
    loss_fn: Callable[[TeacherStep], Tensor],
    reward_fn: Callable[[Tensor, Tensor], Tensor],
    track: Callable[[Tensor], Tensor] | None,
    *,
    steps: int,
    k: int,
    seeds: Sequence[int],
    lr: float,
) -> TrainResult:
    """Run ``steps`` on-policy updates of ``theta0 [S, G, N, V]`` with Adam.

    Args:
        spec: the tabular spec. theta0: initial student logits (not mutated).
        loss_fn: the method: ``TeacherStep -> [B, T]`` per-token loss.
        reward_fn: ``(tokens [S, G, K, T], mask) -> rewards [S, G, K]``.
        track: ``theta [S, G, N, V] -> [S]`` validation score recorded after every step (None: no
            curve; ``TeacherStep.history`` and ``TrainResult.curve`` are then empty).
        steps, k, seeds, lr: updates, samples per prompt, seeds (sampling stream 0), Adam step size.

    Returns:
        `TrainResult`.

    The student's log-probs are computed from a copy of the visited rows (a leaf), and `_RowGrad`
    writes their gradient into one reused dense buffer: the same gradient as autograd through the
    table, without a table-sized allocation per step. Adam itself stays dense: its moments decay
    on every row at every step.
    """
    rng = SeedRNG.from_seeds(list(seeds), stream=0)
    s, g = theta0.shape[0], theta0.shape[1]
    theta = theta0.detach().clone(memory_format=torch.contiguous_format).requires_grad_(True)
    opt = torch.optim.Adam([theta], lr=lr, fused=True)  # one pass over the dense table per step (same numbers)
    grad = _RowGrad(theta)
    curve: list[Tensor] = []
    with torch.no_grad():
        if track is not None:
            curve.append(track(theta.detach()))
    for step in range(1, steps + 1):
        with torch.no_grad():
            tokens, mask, _ = sample_sequences(spec, theta.detach(), k, rng)
            rewards = reward_fn(tokens, mask)
        rows_idx = visited_rows(spec, theta, tokens)
        rows = theta.detach().view(-1, spec.vocab).index_select(0, rows_idx).requires_grad_(True)  # a leaf
        logp = _rows_token_logp(spec, rows, tokens).reshape(-1, spec.horizon)  # visited_token_logp's values
        flat_mask = mask.reshape(-1, spec.horizon)
        history = torch.stack(curve) if curve else torch.zeros(0, s, dtype=theta.dtype)
        ctx = TeacherStep(step, rewards.reshape(s * g, k), logp, logp.detach(), flat_mask, tokens, theta, history)
        loss_tok = loss_fn(ctx)
        per_seed = masked_mean(loss_tok.reshape(s, -1), flat_mask.reshape(s, -1), dim=-1)
        opt.zero_grad(set_to_none=True)
        per_seed.sum().backward()
        theta.grad = grad.assemble(rows_idx, rows.grad, theta.grad)
        opt.step()
        if track is not None:
            with torch.no_grad():
                curve.append(track(theta.detach()))
    return TrainResult(theta.detach(), torch.stack(curve) if curve else torch.zeros(0, s, dtype=theta.dtype))


class _RowGrad:
    """The dense gradient of a logits table whose loss reads only a few rows, in one reused buffer.

    Autograd's backward of a row gather allocates and zero-fills a table-sized gradient every step;
    here the buffer is allocated once and only the rows written the step before are re-zeroed. The
    rows' gradients are added one after another in gather order, as autograd's scatter-add does,
    so the result is the same tensor bit for bit (tests/simulators hold the two equal). A gradient
    that a method takes through the table itself is added on top (equal to rounding: autograd may
    sum the paths in another order).
    """

    def __init__(self, table: Tensor) -> None:
        self.dense = torch.zeros(table.shape, dtype=table.dtype, device=table.device)
        self._flat = self.dense.view(-1, table.shape[-1])
        self._written: Tensor | None = None

    def assemble(self, rows_idx: Tensor, rows_grad: Tensor | None, table_grad: Tensor | None) -> Tensor | None:
        """``table.grad`` for rows ``rows_idx [R]`` with gradient ``rows_grad [R, V]`` (plus a direct ``table_grad``).

        Returns None when neither has a gradient (the optimiser then skips the table, as autograd would).
        """
        if self._written is not None:
            self._flat.index_fill_(0, self._written, 0.0)
            self._written = None
        if rows_grad is None:
            return table_grad
        self._flat.index_add_(0, rows_idx, rows_grad)
        self._written = rows_idx
        return self.dense if table_grad is None else self.dense + table_grad  # a method read ctx.theta itself


def match_reward(correct: Tensor) -> Callable[[Tensor, Tensor], Tensor]:
    """Binary verifier: 1 when the (canonical) sequence is one of ``correct [*seeds, G, C, T]``."""

    def reward(tokens: Tensor, mask: Tensor) -> Tensor:
        hit = (torch.where(mask, tokens, 0).unsqueeze(-2) == correct.unsqueeze(-3)).all(-1).any(-1)
        return hit.to(torch.float64)

    return reward


def train_methods(
    spec: TabularSpec,
    student: Tensor,
    correct: Tensor,
    methods: Sequence[Callable[[TeacherStep], Tensor]],
    *,
    steps: int,
    k: int,
    lr: float,
    curve: bool = False,
    seeds: Sequence[int] | None = None,
) -> tuple[Tensor, Tensor]:
    """Train every method from ``student [S, G, N, V]`` on the binary task ``correct [S, G, C, T]``, side by side.

    Returns:
        ``(p [M, S, G], curve [steps + 1, M, S])``: final exact per-prompt success probabilities
        and the mean success after every step (only with ``curve=True``; else ``[0, M, S]``).
        Seed row ``s`` of every method uses sampling seed ``seeds[s]`` (default ``s``).
    """
    n_m, n_s = len(methods), student.shape[0]
    rep = correct.repeat(n_m, *([1] * (correct.ndim - 1)))
    res = train_with_teacher(
        spec, student.repeat(n_m, *([1] * (student.ndim - 1))), stack_methods(methods), match_reward(rep),
        (lambda theta: exact_success(spec, theta, rep).mean(-1)) if curve else None,
        steps=steps, k=k, seeds=list(range(n_s) if seeds is None else seeds) * n_m, lr=lr,
    )  # fmt: skip
    with torch.no_grad():
        p = exact_success(spec, res.theta, rep).reshape(n_m, n_s, -1)
    return p, res.curve.reshape(-1, n_m, n_s)
