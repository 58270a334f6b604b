"""The end-to-end RL toy behind check 11b (`posttrain.paper_checks.p11_rail`): tabular tree policy, branching.

`Env` holds the task of every seed (targets, warm-start table, exact success), `train` runs one
method for all seeds at once. Uniform GRPO arms take a group size per (step, seed, prompt)
(`uniform_sizes` for a fixed K, `matched_sizes` for RAIL's own per-step rollout count spread
evenly over the step's prompts); RAIL and the entropy heuristic reshape a base group of 4 with
branches. The check file states the claims and turns these numbers into metrics and comparisons.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any

import torch
from torch import Tensor

from posttrain.estimators import (
    controller_init,
    controller_predict,
    controller_update,
    group_normalized_advantages,
    masked_mean,
    plan_interventions,
    recoverability_gain,
)
from posttrain.estimators.selection import entropy_heuristic_states, random_interventions
from posttrain.simulators import SeedRNG, TabularSpec, enumerate_sequences, sample_sequences, sequence_logp, token_logp
from posttrain.simulators.branching import continue_sequences, node_entropy
from posttrain.simulators.loop import grpo_surrogate

__all__ = ["ACTIONS", "Env", "Method", "action_tensors", "matched_sizes", "train", "uniform_sizes"]

ACTIONS = ((2, 0.7), (2, 1.3), (4, 0.7), (4, 1.3))  # (extra continuations b, temperature tau)


class Method(StrEnum):
    """11b's arms: uniform GRPO (group size given per step and prompt), the static entropy heuristic, RAIL.

    GRPO4/GRPO8/GRPO16 are uniform GRPO at K = 4, 8, 16; UNIFORM takes the sizes passed to `train`
    (the accuracy-vs-rollouts curve and the matched-budget arm).
    """

    GRPO4 = "grpo4"
    GRPO8 = "grpo8"
    GRPO16 = "grpo16"
    UNIFORM = "uniform"
    HEURISTIC = "heuristic"
    RAIL = "rail"

    @property
    def branches(self) -> bool:
        return self in (Method.HEURISTIC, Method.RAIL)


_FIXED = {Method.GRPO4: 4, Method.GRPO8: 8, Method.GRPO16: 16}


def action_tensors() -> tuple[Tensor, Tensor]:
    """The action space as ``(b [A], tau [A])`` float64 tensors."""
    b = torch.tensor([a[0] for a in ACTIONS], dtype=torch.float64)
    return b, torch.tensor([a[1] for a in ACTIONS], dtype=torch.float64)


def uniform_sizes(config: Any, k: int) -> Tensor:
    """``[steps, S, P]`` group size ``k`` everywhere (uniform GRPO-k)."""
    return torch.full((config.steps, config.seeds, config.prompts_per_step), k, dtype=torch.long)


def matched_sizes(group_size: Tensor) -> Tensor:
    """Uniform group sizes with the same rollout count per (step, seed) as ``group_size [steps, S, P]``.

    Each prompt gets ``total // P``; the first ``total % P`` prompts of the step (the step's prompt
    order is random) get one more. Examples:

        >>> matched_sizes(torch.tensor([[[4, 8, 6, 8]]])).tolist()
        [[[7, 7, 6, 6]]]
    """
    total, p = group_size.sum(-1, keepdim=True), group_size.shape[-1]
    return total // p + (torch.arange(p) < total % p).long()


class Env:
    """The 11b task for all seeds: targets ``[S, P, L]``, rewards, the warm-start table, exact success."""

    def __init__(self, config: Any):
        self.spec = TabularSpec(vocab=config.vocab, horizon=config.depth)
        u = SeedRNG.from_seeds(config.seed_list, stream=11).rand(config.prompts, config.depth)
        self.targets = (u * config.vocab).long().clamp(max=config.vocab - 1)  # [S, P, L], seed s from its own stream
        n = self.spec.num_nodes
        node_depth = torch.zeros(n, dtype=torch.long)
        for t in range(config.depth):  # tree nodes of depth t are [(V^t - 1)/(V - 1), (V^{t+1} - 1)/(V - 1))
            node_depth[(config.vocab**t - 1) // (config.vocab - 1) :] = t
        target_tok = self.targets[..., node_depth]  # [S, P, N]
        self.init = torch.zeros(config.seeds, config.prompts, n, config.vocab, dtype=torch.float64)
        self.init.scatter_(-1, target_tok.unsqueeze(-1), config.warm_bias)

    def reward(self, tokens: Tensor, targets: Tensor) -> Tensor:
        """``tokens [..., L]`` vs ``targets`` broadcastable: first token right and at most one later miss."""
        first = tokens[..., 0] == targets[..., 0]
        misses = (tokens[..., 1:] != targets[..., 1:]).sum(-1)
        return (first & (misses <= 1)).to(torch.float64)

    def success(self, theta: Tensor) -> Tensor:
        seqs, _ = enumerate_sequences(self.spec)
        r = self.reward(seqs.expand(1, 1, *seqs.shape), self.targets.unsqueeze(-2))  # [S, P, N_seq]
        return (sequence_logp(self.spec, theta).exp() * r).sum(-1).mean(-1)


def _features(ent: Tensor, base_r: Tensor, group_mean: Tensor, progress: float, depth: int) -> Tensor:
    """``[S, P, C, 7]`` context of the C = 4 x 5 candidate prefixes (trajectory-major, depths 1..5)."""
    s, p, k, d = ent.shape
    depths = torch.arange(1, d + 1, dtype=torch.float64).expand(s, p, k, d) / depth
    gm = group_mean.reshape(s, p, 1, 1).expand(s, p, k, d)
    saturated = ((gm == 0) | (gm == 1)).to(torch.float64)
    cols = [
        torch.ones_like(ent),
        depths,
        ent,
        base_r.unsqueeze(-1).expand(s, p, k, d),
        gm,
        torch.full_like(ent, progress),
        saturated,
    ]
    return torch.stack(cols, -1).reshape(s, p, k * d, 7)


def _write(dst: Tensor, slot: Tensor, src: Tensor, keep: Tensor) -> None:
    """In place: ``dst[s, p, slot[s, p, w]] = src[s, p, w]`` where ``keep`` (kept slots are distinct)."""
    si, pi, wi = keep.nonzero(as_tuple=True)
    dst[si, pi, slot[si, pi, wi]] = src[si, pi, wi]


def train(config: Any, env: Env, method: Method, sizes: Tensor | None = None) -> dict[str, Tensor]:
    """One method for all seeds.

    ``sizes [steps, S, P]`` gives a uniform arm's group size per step and prompt (`Method.UNIFORM`;
    GRPO4/8/16 fill it themselves). Returns per-seed ``success``, ``rollouts`` and ``zero_var``
    (means over steps), and per step ``group_size`` (``[steps, S, P]``: rollouts in each reshaped
    group), ``planned`` (base rollouts plus the sizes of the active branches) and ``interventions``
    (active branches per prompt).
    """
    spec, s, pp = env.spec, config.seeds, config.prompts_per_step
    if method in _FIXED:
        sizes = uniform_sizes(config, _FIXED[method])
    elif method is Method.UNIFORM and sizes is None:
        raise ValueError("sizes: the uniform arm needs its group sizes [steps, S, P]")
    sample_rng = SeedRNG.from_seeds(config.seed_list, stream=0)
    prompt_rng = SeedRNG.from_seeds(config.seed_list, stream=3)
    branch_rng = SeedRNG.from_seeds(config.seed_list, stream=4)
    coin = SeedRNG.from_seeds(config.seed_list, stream=5).generators  # shadow choices and exploration, one per seed
    fit = {"window": config.window, "gamma": config.gamma, "delta": config.delta, "ridge": config.ridge}
    ctrl = controller_init(len(ACTIONS), 7, runs=(s,))  # one controller per seed
    theta = env.init.clone().requires_grad_(True)
    slots = config.base_group + config.extra_budget if sizes is None else max(int(sizes.max()), 1)
    k0 = config.base_group if sizes is None else slots  # uniform arms draw the largest group, keep their size
    seed_idx = torch.arange(s).reshape(s, 1)
    rollouts, zero_var, group_sizes, planned, n_int = [], [], [], [], []
    for step in range(config.steps):
        prompts = prompt_rng.rand(config.prompts).argsort(-1)[:, :pp]  # [S, P]
        table = theta.detach()[seed_idx, prompts]
        targets = env.targets[seed_idx, prompts].unsqueeze(-2)  # [S, P, 1, L]
        base, _, _ = sample_sequences(spec, table, k0, sample_rng)
        tokens = torch.zeros(s, pp, slots, spec.horizon, dtype=torch.long)
        tokens[:, :, :k0] = base
        n_base = torch.full((s, pp), k0, dtype=torch.long) if sizes is None else sizes[step]
        valid = torch.arange(slots) < n_base.unsqueeze(-1)
        rewards = torch.zeros(s, pp, slots, dtype=torch.float64)
        rewards[:, :, :k0] = env.reward(base, targets)
        rewards = rewards * valid
        filled = n_base.clone()
        active_count = torch.zeros(s, pp, dtype=torch.long)
        if method.branches:
            ctrl = _branch(config, env, method, step, table, base, targets, tokens, rewards, valid, filled,
                           active_count, ctrl, fit, branch_rng, coin)  # fmt: skip
        # GRPO on the reshaped groups (whole group, variable size: groups of equal size batched together)
        size = valid.sum(-1)
        group_sizes.append(size)
        planned.append(filled)
        n_int.append(active_count)
        adv = torch.zeros_like(rewards)
        for n in size.unique().tolist():
            rows = size == n
            adv[rows, :n] = group_normalized_advantages(rewards[rows][:, :n])
        rollouts.append(size.to(torch.float64).mean(-1))
        r_max = torch.where(valid, rewards, torch.full_like(rewards, -math.inf)).amax(-1)
        r_min = torch.where(valid, rewards, torch.full_like(rewards, math.inf)).amin(-1)
        zero_var.append((r_max == r_min).to(torch.float64).mean(-1))
        logp = token_logp(spec, theta[seed_idx, prompts], tokens)  # [S, P, slots, L]
        mask = valid.unsqueeze(-1).expand_as(logp)
        loss = grpo_surrogate(
            logp.reshape(s * pp, -1),
            group=slots * spec.horizon,
            advantages=adv.unsqueeze(-1).expand_as(logp).reshape(s * pp, -1),
            mask=mask.reshape(s * pp, -1),
        )
        # per prompt: token mean over its reshaped group; summed over the step's prompts (per-prompt tables)
        per_prompt = masked_mean(loss, mask.reshape(s * pp, -1), dim=-1)
        (grad,) = torch.autograd.grad(per_prompt.sum(), theta)
        with torch.no_grad():
            theta -= config.lr * grad
    with torch.no_grad():
        final = env.success(theta.detach())
    return {
        "success": final,
        "rollouts": torch.stack(rollouts).mean(0),
        "zero_var": torch.stack(zero_var).mean(0),
        "group_size": torch.stack(group_sizes),
        "planned": torch.stack(planned),
        "interventions": torch.stack(n_int),
    }


def _branch(
    config: Any,
    env: Env,
    method: Method,
    step: int,
    table: Tensor,
    base: Tensor,
    targets: Tensor,
    tokens: Tensor,
    rewards: Tensor,
    valid: Tensor,
    filled: Tensor,
    active_count: Tensor,
    ctrl: Any,
    fit: dict[str, float],
    branch_rng: SeedRNG,
    coin: tuple[torch.Generator, ...],
) -> Any:
    """Branch the base groups in place (``tokens``, ``rewards``, ``valid``, ``filled``, ``active_count``);
    returns the (for RAIL: refitted) controller."""
    spec, s, pp, k0 = env.spec, config.seeds, config.prompts_per_step, config.base_group
    costs, temps = action_tensors()
    slots = tokens.shape[2]
    ent = node_entropy(spec, table, base)[..., 1:]  # [S, P, 4, 5]: entropy at prefixes of depth 1..5
    cand_traj = torch.arange(k0).repeat_interleave(spec.horizon - 1)  # candidate c -> (trajectory, depth)
    cand_depth = torch.arange(1, spec.horizon).repeat(k0)
    n_cand = cand_traj.numel()
    used = torch.zeros(s, pp, n_cand, dtype=torch.bool)
    remaining = torch.full((s, pp), float(config.extra_budget), dtype=torch.float64)
    last_gain = torch.ones(s, pp, dtype=torch.float64)
    traces: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
    rounds = 1 if method is Method.HEURISTIC else config.extra_budget // int(costs.min())
    for _ in range(rounds):
        group_mean = (rewards * valid).sum(-1) / valid.sum(-1)
        feats = _features(ent, rewards[:, :, :k0], group_mean, step / config.steps, spec.horizon)
        if method is Method.HEURISTIC:
            state = entropy_heuristic_states(ent.reshape(s * pp, -1), torch.ones(s * pp, n_cand, dtype=torch.bool))
            state = state.reshape(s, pp)
            act = torch.full_like(state, 2)  # b = 4 at tau = 1 (below)
            active = torch.ones_like(state, dtype=torch.bool)
            tau = torch.ones(s, pp, dtype=torch.float64)
            b = torch.full((s, pp), float(config.heuristic_branches), dtype=torch.float64)
        else:
            feasible = (~used).unsqueeze(-1) & (costs.view(1, 1, 1, -1) <= remaining.unsqueeze(-1).unsqueeze(-1))
            if step < config.shadow_steps:  # shadow: random interventions, accept-or-stop
                state, act, active = random_interventions(feasible, coin)
                active = active & (last_gain > 0)
            else:  # live: the controller decides behind the utility gate
                plan = plan_interventions(
                    controller_predict(ctrl, feats), costs, ~used, budget=remaining, max_per_prompt=1,
                    kappa=config.kappa, cost_weight=config.cost_weight, explore_prob=config.explore, generator=coin,
                )  # fmt: skip
                state, act, active = plan.state[..., 0], plan.action[..., 0], plan.active[..., 0]
            tau, b = temps[act], costs[act]
        b = b * active
        prefix = base.gather(2, cand_traj[state].reshape(s, pp, 1, 1).expand(s, pp, 1, spec.horizon))
        width = config.extra_budget
        branch = continue_sequences(
            spec, table, prefix.expand(s, pp, width, spec.horizon).contiguous(),
            cand_depth[state].unsqueeze(-1).expand(s, pp, width), tau.unsqueeze(-1).expand(s, pp, width), branch_rng,
        )  # fmt: skip
        b_mask = torch.arange(width) < b.unsqueeze(-1)
        b_rew = env.reward(branch, targets)
        gain = recoverability_gain(rewards, b_rew, b_mask, valid)
        traces.append((feats.gather(2, state.reshape(s, pp, 1, 1).expand(s, pp, 1, 7)).squeeze(2), act, gain, active))
        # the branch joins the group in the slots after the filled ones (within budget they fit)
        slot = filled.unsqueeze(-1) + torch.arange(width)  # [S, P, width]
        ok = b_mask & (slot < slots)
        _write(tokens, slot, branch, ok)
        _write(rewards, slot, b_rew, ok)
        _write(valid, slot, ok, ok)
        filled += b.long()
        active_count += active.long()
        remaining = remaining - b
        used.scatter_(2, state.unsqueeze(-1), active.unsqueeze(-1) | used.gather(2, state.unsqueeze(-1)))
        last_gain = torch.where(active, gain, torch.zeros_like(gain))
    if method is Method.RAIL:
        f, a, g, m = (torch.stack([t[i] for t in traces], 2).reshape(s, pp * len(traces), -1) for i in range(4))
        ctrl = controller_update(ctrl, f, a[..., 0], g[..., 0], step, valid=m[..., 0], **fit)  # type: ignore[arg-type]
    return ctrl
