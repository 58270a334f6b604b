"""Paper 02: Headroom-Drift Replay beats naive replay in GRPO (Park & Chang 2026, arXiv:2609.03941).

Claim: replaying stored GRPO groups ranked by *headroom* and gated by *policy drift* improves on
naive recency replay, and does not fall below on-policy GRPO at matched fresh batch; the admitted
groups carry more learning signal (higher refreshed headroom) than naively replayed ones.

Toy (docs: methods/hdr.md): a linear contextual bandit, 256 prompts x ~ N(0, I/16) in R^16, 16
actions, correct action argmax_a (V x)_a with V ~ 2 N(0, 1) fixed per seed, binary reward; policy
softmax(W x), W = 0 at start, plain SGD lr 2. 200 steps; a fresh batch of 16 prompts x 8 samples
with GRPO std-normalised advantages; mixed-outcome ingress into a FIFO buffer of 32 groups after
the update; K_rep = 8 replayed groups per step. Update: mean over groups (fresh + replayed) of each
group's token-mean PPO-clip loss (`clipped_ratio_loss`); fresh groups
are on-policy (ratio 1), replayed groups use pi_theta / pi_gen with clip 0.2 and their stored
advantages. Rules (`REPLAY_RULES`): on-policy matched, naive
recency replay, headroom-only (tau = inf), drift-only (recency + gate), HDR. Metric: final exact
accuracy E_x[pi(a*(x)|x)] over all 256 prompts. 12 paired seeds (same prompts, teacher V and
fresh-sampling stream across rules; replay consumes no random numbers).

tau calibration, fixed before any evaluation run: the grid is 10 log-spaced values per decade
from 1e-3 to 1e-1; HDR's acceptance rate (admitted / scanned groups) is averaged over 4 calibration
seeds (10000-10003, disjoint from the evaluation seeds 0, 1, ...); the chosen tau is the grid value
whose mean acceptance is nearest the middle of the paper's band [0.7, 0.85]. The result for the
default config is cached in ``_p02_calibration.json`` (key: every config field the calibration
reads), so the check does not redo it; any other config recalibrates. The verdict turns on tau:
an earlier coarse grid (3 values per decade) on one seed chose 5e-3 (acceptance 0.72, the strict
edge of the band), where HD - naive is about +0.003; this rule was fixed instead of tuning tau.

Simplifications: the runs (seed x rule, or seed x tau in the calibration) train side by side, the
policy forward, loss and gradient batched over runs; each run keeps its own generator and its own
variable-size buffer, which `replay_select` and `replay_add` handle one run at a time (tensor value
checks are off inside a run, the inputs being valid by construction); the
stored generation log-probs are the trainer's own (no engine mismatch).

Asserted (the paper's pass criteria): paired mean(HD - naive) > 0 and HD > naive in >= 6/8 of the
seeds; paired mean(HD - on-policy) > -0.005; refreshed headroom of HD-admitted groups > that of
naive-replayed groups in >= 7/8 of the seeds. Reported: headroom-only and drift-only ablations,
acceptance rates.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from posttrain.estimators import clipped_ratio_loss, group_normalized_advantages
from posttrain.estimators.replay import ReplayBuffer, ReplayRule, replay_add, replay_init, replay_rule, replay_select
from posttrain.paper_checks import register_check
from posttrain.paper_checks._criteria import mean_and_seeds
from posttrain.paper_checks.base import Comparison, Metric, PaperCheck, Result, fraction_criterion, mean_criterion
from posttrain.simulators import SeedRNG, sample_arms
from posttrain.validate import value_checks

__all__ = ["Config", "LinearBandit", "calibrate_tau", "run", "train_runs", "train_seed"]

CALIBRATION_CACHE = Path(__file__).with_name("_p02_calibration.json")
_NOT_CALIBRATION = ("seeds", "margin_reason", "on_policy_slack")  # config fields the calibration never reads


def _log_grid(low_exp: int, high_exp: int, per_decade: int) -> tuple[float, ...]:
    """``10 ** (k / per_decade)`` for k from ``low_exp * per_decade`` to ``high_exp * per_decade``."""
    return tuple(
        float(f"{10.0 ** (k / per_decade):.6g}") for k in range(low_exp * per_decade, high_exp * per_decade + 1)
    )


@dataclass(frozen=True)
class Config:
    seeds: int = 12
    prompts: int = 256
    dim: int = 16
    actions: int = 16
    steps: int = 200
    fresh_prompts: int = 16
    group: int = 8
    k_rep: int = 8
    capacity: int = 32
    lr: float = 2.0
    clip: float = 0.2
    tau_grid: tuple[float, ...] = _log_grid(-3, -1, 10)
    calibration_seeds: tuple[int, ...] = (10_000, 10_001, 10_002, 10_003)
    acceptance_band: tuple[float, float] = (0.7, 0.85)
    on_policy_slack: float = 0.005
    vs_naive_fraction: float = 6 / 8
    headroom_fraction: float = 7 / 8
    margin_reason: str = "paper pass criteria: HD - naive > 0, >= 6/8 seeds; HD >= on-policy - 0.005; headroom 7/8"

    @classmethod
    def smoke(cls) -> Config:
        return cls(seeds=2, steps=80, tau_grid=(3e-3, 1e-2, 3e-2), calibration_seeds=(10_000,))


@dataclass(frozen=True)
class LinearBandit:
    """Prompts ``x [N, D]`` and the correct action ``a*(x) [N]`` of one seed, with the exact accuracy."""

    x: Tensor
    best: Tensor

    @classmethod
    def make(cls, config: Config, seed: int) -> LinearBandit:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(config.prompts, config.dim, generator=g, dtype=torch.float64) / math.sqrt(config.dim)
        v = 2.0 * torch.randn(config.actions, config.dim, generator=g, dtype=torch.float64)
        return cls(x, (x @ v.T).argmax(-1))

    def logp(self, w: Tensor, prompts: Tensor) -> Tensor:
        """``[..., A]`` log pi(.|x_p) for prompt indices ``prompts [...]``."""
        return torch.log_softmax(self.x[prompts] @ w.T, dim=-1)

    def accuracy(self, w: Tensor) -> float:
        return float(self.logp(w, torch.arange(self.x.shape[0])).exp().gather(-1, self.best.unsqueeze(-1)).mean())


def fresh_batch(logp: Tensor, best: Tensor, config: Config, rng: SeedRNG) -> tuple[Tensor, Tensor, Tensor]:
    """Phase A of every run: ``(prompts [R, b], actions [R, b, G], rewards [R, b, G])``; the only RNG use.

    ``logp [R, N, A]`` is each run's current policy on every prompt, ``best [R, N]`` its correct
    actions; run ``r`` draws its prompts, then its uniforms, from its own generator ``rng.generators[r]``.
    """
    prompts = torch.stack(
        [torch.randint(0, logp.shape[1], (config.fresh_prompts,), generator=g) for g in rng.generators]
    )
    rows = torch.arange(logp.shape[0]).unsqueeze(-1)
    actions = sample_arms(logp[rows, prompts], config.group, rng)
    return prompts, actions, (actions == best[rows, prompts].unsqueeze(-1)).to(torch.float64)


def train_seed(
    config: Config, seed: int, rule: str | None, tau: float, *, k_rep: int | None = None
) -> dict[str, float]:
    """One seed, one replay rule (None = on-policy matched); returns accuracy and replay diagnostics."""
    return train_runs(config, [(seed, rule, tau)], k_rep=k_rep)[0]


def train_runs(
    config: Config, runs: Sequence[tuple[int, str | None, float]], *, k_rep: int | None = None
) -> list[dict[str, float]]:
    """Independent runs ``(seed, rule, tau)`` trained side by side; one `train_seed` result per run.

    Each run has its own prompts, teacher, generator (``seed * 7919 + 1``), weights and replay
    buffer; the policy forward, the loss and the gradient are batched over runs (the summed
    per-run losses have each run's own gradient), the buffers go through `replay_select` and
    `replay_add` one run at a time.
    """
    with value_checks(False):  # every tensor is valid by construction: value checks are pure overhead (~10%)
        return _train_runs(config, list(runs), k_rep=config.k_rep if k_rep is None else k_rep)


def _train_runs(config: Config, runs: list[tuple[int, str | None, float]], *, k_rep: int) -> list[dict[str, float]]:
    n_runs, groups = len(runs), config.group
    envs = [LinearBandit.make(config, seed) for seed, _, _ in runs]
    x = torch.stack([e.x for e in envs])  # [R, N, D]
    best = torch.stack([e.best for e in envs])  # [R, N]
    rng = SeedRNG(tuple(torch.Generator().manual_seed(seed * 7919 + 1) for seed, _, _ in runs))
    rules = [None if rule is None else replay_rule(rule) for _, rule, _ in runs]
    w = torch.zeros(n_runs, config.actions, config.dim, dtype=torch.float64)
    bufs = [replay_init(groups, 1, dtype=torch.float64) for _ in runs]
    scanned, admitted = [0] * n_runs, [0] * n_runs
    replayed_headroom: list[list[float]] = [[] for _ in runs]
    fresh_owner = torch.arange(n_runs).repeat_interleave(config.fresh_prompts * groups)
    for step in range(config.steps):
        wp = w.clone().requires_grad_(True)
        logp = _policy_logp(x, wp)  # [R, N, A], every run's policy on every prompt (one batched product)
        prompts, actions, rewards = fresh_batch(logp.detach(), best, config, rng)
        adv = group_normalized_advantages(rewards.reshape(-1, groups)).reshape(rewards.shape)
        chosen = _replay_phase(logp.detach(), bufs, rules, runs, k_rep, step, scanned, replayed_headroom)
        for r, c in enumerate(chosen):
            admitted[r] += int(c.numel())
        rep_run, rep_prompt, rep_tokens, rep_logp_gen, rep_adv = _admitted_rows(bufs, chosen)
        rows = torch.arange(n_runs).unsqueeze(-1)
        logp_fresh = logp[rows, prompts].gather(-1, actions)  # [R, b, G], on-policy: ratio 1
        logp_rep = logp[rep_run, rep_prompt].gather(-1, rep_tokens)  # [M, G]
        logp_all = torch.cat([logp_fresh.reshape(-1), logp_rep.reshape(-1)]).unsqueeze(-1)
        old_all = torch.cat([logp_fresh.detach().reshape(-1), rep_logp_gen.reshape(-1)]).unsqueeze(-1)  # pi_gen
        adv_all = torch.cat([adv.reshape(-1), rep_adv.reshape(-1)])  # stored advantages
        mask = torch.ones_like(logp_all, dtype=torch.bool)
        loss, _ = clipped_ratio_loss(logp_all, old_all, adv_all, mask, clip_low=config.clip, clip_high=config.clip)
        owner = torch.cat([fresh_owner, rep_run.repeat_interleave(groups)])
        # each run's token-mean (= mean over its groups of their token means: T = 1, equal K)
        total = loss.new_zeros(n_runs).index_add(0, owner, loss[:, 0])
        count = torch.bincount(owner, minlength=n_runs).to(loss.dtype)
        (grad,) = torch.autograd.grad((total / count).sum(), wp)  # runs are independent: row r is run r's gradient
        w = w - config.lr * grad
        for r, rule in enumerate(rules):  # phase E: ingress after the update
            if rule is not None:
                bufs[r] = replay_add(
                    bufs[r], tokens=actions[r].unsqueeze(-1), mask=torch.ones(*actions.shape[1:], 1, dtype=torch.bool),
                    rewards=rewards[r], advantages=adv[r], logp_gen=logp_fresh[r].detach().unsqueeze(-1),
                    prompt=prompts[r], step=step, capacity=config.capacity,
                )  # fmt: skip
    accuracy = _policy_logp(x, w).exp().gather(-1, best.unsqueeze(-1))[..., 0].mean(-1)
    return [
        {
            "accuracy": float(accuracy[r]),
            "acceptance": admitted[r] / max(scanned[r], 1),
            "replayed_headroom": float(np.mean(replayed_headroom[r])) if replayed_headroom[r] else float("nan"),
            "replayed_per_step": admitted[r] / config.steps,
        }
        for r in range(n_runs)
    ]


def _policy_logp(x: Tensor, w: Tensor) -> Tensor:
    """``[R, N, A]`` log pi_r(.|x) of every run on every prompt: softmax(W_r x)."""
    return torch.log_softmax(torch.bmm(x, w.transpose(1, 2)), dim=-1)


def _admitted_rows(bufs: list[ReplayBuffer], chosen: list[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The admitted groups of all runs stacked: ``(run [M], prompt [M], actions [M, G], logp_gen [M, G],
    advantages [M, G])``."""
    offsets = np.cumsum([0] + [b.size for b in bufs[:-1]]).tolist()
    index = torch.cat([c + off for c, off in zip(chosen, offsets, strict=True)])
    run = torch.cat([torch.full((c.numel(),), r, dtype=torch.long) for r, c in enumerate(chosen)])
    return (
        run,
        torch.cat([b.prompt for b in bufs])[index],
        torch.cat([b.tokens[..., 0] for b in bufs])[index],
        torch.cat([b.logp_gen[..., 0] for b in bufs])[index],
        torch.cat([b.advantages for b in bufs])[index],
    )


def _replay_phase(
    logp: Tensor,
    bufs: list[ReplayBuffer],
    rules: list[ReplayRule | None],
    runs: list[tuple[int, str | None, float]],
    k_rep: int,
    step: int,
    scanned: list[int],
    replayed_headroom: list[list[float]],
) -> list[Tensor]:
    """Phases B-C of every replay run (rank, gate, refresh; no randomness): the admitted rows of each buffer."""
    chosen = []
    for r, (rule, buf) in enumerate(zip(rules, bufs, strict=True)):
        if rule is None or buf.size == 0:
            chosen.append(torch.zeros(0, dtype=torch.long))
            continue
        stored = logp[r, buf.prompt].gather(-1, buf.tokens[..., 0]).unsqueeze(-1)  # [C, K, 1] teacher-forced pass
        sel, bufs[r] = replay_select(
            buf, stored, k_rep=k_rep, tau=rule.threshold(runs[r][2]), order=rule.order, step=step
        )
        scanned[r] += int(sel.scanned.sum())
        replayed_headroom[r] += sel.runtime_headroom[sel.rows].tolist()
        chosen.append(sel.rows)
    return chosen


def _calibration_key(config: Config) -> dict[str, object]:
    return {k: v for k, v in json.loads(json.dumps(dataclasses.asdict(config))).items() if k not in _NOT_CALIBRATION}


def calibrate_tau(config: Config, *, cache: bool = True) -> tuple[float, dict[float, float]]:
    """The pre-registered tau: the grid value whose HDR acceptance, averaged over the calibration seeds,
    is nearest the middle of ``acceptance_band``; returns it with the mean acceptance of every grid value.

    With ``cache``, a stored calibration of the same config (``_p02_calibration.json``) is returned as is.
    """
    key = _calibration_key(config)
    if cache and CALIBRATION_CACHE.exists():
        for entry in json.loads(CALIBRATION_CACHE.read_text()):
            if entry["key"] == key:
                return float(entry["tau"]), {float(t): float(r) for t, r in entry["rates"]}
    seeds = config.calibration_seeds
    out = train_runs(config, [(s, "hdr", tau) for tau in config.tau_grid for s in seeds])  # all taus side by side
    rates = {
        tau: float(np.mean([r["acceptance"] for r in out[i * len(seeds) : (i + 1) * len(seeds)]]))
        for i, tau in enumerate(config.tau_grid)
    }
    mid = 0.5 * sum(config.acceptance_band)
    return min(config.tau_grid, key=lambda t: abs(rates[t] - mid)), rates


def write_calibration(config: Config | None = None) -> float:
    """Recompute the calibration of ``config`` (default: the full config) and store it in the cache file."""
    config = Config() if config is None else config
    tau, rates = calibrate_tau(config, cache=False)
    key = _calibration_key(config)
    entries = json.loads(CALIBRATION_CACHE.read_text()) if CALIBRATION_CACHE.exists() else []
    entries = [e for e in entries if e["key"] != key]
    entries.append({"key": key, "tau": tau, "rates": [[t, r] for t, r in rates.items()]})
    CALIBRATION_CACHE.write_text(json.dumps(entries, indent=1) + "\n")
    return tau


def run(config: Config) -> Result:
    torch.set_num_threads(1)
    tau, rates = calibrate_tau(config)
    rules: dict[str, str | None] = {
        "on_policy": None, "naive": "naive_recency", "headroom_only": "headroom_only",
        "drift_only": "drift_only", "hdr": "hdr",
    }  # fmt: skip
    flat = train_runs(config, [(s, rule, tau) for rule in rules.values() for s in range(config.seeds)])
    out = {name: flat[i * config.seeds : (i + 1) * config.seeds] for i, name in enumerate(rules)}

    def col(name: str, key: str) -> np.ndarray:
        return np.array([r[key] for r in out[name]])

    paper = {"on_policy": 0.3874, "naive": 0.3891, "headroom_only": 0.3841, "drift_only": 0.3892, "hdr": 0.3942}
    metrics = [
        Metric(f"accuracy {n}", tuple(col(n, "accuracy").tolist()), paper_value=paper[n], note="pilot (tau 1e-2)")
        for n in rules
    ]
    for n in ("naive", "headroom_only", "drift_only", "hdr"):
        metrics += [
            Metric(f"{k} {n}", tuple(col(n, k).tolist()))
            for k in ("acceptance", "replayed_headroom", "replayed_per_step")
        ]
    lo, hi = config.acceptance_band
    metrics.append(
        Metric(
            "calibrated tau",
            (tau,),
            note=f"mean acceptance over calibration seeds {list(config.calibration_seeds)}, target {(lo + hi) / 2:.3g}: "
            + ", ".join(f"{t:g}: {r:.3f}" for t, r in rates.items()),
        )
    )
    reason = config.margin_reason
    hd = col("hdr", "accuracy")
    comps: list[Comparison] = mean_and_seeds(
        "HD - naive", hd - col("naive", "accuracy"), mean_margin=0.0, fraction=config.vs_naive_fraction, reason=reason
    )
    comps.append(
        mean_criterion(
            "HD - on-policy", hd - col("on_policy", "accuracy"), margin=-config.on_policy_slack, reason=reason
        )
    )
    comps.append(
        fraction_criterion(
            "replayed headroom HD - naive",
            col("hdr", "replayed_headroom") - col("naive", "replayed_headroom"),
            fraction=config.headroom_fraction,
            reason=reason,
        )
    )
    for n in ("headroom_only", "drift_only"):
        comps.append(
            mean_criterion(
                f"HD - {n}", hd - col(n, "accuracy"), margin=0.0, reason="ablation, reported", asserted=False
            )
        )
    notes = f"tau {tau:g} (HDR acceptance {rates[tau]:.3f} on the calibration seeds; band [{lo}, {hi}])"
    return Result(tuple(metrics), tuple(comps), notes=notes)


register_check(
    PaperCheck(
        id="02",
        paper="Park & Chang 2026, Headroom-Drift Replay, arXiv:2609.03941",
        claim="Headroom-ranked, drift-gated replay beats naive recency replay and is not worse than on-policy GRPO",
        config_type=Config,
        run=run,
    )
)


if __name__ == "__main__":  # python -m posttrain.paper_checks.p02_hdr: refresh the cached calibration
    print(f"calibrated tau: {write_calibration():g}")
