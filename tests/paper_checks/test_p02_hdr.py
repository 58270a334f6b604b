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
