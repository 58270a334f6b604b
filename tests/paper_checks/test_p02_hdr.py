"""Paper check 02 (HDR): contract, determinism, and the fresh on-policy stream left untouched by replay."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from posttrain.paper_checks import p02_hdr
from posttrain.paper_checks.p02_hdr import Config, run, train_seed

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

    def spy(env, w, config, gen):  # type: ignore[no-untyped-def]
        states[current].append(gen.get_state().clone())
        out = original(env, w, config, gen)
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

    def no_run(*args: object, **kwargs: object) -> dict[str, float]:
        raise AssertionError("the default calibration must come from the cache")

    monkeypatch.setattr(p02_hdr, "train_seed", no_run)
    cfg = Config()
    tau, rates = p02_hdr.calibrate_tau(cfg)
    assert tau in cfg.tau_grid and set(rates) == set(cfg.tau_grid) and len(cfg.tau_grid) == 21
    assert not set(cfg.calibration_seeds) & set(range(cfg.seeds))  # calibration seeds are not evaluation seeds
    mid = sum(cfg.acceptance_band) / 2
    assert abs(rates[tau] - mid) == min(abs(r - mid) for r in rates.values())


def test_calibration_rule_targets_the_band_middle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mean acceptance over the calibration seeds, nearest the band's middle (not its edge)."""
    fake = {1e-3: 0.5, 1e-2: 0.71, 3e-2: 0.78, 1e-1: 0.84}

    def accept(config: Config, seed: int, rule: str, tau: float) -> dict[str, float]:
        return {"acceptance": fake[tau] + (0.01 if seed % 2 else -0.01)}

    monkeypatch.setattr(p02_hdr, "train_seed", accept)
    cfg = dataclasses.replace(Config(), tau_grid=tuple(fake), calibration_seeds=(10_000, 10_001))
    tau, rates = p02_hdr.calibrate_tau(cfg, cache=False)
    assert tau == 3e-2 and rates[1e-2] == pytest.approx(0.71)


@pytest.mark.slow
def test_cached_calibration_is_reproduced() -> None:
    cfg = Config()
    assert p02_hdr.calibrate_tau(cfg, cache=False) == p02_hdr.calibrate_tau(cfg)
