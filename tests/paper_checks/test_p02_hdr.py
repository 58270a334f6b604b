"""Paper check 02 (HDR): contract, determinism, and the fresh on-policy stream left untouched by replay."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from posttrain.estimators import (
    aggregate,
    clipped_ratio_loss,
    group_normalized_advantages,
    replay_add,
    replay_init,
    replay_select,
)
from posttrain.estimators.selection import replay_rule
from posttrain.paper_checks import p02_hdr
from posttrain.paper_checks._plans import seeds_for_share
from posttrain.paper_checks.p02_hdr import Config, run, train_seed
from posttrain.simulators import sample_arms
from posttrain.validate import value_checks

TINY = dataclasses.replace(Config.smoke(), steps=12, tau_grid=(1e-2,))


def test_smoke_contract_and_determinism() -> None:
    a, b = run(TINY), run(TINY)
    assert a.metrics and a.comparisons
    assert all(math.isfinite(x) for m in a.metrics for x in m.per_seed)
    assert [m.per_seed for m in a.metrics] == [m.per_seed for m in b.metrics]


@pytest.mark.parametrize("rule", ["hdr", "naive_recency"])
def test_zero_budget_replay_is_bit_identical_to_on_policy(rule: str) -> None:
    cfg = dataclasses.replace(TINY, steps=15)
    on = train_seed(cfg, 0, None, 1e-2)
    off = train_seed(cfg, 0, rule, 1e-2, k_rep=0)
    assert off["accuracy"] == on["accuracy"] and off["replayed_per_step"] == 0.0


def test_fresh_stream_is_untouched_by_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replay consumes no random numbers: the rollout generator is in the same state before every fresh batch."""
    states: dict[str, list[torch.Tensor]] = {}
    batches: dict[str, list[torch.Tensor]] = {}
    original = p02_hdr.fresh_batch

    def spy(logp, best, config, rng):  # type: ignore[no-untyped-def]
        states[current].append(rng.generators[0].get_state().clone())
        out = original(logp, best, config, rng)
        batches[current].append(out[0])
        return out

    monkeypatch.setattr(p02_hdr, "fresh_batch", spy)
    cfg = dataclasses.replace(TINY, steps=12)
    for current in ("on", "hdr"):
        states[current], batches[current] = [], []
        train_seed(cfg, 1, None if current == "on" else "hdr", 1e-2)
    assert all(torch.equal(a, b) for a, b in zip(states["on"], states["hdr"], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(batches["on"], batches["hdr"], strict=True))  # same prompts
    assert train_seed(cfg, 1, "hdr", 1e-2)["replayed_per_step"] > 0  # replay was active


def test_default_calibration_is_pre_registered_and_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    """The full config's tau comes from the stored calibration (no run), on a 10-per-decade grid."""

    def no_run(*args: object, **kwargs: object) -> list[dict[str, float]]:
        raise AssertionError("the default calibration must come from the cache")

    monkeypatch.setattr(p02_hdr, "train_runs", no_run)
    cfg = Config()
    tau, rates = p02_hdr.calibrate_tau(cfg)
    assert tau in cfg.tau_grid and set(rates) == set(cfg.tau_grid) and len(cfg.tau_grid) == 21
    assert not set(cfg.calibration_seeds) & set(range(cfg.seeds))  # calibration seeds are not evaluation seeds
    mid = sum(cfg.acceptance_band) / 2
    assert abs(rates[tau] - mid) == min(abs(r - mid) for r in rates.values())


def test_calibration_rule_targets_the_band_middle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mean acceptance over the calibration seeds, nearest the band's middle (not its edge)."""
    fake = {1e-3: 0.5, 1e-2: 0.71, 3e-2: 0.78, 1e-1: 0.84}

    def accept(config: Config, runs: list[tuple[int, str, float]]) -> list[dict[str, float]]:
        return [{"acceptance": fake[tau] + (0.01 if seed % 2 else -0.01)} for seed, _, tau in runs]

    monkeypatch.setattr(p02_hdr, "train_runs", accept)
    cfg = dataclasses.replace(Config(), tau_grid=tuple(fake), calibration_seeds=(10_000, 10_001))
    tau, rates = p02_hdr.calibrate_tau(cfg, cache=False)
    assert tau == 3e-2 and rates[1e-2] == pytest.approx(0.71)


@pytest.mark.slow
def test_cached_calibration_is_reproduced() -> None:
    cfg = Config()
    assert p02_hdr.calibrate_tau(cfg, cache=False) == p02_hdr.calibrate_tau(cfg)


def _one_run_loop(config: Config, seed: int, rule: str | None, tau: float) -> dict[str, float]:
    """The check's training loop for one run, unbatched (its form before runs were batched)."""
    env = p02_hdr.LinearBandit.make(config, seed)
    gen = torch.Generator().manual_seed(seed * 7919 + 1)
    w = torch.zeros(config.actions, config.dim, dtype=torch.float64)
    buf = replay_init(config.group, 1, dtype=torch.float64)
    scanned = admitted = 0
    headrooms: list[float] = []
    for step in range(config.steps):
        prompts = torch.randint(0, env.x.shape[0], (config.fresh_prompts,), generator=gen)
        actions = sample_arms(env.logp(w, prompts), config.group, gen)
        rewards = (actions == env.best[prompts].unsqueeze(-1)).to(torch.float64)
        adv = group_normalized_advantages(rewards)
        chosen = torch.zeros(0, dtype=torch.long)
        if rule is not None and buf.size > 0:
            r = replay_rule(rule)
            stored = env.logp(w, buf.prompt).gather(-1, buf.tokens[..., 0]).unsqueeze(-1)
            sel, buf = replay_select(buf, stored, k_rep=config.k_rep, tau=r.threshold(tau), order=r.order, step=step)
            scanned += int(sel.scanned.sum())
            headrooms += sel.runtime_headroom[sel.rows].tolist()
            chosen = sel.rows
        admitted += int(chosen.numel())
        wp = w.clone().requires_grad_(True)
        lp_fresh = env.logp(wp, prompts).gather(-1, actions)
        lp_rep = env.logp(wp, buf.prompt[chosen]).gather(-1, buf.tokens[chosen, :, 0])
        lp = torch.cat([lp_fresh, lp_rep]).reshape(-1, 1)
        old = torch.cat([lp_fresh.detach(), buf.logp_gen[chosen, :, 0]]).reshape(-1, 1)
        a = torch.cat([adv, buf.advantages[chosen]]).reshape(-1)
        mask = torch.ones_like(lp, dtype=torch.bool)
        loss, _ = clipped_ratio_loss(lp, old, a, mask, clip_low=config.clip, clip_high=config.clip)
        (grad,) = torch.autograd.grad(aggregate(loss, mask, "token-mean"), wp)
        w = w - config.lr * grad
        if rule is not None:
            buf = replay_add(
                buf, tokens=actions.unsqueeze(-1), mask=torch.ones(*actions.shape, 1, dtype=torch.bool),
                rewards=rewards, advantages=adv, logp_gen=lp_fresh.detach().unsqueeze(-1), prompt=prompts,
                step=step, capacity=config.capacity,
            )  # fmt: skip
    return {
        "accuracy": env.accuracy(w),
        "acceptance": admitted / max(scanned, 1),
        "replayed_headroom": float(np.mean(headrooms)) if headrooms else float("nan"),
        "replayed_per_step": admitted / config.steps,
    }


def test_batched_runs_equal_one_run_at_a_time() -> None:
    """Runs trained side by side (every rule, two seeds, two taus) give each run's unbatched result:
    the same replay decisions exactly, the accuracy and headroom to float64 rounding."""
    cfg = dataclasses.replace(Config(), steps=40)
    runs = [
        (s, rule, tau)
        for rule in (None, "naive_recency", "headroom_only", "drift_only", "hdr")
        for s in (0, 3)
        for tau in (3e-3, 1e-2)
    ][::2]
    batched = p02_hdr.train_runs(cfg, runs)
    for run_, got in zip(runs, batched, strict=True):
        with value_checks(False):
            want = _one_run_loop(cfg, *run_)
        assert got["acceptance"] == want["acceptance"] and got["replayed_per_step"] == want["replayed_per_step"]
        assert got["accuracy"] == pytest.approx(want["accuracy"], rel=0, abs=1e-12)
        assert math.isnan(want["replayed_headroom"]) == math.isnan(got["replayed_headroom"])
        if not math.isnan(want["replayed_headroom"]):
            assert got["replayed_headroom"] == pytest.approx(want["replayed_headroom"], rel=0, abs=1e-12)
    assert any(r["replayed_per_step"] > 0 for r in batched) and any(0 < r["acceptance"] < 1 for r in batched)


def test_primary_plan_and_seed_ranges() -> None:
    """The primary is the per-seed claim; its seed count is the plan's; the pilot range shares no
    seed with the calibration or the evaluation, and moving the range does not recalibrate."""
    cfg = Config()
    assert cfg.seeds == seeds_for_share(0.9)
    pilot = set(range(20_000, 20_016))
    assert not pilot & set(cfg.calibration_seeds) and not pilot & set(range(cfg.seeds))
    assert p02_hdr._calibration_key(cfg) == p02_hdr._calibration_key(dataclasses.replace(cfg, first_seed=20_000))
    result = run(TINY)
    assert result.primary.name == "HD - naive" and result.primary.share == 0.5
