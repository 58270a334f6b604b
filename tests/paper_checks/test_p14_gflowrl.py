"""Paper check 14 (GFlowRL): structural contract and determinism on the smoke config."""

from __future__ import annotations

import dataclasses
import math

from posttrain.paper_checks.p14_gflowrl import Config, run

TINY = dataclasses.replace(Config.smoke(), steps=60)


def test_smoke_contract_and_determinism() -> None:
    a, b = run(TINY), run(TINY)
    assert a.metrics and a.comparisons
    assert all(math.isfinite(x) for m in a.metrics for x in m.per_seed)
    tv = {m.name: m.per_seed for m in a.metrics}
    assert all(0.0 <= x <= 1.0 for name, v in tv.items() if name.startswith("tv") for x in v)
    assert [m.per_seed for m in a.metrics] == [m.per_seed for m in b.metrics]


def test_constant_log_z_gap_replaces_only_the_partition() -> None:
    """The mutant's gaps are GFlowRL's shifted by (constant - in-batch estimate), then clipped."""
    import torch

    from posttrain.estimators import flow_gap
    from posttrain.paper_checks.p14_gflowrl import _constant_log_z_gap

    cfg = dataclasses.replace(Config(), constant_log_z=0.3)
    g = torch.Generator().manual_seed(0)
    rewards = (torch.rand(2, 4, generator=g) < 0.5).to(torch.float64)
    lo, lr_ = -torch.rand(8, 1, generator=g, dtype=torch.float64), -torch.rand(8, 1, generator=g, dtype=torch.float64)
    mask = torch.ones(8, 1, dtype=torch.bool)
    fg = flow_gap(rewards, lo, lr_, mask, beta=cfg.beta, variant="cprime", max_up=cfg.max_up, max_down=cfg.max_down)
    const = _constant_log_z_gap(cfg, rewards, lo, lr_, mask)
    torch.testing.assert_close(const.gap, fg.gap - fg.log_partition.unsqueeze(-1) + 0.3)
    assert bool((const.clipped_gap >= -cfg.max_up).all() and (const.clipped_gap <= cfg.max_down).all())


def test_seed_count_follows_the_power_plan() -> None:
    from posttrain.paper_checks._plans import seeds_for_share

    assert Config().seeds == seeds_for_share(0.9)
