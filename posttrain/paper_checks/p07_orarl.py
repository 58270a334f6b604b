"""Paper 07: OraRL, annotations as oracle rollouts (Li, Mu, Li, Qian, Zhang, Hou, Cheng 2026, arXiv:2608.20492).

Claim: appending the serialised annotation as one oracle rollout per GRPO group helps only with
OraRL's decoupled advantage (oracle-free baseline, directional gain, detached capped oracle
advantage, sign-balanced pruning with post-selection correction); naive injection (oracle inside
the group statistics) inverts the advantage of partially correct rollouts.

Toy (docs: methods/orarl.md): 1-D temporal grounding with 16 bins, 64 prompts (length U{1..4}), an
8-d feature per prompt and a two-token policy with parameters shared across prompts
(`posttrain.simulators.interval_grounding`, initialised at 0). Reward: discrete tIoU (0 when
e < s); oracle = the ground-truth interval, r* = 1. All 64 prompts and n = 8 samples per step,
one on-policy update (ratio 1), token mean over the kept rows' 2 tokens, Adam lr 0.03, 200 steps.
Metric: exact expected tIoU (enumerating all 16 x 16 answers). 10 seeds (seed = prompts, features,
sampling; the paper's pilot used 5); every method sees the same prompts and sampling stream per seed.

Simplifications: none beyond the paper's toy; the on-policy step is the shared toy GRPO loss
(`grpo_surrogate` with OraRL's advantages, one per token).

Asserted (the paper's criteria A-D): OraRL - GRPO > 0.04 in every seed; OraRL - naive > 0.02 in
every seed and paired mean > 0.04; mean naive inversion rate > 0.05 and mean OraRL selected-row flip
rate < 0.01; paired mean OraRL - (w/o detached oracle) > 0.03. "In every seed" is a fraction
criterion with fraction 1 (all seeds, and the binomial test), as written before any run. Reported: gamma = 0, no pruning, SFT only, naive vs GRPO
(the paper has naive < GRPO), and the binary-reward variant (1[tIoU >= 0.5]) where our
pilot found naive injection ahead of OraRL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from posttrain.estimators import group_normalized_advantages, masked_mean
from posttrain.estimators.orarl import OracleMode, inversion_rate, naive_injection_advantages, orarl_advantages
from posttrain.paper_checks import register_check
from posttrain.paper_checks.base import Comparison, Metric, PaperCheck, Result, fraction_criterion, mean_criterion
from posttrain.simulators._base import SeedRNG
from posttrain.simulators.interval_grounding import IntervalTask, answer_log_probs, sample_answers
from posttrain.simulators.loop import grpo_surrogate

__all__ = ["Config", "run"]

ASSERTED = ("grpo", "naive", "orarl", "orarl_no_detach")
PILOT = {  # docs: methods/orarl.md pilot (5 seeds): expected tIoU
    "grpo": 0.491, "naive": 0.522, "orarl": 0.588, "orarl_no_detach": 0.520, "orarl_no_prune": 0.627,
    "orarl_gamma0": 0.586, "sft": 0.340,
    "binary grpo": 0.649, "binary naive": 0.712, "binary orarl": 0.630, "binary orarl_no_prune": 0.693,
    "binary orarl_no_detach": 0.575, "binary sft": 0.342,
}  # fmt: skip

AdvantageFn = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class Config:
    seeds: int = 10
    prompts: int = 64
    bins: int = 16
    dim: int = 8
    samples: int = 8
    steps: int = 200
    lr: float = 0.03
    keep: int = 4
    methods: tuple[str, ...] = (*ASSERTED, "orarl_no_prune", "orarl_gamma0", "sft")
    binary_methods: tuple[str, ...] = ("grpo", "naive", "orarl", "orarl_no_prune", "orarl_no_detach", "sft")
    binary_threshold: float = 0.5
    every_seed: float = 1.0
    margin_reason: str = "paper pass criteria A-D (toy)"

    @classmethod
    def smoke(cls) -> Config:
        return cls(seeds=10, prompts=32, steps=60, methods=ASSERTED, binary_methods=())


def _advantage(name: str, keep: int) -> AdvantageFn:
    """``(rewards [G, n], r* [G]) -> (advantages [G, n+1], kept rows [G, n+1])``, oracle last."""

    def policy_only(rewards: Tensor, r_star: Tensor) -> tuple[Tensor, Tensor]:
        adv = torch.cat([group_normalized_advantages(rewards), torch.zeros_like(r_star).unsqueeze(-1)], -1)
        kept = torch.ones_like(adv, dtype=torch.bool)
        kept[:, -1] = False
        return adv, kept

    def naive(rewards: Tensor, r_star: Tensor) -> tuple[Tensor, Tensor]:
        adv = naive_injection_advantages(rewards, r_star)
        return adv, torch.ones_like(adv, dtype=torch.bool)

    def orarl(**kw: object) -> AdvantageFn:
        def fn(rewards: Tensor, r_star: Tensor) -> tuple[Tensor, Tensor]:
            out = orarl_advantages(rewards, r_star, keep=keep, **kw)  # type: ignore[arg-type]
            return out.advantages, out.keep

        return fn

    def sft(rewards: Tensor, r_star: Tensor) -> tuple[Tensor, Tensor]:
        adv = torch.zeros(rewards.shape[0], rewards.shape[1] + 1, dtype=rewards.dtype)
        adv[:, -1] = 1.0
        return adv, adv > 0

    table: dict[str, AdvantageFn] = {
        "grpo": policy_only, "naive": naive, "orarl": orarl(), "orarl_no_detach": orarl(oracle_mode=OracleMode.GAP),
        "orarl_no_prune": orarl(prune=False), "orarl_gamma0": orarl(gamma=0.0), "sft": sft,
    }  # fmt: skip
    return table[name]


def _train(config: Config, task: IntervalTask, names: tuple[str, ...], threshold: float | None) -> dict[str, Tensor]:
    """All methods side by side (method-major blocks of seed rows); final tIoU and diagnostics per seed."""
    n_m, n_s, g, n, a = len(names), config.seeds, config.prompts, config.samples, config.bins
    feats = task.features.repeat(n_m, 1, 1)
    train_r = task.reward_table(threshold=threshold).repeat(n_m, 1, 1, 1)  # [M*S, G, A, A]
    gt_s, gt_e = task.gt_start.repeat(n_m, 1), task.gt_end.repeat(n_m, 1)

    def zeros(*shape: int) -> Tensor:
        return torch.zeros(n_m * n_s, *shape, dtype=torch.float64, requires_grad=True)

    params = (zeros(config.dim, a), zeros(config.dim, a), zeros(a, a))  # W_s, W_e, U_e
    opt = torch.optim.Adam(params, lr=config.lr)
    rng = SeedRNG.from_seeds(list(range(n_s)) * n_m)
    fns = [_advantage(m, config.keep) for m in names]
    inv, flips, flip_den = torch.zeros(n_m, n_s), torch.zeros(n_m, n_s), torch.zeros(n_m, n_s)
    r_star = torch.ones(n_s * g, dtype=torch.float64)
    for _ in range(config.steps):
        start, end = sample_answers(feats, params, n, rng)  # [M*S, G, n]
        start = torch.cat([start, gt_s.unsqueeze(-1)], -1)  # oracle row appended last
        end = torch.cat([end, gt_e.unsqueeze(-1)], -1)
        rewards = train_r.flatten(-2).gather(-1, (start * a + end)[..., :n])  # [M*S, G, n]
        blocks = rewards.reshape(n_m, n_s * g, n)
        adv, kept = (torch.stack(x) for x in zip(*[fn(blocks[i], r_star) for i, fn in enumerate(fns)], strict=True))
        with torch.no_grad():  # diagnostics: inversions among policy rows with c_i > 0 (kept rows for OraRL)
            pol = adv[..., :-1].reshape(n_m, n_s, g, n)
            inv += inversion_rate(blocks.reshape(n_m, n_s, g, n), pol, kept[..., :-1].reshape(n_m, n_s, g, n))
            c = blocks - blocks.mean(-1, keepdim=True)
            sel = kept[..., :-1] & (c != 0)
            flipped = sel & (torch.sign(adv[..., :-1]) != torch.sign(c))
            flips += flipped.reshape(n_m, n_s, -1).sum(-1)
            flip_den += sel.reshape(n_m, n_s, -1).sum(-1)
        lp_start = (feats @ params[0]).log_softmax(-1).gather(-1, start)  # [M*S, G, n+1]
        end_rows = (feats @ params[1]).unsqueeze(-2) + params[2].unsqueeze(-3)  # [M*S, G, A(start), A]
        lp_end = end_rows.log_softmax(-1).gather(-2, start.unsqueeze(-1).expand(-1, -1, -1, a))
        lp_end = lp_end.gather(-1, end.unsqueeze(-1))[..., 0]
        logp = torch.stack([lp_start, lp_end], -1).reshape(n_m * n_s, -1)  # [runs, G * (n+1) * 2 tokens]
        mask = kept.reshape(n_m * n_s, -1, 1).expand(-1, -1, 2).reshape(n_m * n_s, -1)
        tok_adv = adv.reshape(n_m * n_s, -1, 1).expand(-1, -1, 2).reshape(n_m * n_s, -1)
        loss = grpo_surrogate(logp, group=2 * (n + 1), advantages=tok_adv, mask=mask)
        per_run = masked_mean(loss, mask, dim=-1)
        opt.zero_grad(set_to_none=True)
        per_run.sum().backward()
        opt.step()
    with torch.no_grad():
        probs = answer_log_probs(feats, params).exp()
        score = (probs * task.reward_table().repeat(n_m, 1, 1, 1)).sum((-2, -1)).mean(-1).reshape(n_m, n_s)
    out = {m: score[i] for i, m in enumerate(names)}
    out.update({f"inversion {m}": inv[i] / config.steps for i, m in enumerate(names)})
    out.update({f"flip {m}": flips[i] / flip_den[i].clamp(min=1) for i, m in enumerate(names)})
    return out


def run(config: Config) -> Result:
    torch.set_num_threads(1)
    task = IntervalTask.random(config.seeds, prompts=config.prompts, bins=config.bins, dim=config.dim)
    main = {k: v.numpy() for k, v in _train(config, task, config.methods, None).items()}
    metrics = [Metric(f"tIoU {m}", tuple(main[m].tolist()), paper_value=PILOT.get(m)) for m in config.methods]
    naive_inv, orarl_flip = main["inversion naive"], main["flip orarl"]
    metrics += [
        Metric("naive inversion rate", tuple(naive_inv.tolist()), note="pilot 0.084-0.151 per seed"),
        Metric("OraRL selected-row flip rate", tuple(orarl_flip.tolist()), note="pilot 0.000-0.003"),
        Metric("w/o detached oracle flip rate", tuple(main["flip orarl_no_detach"].tolist()), note="pilot 0.08-0.16"),
    ]
    r = config.margin_reason

    def d(a: str, b: str, src: dict[str, np.ndarray] = main) -> np.ndarray:
        return src[a] - src[b]

    f = config.every_seed
    comps: list[Comparison] = [
        fraction_criterion("A: OraRL - GRPO", d("orarl", "grpo"), fraction=f, margin=0.04, reason=r),
        mean_criterion("B: OraRL - naive injection (paired mean)", d("orarl", "naive"), margin=0.04, reason=r),
        fraction_criterion("B: OraRL - naive injection", d("orarl", "naive"), fraction=f, margin=0.02, reason=r),
        mean_criterion("C: naive inversion rate", naive_inv, margin=0.05, reason=r),
        mean_criterion("C: 0.01 - OraRL flip rate", 0.01 - orarl_flip, margin=0.0, reason=r),
        mean_criterion("D: OraRL - w/o detached oracle", d("orarl", "orarl_no_detach"), margin=0.03, reason=r),
        mean_criterion("naive - GRPO (paper: naive < GRPO by 4.9)", d("naive", "grpo"), margin=0.0,
                       reason="reported; the paper's direction is negative", asserted=False, paper_value=-4.9),
    ]  # fmt: skip
    for m, paper in (("orarl_gamma0", 1.5), ("orarl_no_prune", -0.4), ("sft", None)):
        if m in main:
            comps.append(mean_criterion(f"OraRL - {m}", d("orarl", m), margin=0.0, reason="ablation, reported",
                                        asserted=False, paper_value=paper))  # fmt: skip
    if config.binary_methods:
        binary = {k: v.numpy() for k, v in _train(config, task, config.binary_methods, config.binary_threshold).items()}
        for m in config.binary_methods:
            metrics.append(Metric(f"binary: tIoU {m}", tuple(binary[m].tolist()), paper_value=PILOT.get(f"binary {m}")))
        metrics.append(Metric("binary: naive inversion rate", tuple(binary["inversion naive"].tolist())))
        comps.append(mean_criterion("binary: OraRL - naive injection", d("orarl", "naive", binary), margin=0.0,
                                    reason="binary variant delimits the claim, reported", asserted=False))  # fmt: skip
    notes = "paper_value column of tIoU rows = docs: methods/orarl.md pilot; of comparisons = the paper's 4B points."
    return Result(tuple(metrics), tuple(comps), notes=notes)


register_check(
    PaperCheck(
        id="07",
        paper="Li et al. 2026, Annotations as Rollouts (OraRL), arXiv:2608.20492",
        claim="An oracle rollout with a decoupled advantage beats GRPO and naive injection, which inverts advantages",
        config_type=Config,
        run=run,
    )
)
