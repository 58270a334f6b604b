"""The one-pass PPO-clip loss (`posttrain.estimators._fused`) equals the formula form of `clipped_ratio_loss`.

Value, gradient (of ``logp`` and ``logp_old``) and every diagnostic, in float32 and float64, with
per-row and per-token advantages, masks with holes and empty rows, dual clip, clip-higher,
on-policy tokens, log-ratios beyond the +-20 guard and NaN off the mask; over several row blocks.
And the aggregation: a marked loss is summed without a second masking, with the same value and
gradient as the masked sum.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import DomainError
from posttrain.estimators import _fused, aggregate, clipped_ratio_loss
from posttrain.estimators._numerics import is_marked_zero_off_mask, mark_zero_off_mask
from posttrain.testing import policy_batches

CLIPS = st.sampled_from([(0.2, 0.2), (0.2, 0.28), (0.1, 0.5)])


def _both(lp, old, adv, mask, **options):  # type: ignore[no-untyped-def]
    """(loss, diagnostics, logp grad, logp_old grad) of the one-pass path and of the formula."""
    out = []
    weights = torch.linspace(-1, 2, lp.numel(), dtype=lp.dtype).reshape(lp.shape)
    for fused in (True, False):
        x, y = lp.detach().clone().requires_grad_(), old.detach().clone().requires_grad_()
        loss, diag = clipped_ratio_loss(x, y, adv, mask, fused=fused, **options)
        (loss * weights).sum().backward()
        out.append((loss.detach(), diag, x.grad, y.grad))
    return out


def _assert_equal(results, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    (a, da, ga, gao), (b, db, gb, gbo) = results
    assert torch.equal(a, b), "the loss values differ"  # the same float operations, in the same order
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-6, "atol": 1e-7}
    torch.testing.assert_close(ga, gb, **tol)
    torch.testing.assert_close(gao, gbo, **tol)
    stat_tol = tol if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-6}  # sums taken in another order
    for name in da._fields:
        torch.testing.assert_close(getattr(da, name), getattr(db, name), **stat_tol, msg=name)


@settings(max_examples=80, deadline=None)
@given(
    policy_batches(b=(1, 5), t=(1, 7), max_log_ratio=30.0),
    CLIPS,
    st.sampled_from([None, 3.0]),
    st.booleans(),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_one_pass_equals_the_formula(batch, clips, dual, on, dtype) -> None:  # type: ignore[no-untyped-def]
    lp, old, adv = batch.logp.to(dtype), batch.logp_old.to(dtype), batch.advantages.to(dtype)
    assert _fused.applies(lp, old, adv if adv.ndim == 2 else adv.unsqueeze(-1), None)
    on_policy = (torch.arange(lp.numel()).reshape(lp.shape) % 3 == 0) if on else None
    results = _both(
        lp, old, adv, batch.mask, clip_low=clips[0], clip_high=clips[1], dual_clip=dual, on_policy=on_policy
    )
    _assert_equal(results, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("dual", [None, 3.0])
def test_several_blocks_guard_nan_off_mask_and_empty_rows(
    dtype: torch.dtype, per_token: bool, dual: float | None
) -> None:
    g = torch.Generator().manual_seed(3)
    b, t = 9, 2**15  # 2**21 // (t * 4 * 4) = 4 rows per block in float32: three blocks
    lp = -3 * torch.rand(b, t, generator=g, dtype=dtype)
    old = lp + 0.5 * torch.randn(b, t, generator=g, dtype=dtype)
    old[0, :3] = lp[0, :3] - torch.tensor([25.0, 20.0, -25.0], dtype=dtype)  # beyond, at and below the guard
    mask = torch.rand(b, t, generator=g) < 0.8
    mask[4] = False  # an empty row
    adv = torch.randn((b, t) if per_token else (b,), generator=g, dtype=dtype)
    adv[2] = 0.0
    _assert_equal(_both(lp, old, adv, mask, clip_high=0.28, dual_clip=dual), dtype)
    lp_nan = lp.clone()
    lp_nan[~mask] = float("nan")  # off the mask: a second, exact pass; nothing reaches the result
    if per_token:
        adv = adv.clone()
        adv[~mask] = float("inf")
    clean, with_nan = _both(lp, old, adv, mask, dual_clip=dual), _both(lp_nan, old, adv, mask, dual_clip=dual)
    _assert_equal(with_nan, dtype)
    for a, b in zip(clean[0], with_nan[0], strict=True):  # the one-pass results, bit for bit
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)) if isinstance(a, tuple) else torch.equal(a, b)


def test_nan_on_the_mask_is_an_error_naming_the_argument() -> None:
    lp, mask = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    bad = lp.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(DomainError, match=r"^logp:"):
        clipped_ratio_loss(bad, lp, torch.ones(2), mask)
    with pytest.raises(DomainError, match=r"^logp_old:"):
        clipped_ratio_loss(lp, bad, torch.ones(2), mask)
    with pytest.raises(DomainError, match=r"^advantages:"):
        clipped_ratio_loss(lp, lp, bad, mask)
    with pytest.raises(DomainError, match=r"^mask:"):
        clipped_ratio_loss(lp, lp, torch.ones(2), torch.zeros(2, 3, dtype=torch.bool))


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_a_marked_loss_is_aggregated_without_masking_again(mode: str) -> None:
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(6, 5, generator=g, dtype=torch.float64).requires_grad_()
    mask = torch.rand(6, 5, generator=g) < 0.7
    mask[:, 0] = True
    loss, _ = clipped_ratio_loss(lp, lp.detach() + 0.1, torch.randn(6, generator=g, dtype=torch.float64), mask)
    assert is_marked_zero_off_mask(loss, mask)
    assert not is_marked_zero_off_mask(loss, mask.clone())  # another mask object: masked as usual
    (grad_marked,) = torch.autograd.grad(aggregate(loss, mask, mode), lp, retain_graph=True)
    (grad_masked,) = torch.autograd.grad(aggregate(loss * 1.0, mask, mode), lp, retain_graph=True)  # unmarked copy
    torch.testing.assert_close(grad_marked, grad_masked, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(aggregate(loss, mask, mode), aggregate(loss * 1.0, mask, mode), rtol=1e-12, atol=0)


def test_an_in_place_change_voids_the_mark() -> None:
    values, mask = torch.zeros(2, 3), torch.tensor([[True, False, True], [True, True, False]])
    mark_zero_off_mask(values, mask)
    assert is_marked_zero_off_mask(values, mask)
    values.add_(1.0)  # now 1 off the mask: the sum must mask it
    assert not is_marked_zero_off_mask(values, mask)
    assert float(aggregate(values, mask, "token-sum")) == 4.0


def test_one_token_per_row_per_token_advantages_keep_masked_nan_out() -> None:
    """T = 1 with per-token advantages ``[B, 1]``: a NaN advantage at a masked position reaches neither the
    loss nor its gradient (the fused path once read such advantages as per-row and skipped the masking)."""
    logp = torch.zeros(2, 1, requires_grad=True)
    advantages = torch.tensor([[1.0], [float("nan")]])
    mask = torch.tensor([[True], [False]])
    loss, _ = clipped_ratio_loss(logp, torch.zeros(2, 1), advantages, mask)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(logp.grad).all()
    assert loss.tolist() == [[-1.0], [0.0]] and logp.grad.tolist() == [[-1.0], [0.0]]
