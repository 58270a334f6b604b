"""Paper 08: Open-MOPD, budget allocation in multi-teacher OPD (Gao et al. 2026, arXiv:2608.19098).

Claim (abstract): "Together, these mechanisms systematically restore cross-domain balance, elevating
headroom recovery from 35.6% to 83.4% in a single deployable student." Under token-mean loss a
domain's gradient share is its token share, so a short-response domain (instruction following) is
starved in multi-teacher on-policy distillation (the abstract: "a severe misallocation of the
token-level optimization budget"); per-domain token-share balancing, gap-aware budget allocation
and student reward refresh restore it.

Toy (docs: methods/open_mopd.md, `posttrain.simulators.multidomain`): 3 domains with 30 states each and
response lengths 24 / 20 / 2 states ("math", "code", "IF"); a shared linear-softmax student over 8
tokens (64 fixed random features, U initialised N(0, 0.1^2)); one linear teacher per domain with
U* ~ N(0, 8^2), hard-routed by domain. Reward: the top-4 reverse-KL reward with renormalised
student weights; loss: per-candidate dual-clip PPO (0.2 / 0.28, c = 3) summed over the 4
candidates, token mean. Rollout batch = 4 inner mini-batches of (4 math, 4 code, 2 IF) prompts
(2:2:1; IF holds ~2% of tokens); weights computed once per rollout batch; Adam lr 0.05; 100
rollout batches. Metric: per-domain headroom recovery of the capability
$E_s\\, p_S(\\arg\\max p_T\\mid s)$, macro mean over domains. One environment per seed
(generator 800 + seed; the student's start from its own generator).

Simplifications: none beyond our toy (the sampled token plays no role in the top-k loss).

Primary endpoint: Open-MOPD macro recovery - naive > 0.08 in most seeds (quantile, share 1/2,
Clopper-Pearson; recoveries are unbounded ratios, so a per-seed claim): the abstract's 35.6% ->
83.4%, with the spec's pre-registered toy margin 0.08 (in the toy naive M-OPD already recovers
~73%, so the paper's +47.8 points cannot appear; the margin asks for the toy's share of it).
Pilot (seeds 10000-10004): naive 0.726, +token share 0.860, +gap 0.857, Open-MOPD 0.853; Open-MOPD -
naive = +0.127 (sd 0.031), IF recovery 0.231 -> 0.836. Power plan: at the pilot's effect (+0.127,
the toy's; the paper's +0.478 would give power ~1 at 6 seeds) and sd, a normal difference clears
0.08 with probability 0.935 and 10 seeds (9 must clear) give power 0.86: 10 seeds (evaluation
seeds 0-9).

Secondary: IF recovery gain > 0.40 on the median and > 0 in most seeds; (share - naive) >= 0.8 x
(Open-MOPD - naive) on the median (recoveries are unbounded ratios: the location method).
Reported: the gap-following and refresh increments, and gap-following (with refresh) without token
share against naive.

Mutants: naive M-OPD in Open-MOPD's place, and Open-MOPD without its key ingredient, the budget
reallocation (`Variant.REFRESH_ONLY`: reward refresh kept, neither token share nor gap-following;
pilot: +0.001 over naive). Removing only one of the two reallocation mechanisms is not a wrong
method in this toy: either alone restores the balance (pilot: token share alone +0.134 over naive,
gap-following with refresh and no token share +0.134, IF recovery 0.65), so a "without
gap-following" mutant would rightly be reproduced; the paper itself credits gap-following and
refresh with +0.72 and +0.81 points of its +47.8.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

import torch
from torch import Tensor

from posttrain.estimators import masked_mean, topk_reverse_kl_reward
from posttrain.estimators.losses import topk_distill_loss
from posttrain.estimators.metrics import headroom_recovery
from posttrain.estimators.weights import domain_token_counts, mopd_domain_weights, refreshed_reward
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
from posttrain.simulators._base import SeedRNG
from posttrain.simulators.multidomain import MultiDomainTask

__all__ = ["CHECK", "Config", "Variant", "run"]


class Variant(StrEnum):
    """The compared configurations: naive M-OPD, then Open-MOPD's mechanisms added one by one."""

    NAIVE = "naive"
    SHARE = "share"
    SHARE_GAP = "share_gap"
    OPEN_MOPD = "open_mopd"
    NO_SHARE = "no_share"
    """Gap-following and refresh without token-share balancing (the gap factor on the natural token shares)."""
    REFRESH_ONLY = "refresh_only"
    """Open-MOPD without any budget reallocation (neither token share nor gap-following): reward refresh only."""


V = Variant
DOMAINS = ("math", "code", "if")
MECHANISMS = {V.NAIVE: (False, False, False), V.SHARE: (True, False, False), V.SHARE_GAP: (True, True, False),
              V.OPEN_MOPD: (True, True, True), V.NO_SHARE: (False, True, True),
              V.REFRESH_ONLY: (False, False, True)}  # fmt: skip
"""Each variant's mechanisms: (token-share balancing, gap-following, reward refresh)."""
COMPARED = (V.NAIVE, V.SHARE, V.SHARE_GAP, V.OPEN_MOPD, V.NO_SHARE)
"""The variants trained side by side: naive M-OPD, Open-MOPD's mechanisms added one by one, and gap-following
without token share."""
PILOT = {"naive": 0.751, "share": 0.886, "share_gap": 0.882, "open_mopd": 0.884, "naive if": 0.256, "share if": 0.865}
RECOVERY = "a headroom recovery (score - init) / (teacher - init), an unbounded ratio; assumed symmetric over seeds"


@dataclass(frozen=True)
class Config:
    seeds: int = 10  # power plan (module docstring; pilot seeds 10000-10004, sd 0.031): power 0.86 at 10
    first_seed: int = 0  # evaluation seeds first_seed .. first_seed + seeds - 1; the pilot used 10_000 ..
    lengths: tuple[int, ...] = (24, 20, 2)  # spec (math, code, IF response lengths in states)
    prompts_per_minibatch: tuple[int, ...] = (4, 4, 2)  # spec (2:2:1; IF holds ~2% of the tokens)
    inner_updates: int = 4  # spec (K_in = 4 inner mini-batches per rollout batch)
    rollout_batches: int = 100  # spec
    top_k: int = 4  # paper (top-4 reverse-KL reward)
    lr: float = 0.05  # spec (Adam)
    targets: tuple[float, ...] = (1.0, 1.0, 1.0)  # paper (equal target token shares)
    margin_reason: str = "docs: methods/open_mopd.md pass criteria"
    substitute: tuple[tuple[Variant, Variant], ...] = ()  # mutants: (variant, mechanisms of) swaps mechanisms

    @classmethod
    def smoke(cls) -> Config:
        return cls(seeds=2, rollout_batches=30)


def _seeds(config: Config) -> list[int]:
    return list(range(config.first_seed, config.first_seed + config.seeds))


def _initial_weights(config: Config, task: MultiDomainTask) -> Tensor:
    """``[S, F, V]`` the student's U, N(0, 0.1^2) per seed (generator ``seed * 1_000_003 + 808``)."""
    shape = (task.features.shape[-1], task.teacher_logp.shape[-1])
    return 0.1 * torch.stack([
        torch.randn(*shape, generator=torch.Generator().manual_seed(s * 1_000_003 + 808), dtype=torch.float64)
        for s in _seeds(config)
    ])  # fmt: skip


def _row_weights(flags: Tensor, domain: Tensor, mask: Tensor, reward: Tensor, targets: Tensor) -> Tensor:
    """``[B]`` row weights of one rollout batch for the mechanisms ``flags`` (share, gap, refresh).

    Without token-share balancing the gap factor acts on the batch's own token shares (targets =
    the domains' token counts, so every share weight is 1).
    """
    share, gap = bool(flags[0]), bool(flags[1])
    if not (share or gap):
        return mopd_domain_weights(domain, mask, reward, targets=None)
    natural = domain_token_counts(domain, mask, targets.shape[0])
    return mopd_domain_weights(domain, mask, reward, targets=targets if share else natural,
                               gap_alpha=1.0 if gap else None)  # fmt: skip


def _train(config: Config, task: MultiDomainTask) -> Tensor:
    """All configurations side by side (config-major blocks of seed rows); final capability ``[C, S, D]``."""
    n_c, n_s = len(COMPARED), config.seeds
    flags = torch.tensor([MECHANISMS[dict(config.substitute).get(v, v)] for v in COMPARED])  # [C, 3]
    feats, teacher = task.features.repeat(n_c, 1, 1), task.teacher_logp.repeat(n_c, 1, 1)  # [C*S, states, ...]
    u_param = _initial_weights(config, task).repeat(n_c, 1, 1).requires_grad_(True)
    opt = torch.optim.Adam([u_param], lr=config.lr)
    rng = SeedRNG.from_seeds(_seeds(config) * n_c)
    per_mb = torch.tensor(config.prompts_per_minibatch)
    prompt_domain = torch.arange(len(DOMAINS)).repeat_interleave(per_mb).repeat(config.inner_updates)  # [B]
    minibatch = torch.arange(config.inner_updates).repeat_interleave(int(per_mb.sum()))  # [B]
    targets = torch.tensor(config.targets, dtype=torch.float64)
    refresh = flags[:, 2].repeat_interleave(n_s).reshape(-1, 1, 1, 1)  # [C*S, 1, 1, 1]
    for _ in range(config.rollout_batches):
        states, mask = task.sample_states(prompt_domain, rng)  # [C*S, B, T], [B, T]
        with torch.no_grad():
            idx = states.reshape(n_c * n_s, -1, 1)
            logp_old_v = (feats @ u_param).log_softmax(-1).gather(1, idx.expand(-1, -1, teacher.shape[-1]))
            top = logp_old_v.topk(config.top_k, -1).indices  # [C*S, B*T, K]
            ls_old = logp_old_v.gather(-1, top).reshape(*states.shape, -1)
            lt = teacher.gather(1, idx.expand(-1, -1, teacher.shape[-1])).gather(-1, top).reshape(*states.shape, -1)
            full_mask = mask.expand(n_c * n_s, -1, -1)
            reward = topk_reverse_kl_reward(ls_old.flatten(0, 1), lt.flatten(0, 1), full_mask.flatten(0, 1))
            reward = reward.reshape(*states.shape, -1)
            weights = torch.stack(
                [  # one weighting per (config, seed) rollout batch
                    _row_weights(flags[i // n_s], prompt_domain, mask, reward[i], targets) for i in range(n_c * n_s)
                ]
            )
        for k in range(config.inner_updates):
            rows = minibatch == k
            logp_v = (feats @ u_param).log_softmax(-1).gather(1, idx.expand(-1, -1, teacher.shape[-1]))
            ls_now = logp_v.gather(-1, top).reshape(*states.shape, -1)[:, rows]  # [C*S, b, T, K]
            w = weights[:, rows]
            stored = reward[:, rows] * w[..., None, None]
            fresh = refreshed_reward(ls_now.flatten(0, 1), lt[:, rows].flatten(0, 1), full_mask[:, rows].flatten(0, 1),
                                     w.flatten()).reshape(stored.shape)  # fmt: skip
            adv = torch.where(refresh & (k > 0), fresh, stored)
            loss, _ = topk_distill_loss(ls_now.flatten(0, 1), ls_old[:, rows].flatten(0, 1), adv.flatten(0, 1),
                                        full_mask[:, rows].flatten(0, 1))  # fmt: skip
            per_run = masked_mean(loss.reshape(n_c * n_s, -1), full_mask[:, rows].reshape(n_c * n_s, -1), dim=-1)
            opt.zero_grad(set_to_none=True)
            per_run.sum().backward()
            opt.step()
    with torch.no_grad():
        return task.capability((feats @ u_param).log_softmax(-1).reshape(n_c, n_s, *teacher.shape[1:]))


def run(config: Config) -> Result:
    task = MultiDomainTask.random(_seeds(config), lengths=config.lengths)
    init = task.capability((task.features @ _initial_weights(config, task)).log_softmax(-1))  # [S, D]
    cap = _train(config, task)
    rec = headroom_recovery(cap, init, task.teacher_capability())  # [C, S, D]
    names = list(COMPARED)
    macro = {n: rec[i].mean(-1).numpy() for i, n in enumerate(names)}
    dom = {(n, d): rec[i, :, j].numpy() for i, n in enumerate(names) for j, d in enumerate(DOMAINS)}
    metrics = [Metric(f"macro recovery {n}", tuple(v.tolist()), paper_value=PILOT.get(n)) for n, v in macro.items()]
    metrics += [
        Metric(f"recovery {n} {d}", tuple(v.tolist()), paper_value=PILOT.get(f"{n} {d}")) for (n, d), v in dom.items()
    ]
    r = config.margin_reason
    gain = macro[V.OPEN_MOPD] - macro[V.NAIVE]
    if_gain = dom[V.OPEN_MOPD, "if"] - dom[V.NAIVE, "if"]
    share_part = macro[V.SHARE] - macro[V.NAIVE]
    comps: list[Comparison] = [
        quantile_criterion("Open-MOPD - naive, macro recovery", gain, margin=0.08, share=MEDIAN, reason=r,
                           role=Role.PRIMARY),
        mean_criterion("Open-MOPD - naive, IF recovery (paired mean)", if_gain, margin=0.40, reason=r,
                       assumption=RECOVERY),
        quantile_criterion("Open-MOPD - naive, IF recovery", if_gain, margin=0.0, share=MEDIAN, reason=r),
        mean_criterion("(share - naive) - 0.8 x (Open-MOPD - naive), macro (paired mean)", share_part - 0.8 * gain,
                       margin=0.0, reason=r, assumption=RECOVERY),
        mean_criterion("gap-following: share+gap - share, macro", macro[V.SHARE_GAP] - macro[V.SHARE], margin=0.0,
                       reason="reported (paper +0.72 points)", assumption=RECOVERY, role=Role.CONTEXT),
        mean_criterion("refresh: Open-MOPD - share+gap, macro", macro[V.OPEN_MOPD] - macro[V.SHARE_GAP], margin=0.0,
                       reason="reported (paper +0.81 points)", assumption=RECOVERY, role=Role.CONTEXT),
        mean_criterion("gap-following without token share: no-share - naive, macro", macro[V.NO_SHARE] - macro[V.NAIVE],
                       margin=0.0, reason="reported: the other reallocation alone", assumption=RECOVERY,
                       role=Role.CONTEXT),
    ]  # fmt: skip
    notes = (
        "paper_value column = docs: methods/open_mopd.md pilot (3 seeds). Recovery = (score - init) / (teacher - init)."
    )
    return Result(tuple(metrics), tuple(comps), notes=notes)


CHECK = register_check(
    PaperCheck(
        id="08",
        paper="Gao et al. 2026, Open-MOPD: multi-teacher on-policy distillation, arXiv:2608.19098",
        claim="Token-share balancing (plus gap-following and reward refresh) recovers the short domain's headroom",
        abstract=(
            "Together, these mechanisms systematically restore cross-domain balance, elevating headroom recovery "
            "from 35.6% to 83.4% in a single deployable student."
        ),
        config_type=Config,
        run=run,
        mutants=(
            Mutant(
                "naive-for-open-mopd",
                "naive M-OPD (no token-share balancing, gap-following or refresh) in Open-MOPD's place",
                lambda c: dataclasses.replace(c, substitute=((V.OPEN_MOPD, V.NAIVE),)),
                test_config=Config,  # the full size (~7 s): the smoke run is too small to reproduce the method
            ),
            Mutant(
                "refresh-only-for-open-mopd",
                "Open-MOPD without its key ingredient, the budget reallocation (neither token share nor gap-following; "
                "reward refresh kept)",
                lambda c: dataclasses.replace(c, substitute=((V.OPEN_MOPD, V.REFRESH_ONLY),)),
                test_config=Config,
            ),
        ),
    )
)

if __name__ == "__main__":
    raise SystemExit(main_for(CHECK))
