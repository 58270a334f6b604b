"""Rollout-correction weights against an element-by-element float64 computation, and their statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators.importance import CorrectionMode, correction_statistics, rollout_correction_weights

B, T = 5, 6


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logp_old = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    logp_rollout = logp_old + 0.6 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    lengths = [6, 4, 1, 3, 0]  # a row with no token
    mask = torch.tensor([[t < n for t in range(T)] for n in lengths])
    return logp_old, logp_rollout, mask


def _by_hand(lo: torch.Tensor, lr: torch.Tensor, m: torch.Tensor, mode: str, cap: float, floor: float | None) -> list:
    """Weights, ratio, truncated, masked: one token at a time, in Python floats."""
    out = []
    for b in range(B):
        seq = math.exp(max(-20.0, min(20.0, sum(float(lo[b, t] - lr[b, t]) for t in range(T) if m[b, t]))))
        row = []
        for t in range(T):
            if not m[b, t]:
                row.append((0.0, 0.0, False, False))
                continue
            r = seq if mode.startswith("sequence") else math.exp(float(lo[b, t] - lr[b, t]))
            low = 0.0 if floor is None else floor
            outside = r < low or r > cap
            if mode.endswith("mask"):
                row.append((0.0 if outside else r, r, False, outside))
            else:
                row.append((min(max(r, low), cap), r, outside, False))
        out.append(row)
    return out


@pytest.mark.parametrize("mode", [m.value for m in CorrectionMode])
@pytest.mark.parametrize(("cap", "floor"), [(2.0, None), (1.3, 0.7), (1e6, None)])
def test_weights_equal_the_rules_by_hand(mode: str, cap: float, floor: float | None) -> None:
    lo, lr, m = _inputs()
    c = rollout_correction_weights(lo, lr, m, mode=mode, cap=cap, floor=floor)
    want = _by_hand(lo, lr, m, mode, cap, floor)
    for i, name in enumerate(("weights", "ratio")):
        expected = torch.tensor([[cell[i] for cell in row] for row in want], dtype=torch.float64)
        torch.testing.assert_close(getattr(c, name), expected, rtol=1e-12, atol=1e-300)
    assert c.truncated.tolist() == [[cell[2] for cell in row] for row in want]
    assert c.masked.tolist() == [[cell[3] for cell in row] for row in want]
    if cap < 1e6 and floor is not None:  # the rules act on these inputs: the test is not vacuous
        assert bool((c.truncated | c.masked).any()) and bool(((c.weights > 0) & m).any())


def test_weighted_loss_gradient_is_the_weight_times_the_loss_gradient() -> None:
    """The weights carry no gradient: d/dlogp of sum(w * (-A * exp(logp - sg(logp)))) = -w * A, by hand."""
    lo, lr, m = _inputs(1)
    logp = lo.clone().requires_grad_(True)
    adv = torch.linspace(-1, 1, B, dtype=torch.float64).unsqueeze(-1).expand(B, T)
    c = rollout_correction_weights(logp, lr, m, mode="token_truncate", cap=1.5)
    assert not c.weights.requires_grad
    loss = (c.weights * -(adv * torch.exp(logp - logp.detach())) * m).sum()
    loss.backward()
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, torch.where(m, -c.weights * adv, 0.0), rtol=1e-12, atol=0.0)


def test_off_mask_values_never_reach_the_weights() -> None:
    lo, lr, m = _inputs(2)
    bad_lo, bad_lr = lo.masked_fill(~m, float("nan")), lr.masked_fill(~m, float("inf"))
    for mode in CorrectionMode:
        a = rollout_correction_weights(lo, lr, m, mode=mode, cap=1.5, floor=0.5)
        b = rollout_correction_weights(bad_lo, bad_lr, m, mode=mode, cap=1.5, floor=0.5)
        assert torch.equal(a.weights, b.weights) and torch.equal(a.ratio, b.ratio)
        assert bool(torch.isfinite(b.weights).all()) and bool((b.weights[~m] == 0).all())


def test_huge_sequence_log_ratios_are_clamped_at_20() -> None:
    lo = torch.zeros(1, 3, dtype=torch.float64)
    lr = torch.full((1, 3), -30.0, dtype=torch.float64)  # sum of log-ratios 90
    m = torch.ones(1, 3, dtype=torch.bool)
    c = rollout_correction_weights(lo, lr, m, mode="sequence_mask", cap=1e6)
    assert c.ratio[0, 0].item() == pytest.approx(math.exp(20.0)) and c.masked.all()


def test_statistics_equal_numpy_over_tokens_and_over_sequences() -> None:
    lo, lr, m = _inputs(3)
    for mode in CorrectionMode:
        c = rollout_correction_weights(lo, lr, m, mode=mode, cap=1.4, floor=0.6)
        s = correction_statistics(c, m, sequence=mode.sequence)
        if mode.sequence:
            rows = m.any(-1)
            ratio, weight = c.ratio[rows, 0].numpy(), c.weights[rows, 0].numpy()  # every row starts with a token
            flags = (c.truncated | c.masked)[rows, 0].numpy()
        else:
            ratio, weight, flags = c.ratio[m].numpy(), c.weights[m].numpy(), (c.truncated | c.masked)[m].numpy()
        assert float(s["ratio_mean"]) == pytest.approx(ratio.mean(), rel=1e-12)
        assert float(s["ratio_min"]) == ratio.min() and float(s["ratio_max"]) == ratio.max()
        for q, key in ((0.05, "ratio_p05"), (0.5, "ratio_p50"), (0.95, "ratio_p95")):
            assert float(s[key]) == pytest.approx(np.quantile(ratio, q), rel=1e-12)
        assert float(s["weight_mean"]) == pytest.approx(weight.mean(), rel=1e-12)
        assert float(s["truncated"] + s["masked"]) == pytest.approx(flags.mean(), abs=1e-15)
        assert 0.0 < float(s["truncated"] + s["masked"]) < 1.0


def test_statistics_of_an_empty_mask_are_neutral() -> None:
    lo, lr, _ = _inputs()
    m = torch.zeros(B, T, dtype=torch.bool)
    s = correction_statistics(rollout_correction_weights(lo, lr, m), m, sequence=False)
    assert float(s["ratio_p50"]) == 1.0 and float(s["truncated"]) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "tokens"}, "mode:"),
        ({"cap": 0.0}, "cap:"),
        ({"cap": 2.0, "floor": 2.0}, "floor:"),
        ({"floor": -0.1}, "floor:"),
    ],
)
def test_bad_options_name_the_argument(kwargs: dict, message: str) -> None:
    lo, lr, m = _inputs()
    with pytest.raises(DomainError, match=message):
        rollout_correction_weights(lo, lr, m, **kwargs)


def test_bad_inputs_name_the_argument() -> None:
    lo, lr, m = _inputs()
    with pytest.raises(ShapeError, match="logp_rollout"):
        rollout_correction_weights(lo, lr[:, :2], m)
    with pytest.raises(DomainError, match="logp_rollout"):
        rollout_correction_weights(lo, lr.masked_fill(m, float("nan")), m)
    with pytest.raises(ShapeError, match="mask"):
        rollout_correction_weights(lo, lr, m[:, :2])
