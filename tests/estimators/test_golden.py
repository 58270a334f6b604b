"""posttrain's core estimators against verl 0.9.1's outputs (shared/golden), float64."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from posttrain.estimators import (
    aggregate,
    clipped_ratio_loss,
    group_normalized_advantages,
    gspo_loss,
    k1_kl,
    k2_kl,
    k3_kl,
    pass_at_k,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)

GOLDEN_CANDIDATES = [
    Path(__file__).resolve().parent / "data" / "verl-0.9.1-core.json",  # a copy of shared/golden
    Path(__file__).resolve().parents[3] / "shared" / "golden" / "verl-0.9.1-core.json",
]
GOLDEN = next((p for p in GOLDEN_CANDIDATES if p.exists()), None)
pytestmark = pytest.mark.skipif(GOLDEN is None, reason="verl golden vectors (shared/golden) not found")
TOL = dict(rtol=1e-10, atol=1e-12)
VERL_EPS_REL = 1e-7  # verl's agg_loss adds 1e-8 to per-row token counts (n_i >= 1 here)


@pytest.fixture(scope="module")
def g() -> dict:
    assert GOLDEN is not None
    return json.loads(GOLDEN.read_text())


def t(x: object) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def test_group_advantages_match_verl(g: dict) -> None:
    r = t(g["rewards"])
    torch.testing.assert_close(group_normalized_advantages(r).reshape(-1), t(g["grpo_scaled_eps1e-6"]), **TOL)
    torch.testing.assert_close(
        group_normalized_advantages(r, scale_by_std=False).reshape(-1), t(g["drgrpo_unscaled"]), **TOL
    )
    torch.testing.assert_close(rloo_advantages(r).reshape(-1), t(g["rloo"]), **TOL)


def test_reinforce_pp_baseline_matches_verl(g: dict) -> None:
    mask = t(g["mask"]).bool()
    out = reinforce_pp_baseline_advantages(t(g["rewards"]), mask)
    torch.testing.assert_close(out, t(g["reinforce_pp_baseline_tokens"]), rtol=1e-7, atol=1e-9)


def test_ppo_clip_loss_matches_verl(g: dict) -> None:
    mask = t(g["mask"]).bool()
    lp, old, adv = t(g["logp"]), t(g["logp_old"]), t(g["advantages_tokens"])
    assert g["ppo_clip_loss"], "golden file has no ppo entries"
    for key, expected in g["ppo_clip_loss"].items():
        opts = dict(kv.split("=") for kv in key.split(","))
        dual = None if opts["dual_clip"] in ("None", "none") else float(opts["dual_clip"])
        loss, _ = clipped_ratio_loss(
            lp, old, adv, mask, clip_low=float(opts["clip_low"]), clip_high=float(opts["clip_high"]), dual_clip=dual
        )
        got = aggregate(loss, mask, opts["mode"])
        # verl divides sequence means by (n_i + 1e-8); that shifts results by ~1e-8 relative.
        assert float(got) == pytest.approx(expected, rel=VERL_EPS_REL, abs=1e-12), key


def test_gspo_matches_verl(g: dict) -> None:
    mask = t(g["mask"]).bool()
    key = next(k for k in g if k.startswith("gspo"))
    adv_seq = t(g["advantages_tokens"])[:, 0]  # "advantages=seq": token 0's value, constant per row
    loss, _ = gspo_loss(t(g["logp"]), t(g["logp_old"]), adv_seq, mask, clip_low=3e-4, clip_high=4e-4)
    assert float(aggregate(loss, mask, "seq-mean-token-mean")) == pytest.approx(g[key], rel=VERL_EPS_REL)


def test_kl_estimators_match_verl(g: dict) -> None:
    lp, ref = t(g["logp"]), t(g["logp_ref"])
    for fn, key in ((k1_kl, "kl_k1"), (k2_kl, "kl_k2"), (k3_kl, "kl_k3")):
        torch.testing.assert_close(fn(lp, ref), t(g[key]), rtol=1e-9, atol=1e-12)


def test_pass_at_k_matches_exact(g: dict) -> None:
    for key, expected in g["pass_at_k_exact"].items():
        n, c, k = (int(kv.split("=")[1]) for kv in key.split(","))
        assert float(pass_at_k(n, c, k)) == pytest.approx(expected, rel=1e-12, abs=1e-15), key
