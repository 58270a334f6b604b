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

Simplifications: seeds run one after the other (each keeps its own variable-size buffer; tensor value
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from posttrain.estimators import aggregate, clipped_ratio_loss, group_normalized_advantages
from posttrain.estimators.replay import ReplayBuffer, replay_add, replay_init, replay_rule, replay_select
from posttrain.paper_checks import register_check
from posttrain.paper_checks._criteria import mean_and_seeds
from posttrain.paper_checks.base import Comparison, Metric, PaperCheck, Result, fraction_criterion, mean_criterion
from posttrain.simulators import sample_arms
from posttrain.validate import value_checks

__all__ = ["Config", "LinearBandit", "calibrate_tau", "run", "train_seed"]

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


def fresh_batch(env: LinearBandit, w: Tensor, config: Config, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Phase A: ``(prompts [b], actions [b, G], rewards [b, G])`` from the current policy; the only RNG use."""
    prompts = torch.randint(0, env.x.shape[0], (config.fresh_prompts,), generator=gen)
    actions = sample_arms(env.logp(w, prompts), config.group, gen)
    return prompts, actions, (actions == env.best[prompts].unsqueeze(-1)).to(torch.float64)


def _buffer_logp(env: LinearBandit, w: Tensor, buf: ReplayBuffer) -> Tensor:
    """``[C, K, 1]`` current log-probs of every stored action (the teacher-forced pass)."""
    return env.logp(w, buf.prompt).gather(-1, buf.tokens[..., 0]).unsqueeze(-1)


def train_seed(
    config: Config, seed: int, rule: str | None, tau: float, *, k_rep: int | None = None
) -> dict[str, float]:
    """One seed, one replay rule (None = on-policy matched); returns accuracy and replay diagnostics."""
    with value_checks(False):  # every tensor is valid by construction: value checks are pure overhead (~10%)
        return _train_seed(config, seed, rule, tau, k_rep=k_rep)


def _train_seed(config: Config, seed: int, rule: str | None, tau: float, *, k_rep: int | None) -> dict[str, float]:
    env = LinearBandit.make(config, seed)
    gen = torch.Generator().manual_seed(seed * 7919 + 1)
    w = torch.zeros(config.actions, config.dim, dtype=torch.float64)
    buf = replay_init(config.group, 1, dtype=torch.float64)
    k_rep = config.k_rep if k_rep is None else k_rep
    scanned = admitted = 0
    replayed_headroom: list[float] = []
    for step in range(config.steps):
        prompts, actions, rewards = fresh_batch(env, w, config, gen)
        adv = group_normalized_advantages(rewards)
        chosen = torch.zeros(0, dtype=torch.long)
        if rule is not None and buf.size > 0:  # phases B-C: rank, gate, refresh (no randomness)
            r = replay_rule(rule)
            sel, buf = replay_select(
                buf, _buffer_logp(env, w, buf), k_rep=k_rep, tau=r.threshold(tau), order=r.order, step=step
            )
            scanned += int(sel.scanned.sum())
            replayed_headroom += sel.runtime_headroom[sel.rows].tolist()
            chosen = sel.rows
        admitted += int(chosen.numel())
        wp = w.clone().requires_grad_(True)
        logp_fresh = env.logp(wp, prompts).gather(-1, actions)  # [b, G], on-policy: ratio 1
        logp_rep = env.logp(wp, buf.prompt[chosen]).gather(-1, buf.tokens[chosen, :, 0])  # [R, G]
        logp_all = torch.cat([logp_fresh, logp_rep]).reshape(-1, 1)
        old_all = torch.cat([logp_fresh.detach(), buf.logp_gen[chosen, :, 0]]).reshape(-1, 1)  # pi_old := pi_gen
        adv_all = torch.cat([adv, buf.advantages[chosen]]).reshape(-1)  # stored advantages
        mask = torch.ones_like(logp_all, dtype=torch.bool)
        loss, _ = clipped_ratio_loss(logp_all, old_all, adv_all, mask, clip_low=config.clip, clip_high=config.clip)
        (grad,) = torch.autograd.grad(aggregate(loss, mask, "token-mean"), wp)  # = mean over groups (T = 1, equal K)
        w = w - config.lr * grad
        if rule is not None:  # phase E: ingress after the update
            buf = replay_add(
                buf, tokens=actions.unsqueeze(-1), mask=torch.ones(*actions.shape, 1, dtype=torch.bool),
                rewards=rewards, advantages=adv, logp_gen=logp_fresh.detach().unsqueeze(-1), prompt=prompts,
                step=step, capacity=config.capacity,
            )  # fmt: skip
    return {
        "accuracy": env.accuracy(w),
        "acceptance": admitted / max(scanned, 1),
        "replayed_headroom": float(np.mean(replayed_headroom)) if replayed_headroom else float("nan"),
        "replayed_per_step": admitted / config.steps,
    }


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
    rates = {
        tau: float(np.mean([train_seed(config, s, "hdr", tau)["acceptance"] for s in config.calibration_seeds]))
        for tau in config.tau_grid
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
    out = {name: [train_seed(config, s, rule, tau) for s in range(config.seeds)] for name, rule in rules.items()}

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
