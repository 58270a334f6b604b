"""Paper 14: GFlowRL matches the reward-tilted target without a learned partition (Liu et al. 2026, arXiv:2607.13394).

Claim: replacing FlowRL's learned log-partition by the in-batch Monte Carlo estimate (with
flow-gap clipping and a capped IS weight) makes trajectory-balance training converge to the
distribution-matching target $p^\\star \\propto \\pi_{ref} e^{\\beta r}$ (several rewarded modes
kept), unlike GRPO (mode collapse), and keeps gradients orders of magnitude smaller than FlowRL's.

Toy (docs: methods/gflowrl.md): one prompt, a 16-armed bandit, arms 0-3 rewarded (r = 1), reference
logits (2, 1, 0, -1, 0, ..., 0), beta = 8; policy logits start at log pi_ref; SGD lr 0.2 for 1500
steps with G = 16 samples per step, one on-policy update per batch (w = 1). Methods: GRPO
(std-normalised advantages, clipped_ratio_loss, token mean; zero-variance batches give zero
gradient), GFlowRL (`posttrain.estimators.losses.flow.gflowrl_loss`, Eq. 7 bounds as printed:
max_up 0.2, max_down 0.28; all length variants coincide for |y| = 1), FlowRL as published
(`flowrl_loss`: z-scored reward, beta 15, scalar log Z ~ N(0.5, 1)
learned with SGD lr 0.01). Metrics: TV(pi, p*), the entropy H_c of pi restricted to the rewarded arms,
max per-step gradient norm of the policy logits. 12 paired seeds (same sampling noise across methods).
Reported extra: GFlowRL with swapped clip bounds (max_up 0.28, max_down 0.2), docs: methods/gflowrl.md.

Simplifications: none beyond our toy; the gradient norm excludes FlowRL's log Z.

Primary endpoint (abstract: "We propose GFlowRL, a streamlined GFlowNet-style RL algorithm that
removes the auxiliary partition network entirely while preserving the reward-distribution-matching
objective, ..."): TV(pi_GRPO, p*) - TV(pi_GF, p*) > 0.15 in most seeds (quantile, share 1/2;
margin 0.15 = the spec's per-seed pass criterion, its "in 8/8 seeds" read as "in most seeds").
"Preserving the distribution-matching objective" without a partition network is measured as
ending much closer to the tilted target p* than a reward maximiser (GRPO collapses onto the
likeliest rewarded arm). The distance itself, not the rewarded-arm entropy H_c, is the primary:
the mutant with a constant log-partition keeps H_c high (0.74 on the pilot) while missing p* as
badly as GRPO (TV 0.365). The abstract's benchmark claims (exceeds all counterparts, FlowRL diverges)
are outside a bandit; FlowRL's gradient scale and distance are secondary.
Pilot (seeds 10000-10007): TV GRPO 0.355, GFlowRL 0.113 (swapped clip 0.109), FlowRL 0.238
[0.119, 0.356]; TV_GRPO - TV_GF = +0.242 (sd 0.0005), 8/8 seeds above 0.15. Power plan: planned
share 0.9 (the pilot cleared the margin by 0.09 in every seed) -> `seeds_for_share` 12 seeds.
Secondary: H_c(GF) - H_c(GRPO) > 0.4, TV_GF < TV_FlowRL, 10 maxgrad_GF < maxgrad_FlowRL (each in most
seeds). Reported: the paired mean of the primary difference, the swapped-clip ablation.
Mutants: GRPO in GFlowRL's place (reward maximisation); GFlowRL with its in-batch log-partition
replaced by the constant 0 (the paper's ConstantLogZ ablation: the method without its key
ingredient; pilot TV 0.365, 0/8 seeds clear the margin).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import torch
from torch import Tensor

from posttrain.estimators import clipped_ratio_loss, flow_gap, flowrl_loss, gflowrl_loss, group_normalized_advantages
from posttrain.estimators.losses.flow import FlowGap
from posttrain.paper_checks import register_check
from posttrain.paper_checks.cli import main_for
from posttrain.paper_checks.model import (
    MEDIAN,
    Comparison,
    Metric,
    Mutant,
    PaperCheck,
    Result,
    Role,
    mean_criterion,
    quantile_criterion,
)
from posttrain.simulators import SeedRNG, sample_arms

__all__ = ["Config", "run"]


class Method(StrEnum):
    """The compared objectives; GFLOWRL_SWAPPED is GFlowRL with its two clip bounds exchanged."""

    GRPO = "grpo"
    GFLOWRL = "gflowrl"
    FLOWRL = "flowrl"
    GFLOWRL_SWAPPED = "gflowrl_swapped"
    CONSTANT_LOG_Z = "gflowrl_constant_log_z"


ARMS = (Method.GRPO, Method.GFLOWRL, Method.FLOWRL, Method.GFLOWRL_SWAPPED)


@dataclass(frozen=True)
class Config:
    seeds: int = 12  # power plan (pilot seeds 10000-10007: 8/8 clear; planned share 0.9 -> 12 seeds)
    first_seed: int = 0  # evaluation seeds first_seed .. first_seed + seeds - 1; the pilot used 10_000 ..
    arms: int = 16  # spec
    rewarded: int = 4  # spec
    ref_logits_rewarded: tuple[float, ...] = (2.0, 1.0, 0.0, -1.0)  # spec
    beta: float = 8.0  # paper
    lr: float = 0.2  # spec
    steps: int = 1500  # spec
    group: int = 16  # paper (G = 16)
    max_up: float = 0.2  # paper (Eq. 7 as printed)
    max_down: float = 0.28  # paper (Eq. 7 as printed)
    flowrl_beta: float = 15.0  # FlowRL paper
    flowrl_lr_z: float = 0.01  # spec
    constant_log_z: float = 0.0  # mutant: the paper's ConstantLogZ ablation (the in-batch estimate replaced)
    tv_margin: float = 0.15  # spec pass criterion
    hc_margin: float = 0.4  # spec pass criterion
    grad_factor: float = 10.0  # spec pass criterion
    methods: tuple[Method, ...] = ARMS
    margin_reason: str = "docs: methods/gflowrl.md pass criteria"
    substitute: tuple[tuple[Method, Method], ...] = ()  # mutants: (arm, rule) trains the arm with another method

    @classmethod
    def smoke(cls) -> Config:
        return cls(seeds=2, steps=300)

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))


def _entropy_rewarded(logp: Tensor, rewarded: int) -> Tensor:
    q = torch.softmax(logp[..., :rewarded], -1)
    return -(q * q.log()).sum(-1)


def _constant_log_z_gap(config: Config, rewards: Tensor, logp_old: Tensor, logp_ref: Tensor, mask: Tensor) -> FlowGap:
    """The flow gaps with the in-batch estimate replaced by the constant ``config.constant_log_z``."""
    fg = flow_gap(rewards, logp_old, logp_ref, mask, beta=config.beta, variant="cprime", max_up=config.max_up,
                  max_down=config.max_down)  # fmt: skip
    c = torch.full_like(fg.log_partition, config.constant_log_z)
    gap = fg.gap - fg.log_partition.unsqueeze(-1) + c.unsqueeze(-1)
    return FlowGap(gap, gap.clamp(-config.max_up, config.max_down), c, fg.lengths, fg.valid)


def _train(config: Config, method: Method, ref: Tensor, r_arm: Tensor) -> dict[str, Tensor]:
    """``[S]`` final TV, H_c, max gradient norm for one method (seeds batched as the G axis)."""
    s, k = config.seeds, config.group
    rng = SeedRNG.from_seeds(config.seed_list, stream=0)
    theta = ref.expand(s, 1, config.arms).clone().requires_grad_(True)
    z0 = [
        torch.randn((), generator=g, dtype=torch.float64)
        for g in SeedRNG.from_seeds(config.seed_list, stream=14).generators
    ]
    log_z = (0.5 + torch.stack(z0)).requires_grad_(True)  # FlowRL's log Z ~ N(0.5, 1), one per seed
    mask = torch.ones(s * k, 1, dtype=torch.bool)
    max_grad = torch.zeros(s, dtype=torch.float64)
    swapped = method is Method.GFLOWRL_SWAPPED
    losses: dict[Method, Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]] = {
        Method.GRPO: lambda lp, lo, lr_, rew: clipped_ratio_loss(
            lp, lo, group_normalized_advantages(rew).reshape(-1), mask
        )[0],
        Method.GFLOWRL: lambda lp, lo, lr_, rew: gflowrl_loss(
            lp, lo, lr_, rew, mask, beta=config.beta, variant="cprime", max_up=up, max_down=down
        )[0],
        Method.FLOWRL: lambda lp, lo, lr_, rew: flowrl_loss(lp, lo, lr_, rew, mask, log_z, beta=config.flowrl_beta)[0],
        Method.CONSTANT_LOG_Z: lambda lp, lo, lr_, rew: gflowrl_loss(
            lp, lo, lr_, rew, mask, beta=config.beta, variant="cprime", max_up=up, max_down=down,
            gap=_constant_log_z_gap(config, rew, lo, lr_, mask),
        )[0],
    }  # fmt: skip
    loss_fn = losses[Method.GFLOWRL if swapped else method]
    up, down = (config.max_down, config.max_up) if swapped else (config.max_up, config.max_down)
    for _ in range(config.steps):
        arms = sample_arms(theta.detach(), k, rng)  # [S, 1, K]
        logp = torch.log_softmax(theta, -1).gather(-1, arms).reshape(s * k, 1)
        logp_ref = torch.log_softmax(ref, -1)[arms.reshape(-1)].reshape(s * k, 1)
        rewards = r_arm[arms.reshape(s, k)]
        per_seed = loss_fn(logp, logp.detach(), logp_ref, rewards).reshape(s, k).mean(-1)  # token = sequence mean
        params = [theta, log_z] if method is Method.FLOWRL else [theta]
        grads = torch.autograd.grad(per_seed.sum(), params)
        with torch.no_grad():
            max_grad = torch.maximum(max_grad, grads[0].reshape(s, -1).norm(dim=-1))
            theta -= config.lr * grads[0]
            if method is Method.FLOWRL:
                log_z -= config.flowrl_lr_z * grads[1]
    with torch.no_grad():
        logp = torch.log_softmax(theta.reshape(s, -1), -1)
        target = torch.softmax(torch.log_softmax(ref, -1) + config.beta * r_arm, -1)
        tv = 0.5 * (logp.exp() - target).abs().sum(-1)
    return {"tv": tv, "hc": _entropy_rewarded(logp, config.rewarded), "max_grad": max_grad}


def run(config: Config) -> Result:
    ref = torch.zeros(config.arms, dtype=torch.float64)
    ref[: config.rewarded] = torch.tensor(config.ref_logits_rewarded, dtype=torch.float64)
    r_arm = (torch.arange(config.arms) < config.rewarded).to(torch.float64)
    stand_in = dict(config.substitute)
    out = {m: _train(config, stand_in.get(m, m), ref, r_arm) for m in config.methods}
    paper = {("grpo", "tv"): 0.355, ("gflowrl", "tv"): 0.113, ("flowrl", "tv"): 0.238, ("grpo", "hc"): 0.007,
             ("gflowrl", "hc"): 0.617, ("flowrl", "hc"): 0.29, ("grpo", "max_grad"): 0.53,
             ("gflowrl", "max_grad"): 0.28, ("flowrl", "max_grad"): 12.9}  # fmt: skip
    metrics = tuple(
        Metric(
            f"{key} {m}",
            tuple(v.tolist()),
            paper_value=paper.get((m, key)),
            note="pilot" if (m, key) in paper else "",
        )
        for m, r in out.items()
        for key, v in r.items()
    )
    gf, grpo, fl = out[Method.GFLOWRL], out[Method.GRPO], out[Method.FLOWRL]

    def npd(x: Tensor) -> list[float]:
        return x.numpy().tolist()

    reason = config.margin_reason

    def seeds(name: str, d: list[float], margin: float, role: Role = Role.SECONDARY) -> Comparison:
        """The paper's "every seed" / "in >= f of the seeds" as the quantile claim "in most seeds" (share 1/2)."""
        return quantile_criterion(name, d, margin=margin, share=MEDIAN, reason=reason, role=role)

    tv = (-1.0, 1.0)  # a difference of two total-variation distances
    comps = [
        seeds("TV_GRPO - TV_GF", npd(grpo["tv"] - gf["tv"]), config.tv_margin, Role.PRIMARY),
        seeds("Hc_GF - Hc_GRPO", npd(gf["hc"] - grpo["hc"]), config.hc_margin),
        seeds("TV_FlowRL - TV_GF", npd(fl["tv"] - gf["tv"]), 0.0),
        seeds("maxgrad_FlowRL - 10 maxgrad_GF", npd(fl["max_grad"] - config.grad_factor * gf["max_grad"]), 0.0),
        mean_criterion("TV_GRPO - TV_GF (paired CI)", npd(grpo["tv"] - gf["tv"]), margin=0.0, bounds=tv,
                       reason="paired statistics, reported", role=Role.CONTEXT),
    ]  # fmt: skip
    if Method.GFLOWRL_SWAPPED in out:
        comps.append(mean_criterion("TV_GF - TV_GF(swapped clip)", npd(gf["tv"] - out[Method.GFLOWRL_SWAPPED]["tv"]),
                                    margin=0.0, bounds=tv, role=Role.CONTEXT,
                                    reason="clip-direction ablation (docs: methods/gflowrl.md), reported"))  # fmt: skip
    not_collapsed = float(np.min(gf["hc"].numpy()))
    notes = f"min H_c(GFlowRL) over seeds = {not_collapsed:.3f} (collapse would be < 0.2)"
    return Result(metrics, tuple(comps), notes=notes)


CHECK = register_check(
    PaperCheck(
        id="14",
        paper="Liu et al. 2026, GFlowRL, arXiv:2607.13394",
        claim="GFlowRL approaches p* ∝ pi_ref e^{beta r} (keeps rewarded modes) unlike GRPO; "
        "its gradients stay far below FlowRL's",
        abstract=(
            "We propose GFlowRL, a streamlined GFlowNet-style RL algorithm that removes the auxiliary partition "
            "network entirely while preserving the reward-distribution-matching objective, completed by two "
            "stabilizers: importance-sampling correction for rollout/trainer drift and asymmetric flow-gap clipping "
            "for outlier residuals."
        ),
        config_type=Config,
        run=run,
        mutants=(
            Mutant(
                "grpo-for-gflowrl",
                "GRPO (reward maximisation, no distribution matching) in GFlowRL's place",
                lambda c: dataclasses.replace(c, substitute=((Method.GFLOWRL, Method.GRPO),)),
                test_config=Config,  # the full size: the smoke run is too small to reproduce the method
            ),
            Mutant(
                "constant-log-z-for-gflowrl",
                "GFlowRL with its in-batch log-partition estimate replaced by a constant (log Z = 0)",
                lambda c: dataclasses.replace(c, substitute=((Method.GFLOWRL, Method.CONSTANT_LOG_Z),)),
                test_config=Config,
            ),
        ),
    )
)

if __name__ == "__main__":
    raise SystemExit(main_for(CHECK))
