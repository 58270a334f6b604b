"""Paper 11: RAIL, learned rollout interventions (Zhang et al. 2026, arXiv:2608.05080). Two tiers.

Claims: (11a) an online, recency-weighted gain predictor tracks the drifting value of interventions
much better than a frozen one (paper: > 40 % lower MAE); (11b) learned branching (where, how many,
at what temperature) beats uniform GRPO at a smaller rollout budget and beats a static entropy
heuristic.

11a (docs: methods/rail.md): synthetic non-stationary gains, T = 400 steps; a state has relative
depth d ~ U[0,1] and entropy e ~ U[0,1]; base group of 4 Bernoulli(p_t), p_t = sigma(-2 + 3t/T);
continuation success q = sigma(alpha_t + 2(e - .5) - 1.5(d - .5) + k_t (tau - 1)), k_t = +2 before
T/2 and -2 after; actions (b, tau) in {2, 4} x {0.7, 1.3}; gain = population-variance increase
(`recoverability_gain`). 64 random interventions per step shared by
both predictors (one linear model per action on [1, d, e, p_hat]): online = refit every step on the
last 500 traces, weights 0.99^age, Huber delta 0.05 (IRLS); frozen = the same fit after step 50's
traces, never refit. MAE on the next step's traces over steps 51-400. 16 seeds (the paper's
pilot used 8; "in >= 7/8 of the seeds" is judged as a fraction with an exact binomial test, which
needs more than 8 seeds to pass at all).

11b (docs: methods/rail.md): 32 prompts, tabular tree policy, depth 6, vocabulary 3 (364 nodes x 3);
reward 1 iff the first token is the target's and at most one of the other five differs; warm start
+1.3 on the target token's logit at every node (success ~ 0.27). SGD lr 1 on the on-policy GRPO
token-mean surrogate (ratio 1, also for tempered branches) over all trajectories of each reshaped
group, summed over the step's prompts (each prompt has its own table; this reading of "the
token-mean surrogate of the group" matches the pilot's scale), 80 steps, 16 prompts per step. Methods: GRPO-8, GRPO-16 (reported), the static entropy
heuristic (4 base + 4 branches from the highest-entropy prefix, tau = 1) and RAIL (4 base, up to 4
extra continuations per prompt; candidates = prefixes of depth 1-5 of the base trajectories;
features [1, depth/L, entropy, base-trajectory reward, group mean, t/T, 1[mean in {0,1}]]; one linear
predictor per action, recency-weighted Huber fit on the last 2000 traces every step; shadow =
first 10 steps with random interventions and accept-or-stop; then
`plan_interventions` with utility = prediction - 0.005 b, gate 0,
exploration 0.1). 16 paired seeds (same targets and prompt order for every method). A group holds
the base rollouts plus every active branch, in contiguous slots (at most 8).

Every seed is an independent run: its own targets, its own controller (coefficients, window of its
last 2000 traces, ridge) and its own generators for sampling, prompt order, branches, shadow choices
and exploration, all batched over seeds (the controller is one batched fit, not a loop), so the
number of seeds never changes any seed's trajectory.

Simplifications: candidate states of identical prefixes are not deduplicated; the toy GRPO step is
the shared one (`grpo_surrogate`, ratio 1) with per-token
advantages of the reshaped groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.estimators import group_normalized_advantages, masked_mean
from posttrain.estimators.rail import (
    ControllerState,
    controller_init,
    controller_predict,
    controller_update,
    entropy_heuristic_states,
    plan_interventions,
    random_interventions,
    recoverability_gain,
)
from posttrain.paper_checks import register_check
from posttrain.paper_checks._criteria import mean_and_seeds
from posttrain.paper_checks.base import (
    Comparison,
    Metric,
    PaperCheck,
    Result,
    exact_criterion,
    fraction_criterion,
    mean_criterion,
)
from posttrain.simulators import SeedRNG, TabularSpec, enumerate_sequences, sample_sequences, sequence_logp, token_logp
from posttrain.simulators.branching import continue_sequences, node_entropy
from posttrain.simulators.loop import grpo_surrogate

__all__ = ["AdaptivityConfig", "Config", "run", "run_adaptivity"]

ACTIONS = ((2, 0.7), (2, 1.3), (4, 0.7), (4, 1.3))  # (extra continuations b, temperature tau)


def _action_tensors() -> tuple[Tensor, Tensor]:
    b = torch.tensor([a[0] for a in ACTIONS], dtype=torch.float64)
    return b, torch.tensor([a[1] for a in ACTIONS], dtype=torch.float64)


def _chosen(pred: Tensor, act: Tensor) -> Tensor:
    """``pred [..., A]`` at the taken actions ``act [...]``."""
    return pred.gather(-1, act.unsqueeze(-1)).squeeze(-1)


# ----------------------------------------------------------------------------------------------
# 11a: controller adaptivity under drift
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdaptivityConfig:
    seeds: int = 16
    steps: int = 400
    traces_per_step: int = 64
    base_group: int = 4
    freeze_step: int = 50
    window: int = 500
    gamma: float = 0.99
    delta: float = 0.05
    ridge: float = 1e-6
    ratio_per_seed: float = 0.8
    per_seed_fraction: float = 7 / 8
    mean_ratio: float = 0.7
    margin_reason: str = "paper pass criteria: online MAE <= 0.8 x frozen in >= 7/8 seeds, mean ratio <= 0.7"

    @classmethod
    def smoke(cls) -> AdaptivityConfig:
        return cls(seeds=10, steps=160, freeze_step=20)


def _synthetic_traces(config: AdaptivityConfig, rng: SeedRNG, t: int) -> tuple[Tensor, Tensor, Tensor]:
    """One step of random interventions: features ``[S, M, 4]``, actions ``[S, M]``, gains ``[S, M]``."""
    m, n = config.traces_per_step, config.base_group
    u = rng.rand(m, 4 + n + 4)  # d, e, action, (unused), base draws, branch draws
    d, e = u[..., 0], u[..., 1]
    act = (u[..., 2] * len(ACTIONS)).long().clamp(max=len(ACTIONS) - 1)
    b, tau = (x[act] for x in _action_tensors())
    alpha = -2.0 + 3.0 * t / config.steps
    k_t = 2.0 if t < config.steps // 2 else -2.0
    base = (u[..., 4 : 4 + n] < torch.sigmoid(torch.tensor(alpha))).to(torch.float64)
    q = torch.sigmoid(alpha + 2 * (e - 0.5) - 1.5 * (d - 0.5) + k_t * (tau - 1.0))
    branch = (u[..., 4 + n :] < q.unsqueeze(-1)).to(torch.float64)
    branch_mask = torch.arange(4) < b.unsqueeze(-1)
    gains = recoverability_gain(base, branch, branch_mask)
    feats = torch.stack([torch.ones_like(d), d, e, base.mean(-1)], -1)
    return feats, act, gains


def run_adaptivity(config: AdaptivityConfig) -> Result:
    torch.set_num_threads(1)
    rng = SeedRNG.from_seeds(range(config.seeds), stream=11)
    fit = {"window": config.window, "gamma": config.gamma, "delta": config.delta, "ridge": config.ridge}
    state = controller_init(len(ACTIONS), 4, runs=(config.seeds,))  # one controller per seed
    frozen: ControllerState | None = None
    err_on, err_fr, sign_on, sign_fr, counts = [], [], [], [], []
    for t in range(config.steps):
        feats, act, gains = _synthetic_traces(config, rng, t)
        if frozen is not None:  # predictions before this step's traces are added
            p_on = _chosen(controller_predict(state, feats), act)
            p_fr = _chosen(controller_predict(frozen, feats), act)
            err_on.append((p_on - gains).abs().mean(-1))
            err_fr.append((p_fr - gains).abs().mean(-1))
            nz = gains != 0
            sign_on.append(((torch.sign(p_on) == torch.sign(gains)) & nz).sum(-1))
            sign_fr.append(((torch.sign(p_fr) == torch.sign(gains)) & nz).sum(-1))
            counts.append(nz.sum(-1))
        state = controller_update(state, feats, act, gains, t, **fit)  # type: ignore[arg-type]
        if t + 1 == config.freeze_step:
            frozen = state
    mae_on, mae_fr = torch.stack(err_on).mean(0), torch.stack(err_fr).mean(0)
    ratio = (mae_on / mae_fr).numpy()
    total = torch.stack(counts).sum(0).clamp(min=1)
    metrics = (
        Metric("MAE online", tuple(mae_on.tolist()), note="pilot ~0.048"),
        Metric("MAE frozen", tuple(mae_fr.tolist()), note="pilot 0.067-0.081"),
        Metric("MAE ratio online/frozen", tuple(ratio.tolist()), paper_value=0.6, note="paper: > 40% lower; pilot mean 0.64"),
        Metric("sign agreement online (non-zero gains)", tuple((torch.stack(sign_on).sum(0) / total).tolist())),
        Metric("sign agreement frozen (non-zero gains)", tuple((torch.stack(sign_fr).sum(0) / total).tolist())),
    )  # fmt: skip
    reason = config.margin_reason
    comps = (
        fraction_criterion("0.8 MAE_frozen - MAE_online", (config.ratio_per_seed * mae_fr - mae_on).tolist(),
                           fraction=config.per_seed_fraction, reason=reason),
        mean_criterion("0.7 - MAE_online / MAE_frozen", (config.mean_ratio - ratio).tolist(), margin=0.0,
                       reason=reason),
        mean_criterion("MAE_frozen - MAE_online", (mae_fr - mae_on).tolist(), margin=0.0,
                       reason="paired statistics, reported", asserted=False),
    )  # fmt: skip
    return Result(metrics, comps)


# ----------------------------------------------------------------------------------------------
# 11b: end-to-end RL at matched budget
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    seeds: int = 16
    prompts: int = 32
    depth: int = 6
    vocab: int = 3
    warm_bias: float = 1.3
    steps: int = 80
    prompts_per_step: int = 16
    lr: float = 1.0
    base_group: int = 4
    extra_budget: int = 4
    shadow_steps: int = 10
    explore: float = 0.1
    cost_weight: float = 0.005
    kappa: float = 0.0
    window: int = 2000
    gamma: float = 0.99
    delta: float = 0.05
    ridge: float = 1e-4
    heuristic_branches: int = 4
    vs_grpo_fraction: float = 6 / 8
    vs_heuristic_margin: float = 0.02
    vs_heuristic_fraction: float = 7 / 8
    margin_reason: str = (
        "paper pass criteria: rollouts <= 8; RAIL - GRPO-8 > 0 in >= 6/8 seeds; RAIL - heuristic >= 0.02, >= 7/8 seeds"
    )

    @classmethod
    def smoke(cls) -> Config:
        return cls(seeds=10, steps=30, shadow_steps=5)


class _Env:
    """The 11b task for all seeds: targets ``[S, P, L]``, rewards, the warm-start table, exact success."""

    def __init__(self, config: Config):
        self.spec = TabularSpec(vocab=config.vocab, horizon=config.depth)
        u = SeedRNG.from_seeds(range(config.seeds), stream=11).rand(config.prompts, config.depth)
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


def _train(config: Config, env: _Env, method: str) -> dict[str, Tensor]:
    """One method for all seeds; ``method`` in grpo8, grpo16, heuristic, rail (grpo4: the base group alone).

    Returns per-seed ``success``, ``rollouts`` and ``zero_var`` (means over steps), and per step
    ``group_size`` (``[steps, S, P]``: rollouts in each reshaped group), ``planned`` (base rollouts
    plus the sizes of the active branches) and ``interventions`` (active branches per prompt).
    """
    spec, s, pp = env.spec, config.seeds, config.prompts_per_step
    sample_rng = SeedRNG.from_seeds(range(s), stream=0)
    prompt_rng = SeedRNG.from_seeds(range(s), stream=3)
    branch_rng = SeedRNG.from_seeds(range(s), stream=4)
    coin = SeedRNG.from_seeds(range(s), stream=5).generators  # shadow choices and exploration, one per seed
    costs, temps = _action_tensors()
    fit = {"window": config.window, "gamma": config.gamma, "delta": config.delta, "ridge": config.ridge}
    ctrl = controller_init(len(ACTIONS), 7, runs=(s,))  # one controller per seed
    theta = env.init.clone().requires_grad_(True)
    k0 = {"grpo8": 8, "grpo16": 16}.get(method, config.base_group)
    slots = max(k0, config.base_group + config.extra_budget)
    seed_idx = torch.arange(s).reshape(s, 1)
    rollouts, zero_var, sizes, planned, n_int = [], [], [], [], []
    for step in range(config.steps):
        prompts = prompt_rng.rand(config.prompts).argsort(-1)[:, :pp]  # [S, P]
        table = theta.detach()[seed_idx, prompts]
        targets = env.targets[seed_idx, prompts].unsqueeze(-2)  # [S, P, 1, L]
        base, _, _ = sample_sequences(spec, table, k0, sample_rng)
        tokens = torch.zeros(s, pp, slots, spec.horizon, dtype=torch.long)
        tokens[:, :, :k0] = base
        valid = torch.zeros(s, pp, slots, dtype=torch.bool)
        valid[:, :, :k0] = True
        rewards = torch.zeros(s, pp, slots, dtype=torch.float64)
        rewards[:, :, :k0] = env.reward(base, targets)
        filled = torch.full((s, pp), k0, dtype=torch.long)
        active_count = torch.zeros(s, pp, dtype=torch.long)
        if method in ("heuristic", "rail"):
            ent = node_entropy(spec, table, base)[..., 1:]  # [S, P, 4, 5]: entropy at prefixes of depth 1..5
            cand_traj = torch.arange(k0).repeat_interleave(spec.horizon - 1)  # candidate c -> (trajectory, depth)
            cand_depth = torch.arange(1, spec.horizon).repeat(k0)
            n_cand = cand_traj.numel()
            used = torch.zeros(s, pp, n_cand, dtype=torch.bool)
            remaining = torch.full((s, pp), float(config.extra_budget), dtype=torch.float64)
            last_gain = torch.ones(s, pp, dtype=torch.float64)
            traces: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
            rounds = 1 if method == "heuristic" else config.extra_budget // int(costs.min())
            for _ in range(rounds):
                group_mean = (rewards * valid).sum(-1) / valid.sum(-1)
                feats = _features(ent, rewards[:, :, :k0], group_mean, step / config.steps, spec.horizon)
                if method == "heuristic":
                    state = entropy_heuristic_states(
                        ent.reshape(s * pp, -1), torch.ones(s * pp, n_cand, dtype=torch.bool)
                    ).reshape(s, pp)
                    act = torch.full_like(state, 2)  # b = 4 at tau = 1 (below)
                    active = torch.ones_like(state, dtype=torch.bool)
                    tau = torch.ones(s, pp, dtype=torch.float64)
                    b = torch.full((s, pp), float(config.heuristic_branches), dtype=torch.float64)
                else:
                    feasible = (~used).unsqueeze(-1) & (
                        costs.view(1, 1, 1, -1) <= remaining.unsqueeze(-1).unsqueeze(-1)
                    )
                    if step < config.shadow_steps:  # shadow: random interventions, accept-or-stop
                        state, act, active = random_interventions(feasible, coin)
                        active = active & (last_gain > 0)
                    else:  # live: the controller decides behind the utility gate
                        plan = plan_interventions(
                            controller_predict(ctrl, feats), costs, ~used, budget=remaining, max_per_prompt=1,
                            kappa=config.kappa, cost_weight=config.cost_weight, explore_prob=config.explore,
                            generator=coin,
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
                traces.append(
                    (feats.gather(2, state.reshape(s, pp, 1, 1).expand(s, pp, 1, 7)).squeeze(2), act, gain, active)
                )
                # the branch joins the group in the slots after the filled ones (within budget they fit)
                slot = filled.unsqueeze(-1) + torch.arange(width)  # [S, P, width]
                ok = b_mask & (slot < slots)
                _write(tokens, slot, branch, ok)
                _write(rewards, slot, b_rew, ok)
                _write(valid, slot, ok, ok)
                filled = filled + b.long()
                active_count = active_count + active.long()
                remaining = remaining - b
                used.scatter_(2, state.unsqueeze(-1), active.unsqueeze(-1) | used.gather(2, state.unsqueeze(-1)))
                last_gain = torch.where(active, gain, torch.zeros_like(gain))
            if method == "rail":
                f, a, g, m = (torch.stack([t[i] for t in traces], 2).reshape(s, pp * len(traces), -1) for i in range(4))
                ctrl = controller_update(ctrl, f, a[..., 0], g[..., 0], step, valid=m[..., 0], **fit)  # type: ignore[arg-type]
        # GRPO on the reshaped groups (whole group, variable size: groups of equal size batched together)
        size = valid.sum(-1)
        sizes.append(size)
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
        "group_size": torch.stack(sizes),
        "planned": torch.stack(planned),
        "interventions": torch.stack(n_int),
    }


def run(config: Config) -> Result:
    torch.set_num_threads(1)
    env = _Env(config)
    out = {m: _train(config, env, m) for m in ("grpo8", "grpo16", "heuristic", "rail")}
    paper = {"grpo8": 0.595, "heuristic": 0.543, "rail": 0.602}
    metrics = []
    for m, r in out.items():
        metrics.append(
            Metric(
                f"success {m}",
                tuple(r["success"].tolist()),
                paper_value=paper.get(m),
                note="pilot (4 seeds)" if m in paper else "",
            )
        )
        metrics.append(
            Metric(f"rollouts/prompt {m}", tuple(r["rollouts"].tolist()), paper_value=7.06 if m == "rail" else None)
        )
        metrics.append(Metric(f"zero-variance groups {m}", tuple(r["zero_var"].tolist())))
    reason = config.margin_reason
    diff = {m: (out["rail"]["success"] - out[m]["success"]).numpy() for m in ("grpo8", "grpo16", "heuristic")}
    comps: list[Comparison] = [
        exact_criterion(
            "8 - RAIL rollouts/prompt (>= 0)",
            (8.0 - out["rail"]["rollouts"]).tolist(),
            margin=-1e-12,
            reason="a count fixed by each run (mean group size over its steps), required in every seed",
        )
    ]
    comps += mean_and_seeds(
        "RAIL - GRPO-8", diff["grpo8"], mean_margin=0.0, fraction=config.vs_grpo_fraction, reason=reason
    )
    comps += mean_and_seeds(
        "RAIL - heuristic",
        diff["heuristic"],
        mean_margin=config.vs_heuristic_margin,
        fraction=config.vs_heuristic_fraction,
        reason=reason,
    )
    comps.append(
        mean_criterion("RAIL - GRPO-16", diff["grpo16"], margin=0.0, reason="reported by the paper", asserted=False)
    )
    return Result(tuple(metrics), tuple(comps))


register_check(
    PaperCheck(
        id="11a",
        paper="Zhang et al. 2026, RAIL, arXiv:2608.05080",
        claim="An online recency-weighted gain predictor has far lower MAE than a frozen one under drift",
        config_type=AdaptivityConfig,
        run=run_adaptivity,
    )
)
register_check(
    PaperCheck(
        id="11b",
        paper="Zhang et al. 2026, RAIL, arXiv:2608.05080",
        claim="Learned branching beats uniform GRPO-8 with <= 8 rollouts/prompt and beats a static entropy heuristic",
        config_type=Config,
        run=run,
    )
)
