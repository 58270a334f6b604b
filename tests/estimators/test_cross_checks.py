"""Cross-check vectors of shared/specs/integrations.md (sections 5 and 6.3-6.5), as published there.

Each comparison uses the precision the spec prints its value with.
"""

from __future__ import annotations

import pytest
import torch

from posttrain.estimators import (
    aggregate,
    clipped_ratio_loss,
    group_normalized_advantages,
    k1_kl,
    k2_kl,
    k3_kl,
    pass_at_k,
    rloo_advantages,
)

ONE_HOT = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)


@pytest.mark.parametrize(
    ("kwargs", "want", "atol"),
    [
        ({"eps": 1e-6}, [1.499997, -0.499999, -0.499999, -0.499999], 1e-6),
        ({"eps": 1e-4}, [1.4997, -0.49990, -0.49990, -0.49990], 1e-4),
        ({"scale_by_std": False}, [0.75, -0.25, -0.25, -0.25], 1e-12),
    ],
)
def test_group_advantages_vectors(kwargs: dict, want: list[float], atol: float) -> None:
    got = group_normalized_advantages(ONE_HOT, **kwargs)[0]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=0, atol=atol)


def test_rloo_vector() -> None:
    want = torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3], dtype=torch.float64)
    torch.testing.assert_close(rloo_advantages(ONE_HOT)[0], want, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("r", "a", "kwargs", "want"),
    [
        (1.5, 1.0, {}, -1.2),
        (0.5, 1.0, {}, -0.5),
        (1.5, -1.0, {}, 1.5),
        (0.5, -1.0, {}, 0.8),
        (5.0, -1.0, {}, 5.0),
        (5.0, -1.0, {"dual_clip": 3.0}, 3.0),
        (1.25, 1.0, {}, -1.2),
        (1.25, 1.0, {"clip_high": 0.28}, -1.25),
    ],
)
def test_ppo_clip_vectors(r: float, a: float, kwargs: dict, want: float) -> None:
    logp = torch.tensor([[r]], dtype=torch.float64).log()
    loss, _ = clipped_ratio_loss(
        logp,
        torch.zeros_like(logp),
        torch.tensor([a], dtype=torch.float64),
        torch.ones(1, 1, dtype=torch.bool),
        **kwargs,
    )
    assert float(loss) == pytest.approx(want, abs=1e-12)


def test_aggregation_vectors() -> None:
    values = torch.tensor([[1.0, 1.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    assert float(aggregate(values, mask, "token-mean")) == pytest.approx(1.6667, abs=1e-4)
    assert float(aggregate(values, mask, "seq-mean-token-mean")) == pytest.approx(1.5, abs=1e-12)
    assert float(aggregate(values, mask, "seq-mean-token-sum")) == pytest.approx(5.0, abs=1e-12)
    norm = float(aggregate(values, mask, "seq-mean-token-sum-norm", horizon=4))
    assert norm == pytest.approx(1.25, abs=1e-12)
    assert norm * values.shape[0] == pytest.approx(2.5, abs=1e-12)  # verl <= 0.7.0 (docs/anchors.md)


def test_kl_vectors() -> None:
    lp, ref = torch.tensor([-1.0], dtype=torch.float64), torch.tensor([-1.5], dtype=torch.float64)
    assert float(k1_kl(lp, ref)) == pytest.approx(0.5, abs=1e-12)
    assert float(k2_kl(lp, ref)) == pytest.approx(0.125, abs=1e-12)
    assert float(k3_kl(lp, ref)) == pytest.approx(0.1065307, abs=1e-7)


@pytest.mark.parametrize(
    ("n", "c", "k", "want", "atol"),
    [
        (4, 1, 1, 0.25, 1e-12),
        (4, 1, 2, 0.5, 1e-12),
        (4, 1, 4, 1.0, 0.0),
        (16, 3, 8, 0.9, 1e-12),
        (200, 10, 100, 0.99922897, 1e-8),
    ],
)
def test_pass_at_k_reference_values(n: int, c: int, k: int, want: float, atol: float) -> None:
    assert float(pass_at_k(n, c, k)) == pytest.approx(want, abs=atol)
