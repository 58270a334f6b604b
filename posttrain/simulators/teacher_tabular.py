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
from posttrain.simulators.tabular import TabularSpec, sample_sequences

__all__ = [
    "TeacherStep",
    "TrainResult",
    "exact_success",
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


def node_log_probs(spec: TabularSpec, table: Tensor, tokens: Tensor) -> Tensor:
    """``[*seeds, G, K, T, V]`` log-softmax of ``table [*seeds, G, N, V]`` at every prefix of ``tokens``.

    Gathers the visited rows first and normalises only those (differentiable; far cheaper than
    normalising the whole table when few nodes are visited).
    """
    if table.ndim != tokens.ndim:
        raise ShapeError(f"tokens: expected rank {table.ndim} ([*seeds, G, K, T]), got {list(tokens.shape)}")
    nodes = spec.prefix_nodes(tokens)  # [*s, G, K, T]
    lead_g = table.shape[:-2]
    k, t = tokens.shape[-2:]
    idx = nodes.reshape(*lead_g, k * t, 1).expand(*lead_g, k * t, spec.vocab)
    return torch.log_softmax(table.gather(-2, idx), dim=-1).reshape(*lead_g, k, t, spec.vocab)


def visited_token_logp(spec: TabularSpec, table: Tensor, tokens: Tensor) -> Tensor:
    """``[*seeds, G, K, T]`` log-prob of each token given its prefix (differentiable), 0 off the response mask.

    Same values as `posttrain.simulators.tabular.token_logp`, via `node_log_probs`.
    """
    logp = node_log_probs(spec, table, tokens).gather(-1, tokens.unsqueeze(-1))[..., 0]
    return zero_off_mask(logp, spec.response_mask(tokens))


def exact_success(spec: TabularSpec, table: Tensor, correct: Tensor) -> Tensor:
    """``[*seeds, G]`` exact probability of producing one of the **distinct** correct sequences ``correct [*seeds, G, C, T]``.

    Sums the C sequence probabilities (cheaper than enumerating all $V^T$ sequences when C is small).
    """
    return visited_token_logp(spec, table, correct).sum(-1).exp().sum(-1)


def split_step(ctx: TeacherStep, parts: int) -> list[TeacherStep]:
    """Split a step of ``parts * S`` seed rows into ``parts`` steps of ``S`` rows (views; gradients flow)."""
    s_all = ctx.theta.shape[0]
    if s_all % parts:
        raise ShapeError(f"parts: {parts} does not divide the {s_all} seed rows")
    n = s_all // parts
    rows, bt = ctx.rewards.shape[0] // parts, ctx.logp.shape[0] // parts
    return [
        TeacherStep(
            ctx.step,
            ctx.rewards[i * rows : (i + 1) * rows],
            ctx.logp[i * bt : (i + 1) * bt],
            ctx.logp_old[i * bt : (i + 1) * bt],
            ctx.mask[i * bt : (i + 1) * bt],
            ctx.tokens[i * n : (i + 1) * n],
            ctx.theta[i * n : (i + 1) * n],
            ctx.history[:, i * n : (i + 1) * n],
        )
        for i in range(parts)
    ]


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
    """
    rng = SeedRNG.from_seeds(list(seeds), stream=0)
    s, g = theta0.shape[0], theta0.shape[1]
    theta = theta0.detach().clone().requires_grad_(True)
    opt = torch.optim.Adam([theta], lr=lr, fused=True)  # one pass over the dense table per step (same numbers)
    curve: list[Tensor] = []
    with torch.no_grad():
        if track is not None:
            curve.append(track(theta.detach()))
    for step in range(1, steps + 1):
        with torch.no_grad():
            tokens, mask, _ = sample_sequences(spec, theta.detach(), k, rng)
            rewards = reward_fn(tokens, mask)
        logp = visited_token_logp(spec, theta, tokens).reshape(-1, spec.horizon)
        flat_mask = mask.reshape(-1, spec.horizon)
        history = torch.stack(curve) if curve else torch.zeros(0, s, dtype=theta.dtype)
        ctx = TeacherStep(step, rewards.reshape(s * g, k), logp, logp.detach(), flat_mask, tokens, theta, history)
        loss_tok = loss_fn(ctx)
        per_seed = masked_mean(loss_tok.reshape(s, -1), flat_mask.reshape(s, -1), dim=-1)
        opt.zero_grad(set_to_none=True)
        per_seed.sum().backward()
        opt.step()
        if track is not None:
            with torch.no_grad():
                curve.append(track(theta.detach()))
    return TrainResult(theta.detach(), torch.stack(curve) if curve else torch.zeros(0, s, dtype=theta.dtype))


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
) -> tuple[Tensor, Tensor]:
    """Train every method from ``student [S, G, N, V]`` on the binary task ``correct [S, G, C, T]``, side by side.

    Returns:
        ``(p [M, S, G], curve [steps + 1, M, S])``: final exact per-prompt success probabilities
        and the mean success after every step (only with ``curve=True``; else ``[0, M, S]``).
        Seed ``s`` of every method uses sampling seed ``s``.
    """
    n_m, n_s = len(methods), student.shape[0]
    rep = correct.repeat(n_m, *([1] * (correct.ndim - 1)))
    res = train_with_teacher(
        spec, student.repeat(n_m, *([1] * (student.ndim - 1))), stack_methods(methods), match_reward(rep),
        (lambda theta: exact_success(spec, theta, rep).mean(-1)) if curve else None,
        steps=steps, k=k, seeds=list(range(n_s)) * n_m, lr=lr,
    )  # fmt: skip
    with torch.no_grad():
        p = exact_success(spec, res.theta, rep).reshape(n_m, n_s, -1)
    return p, res.curve.reshape(-1, n_m, n_s)
