"""Clipped-ratio loss + token-mean aggregation against one fused hand-written expression.

The reference is the shortest correct eager expression of the same scalar:
``(max(-A r, -A clip(r)) * mask).sum() / mask.sum()`` with ``r = exp(logp - logp_old)``, and the
same expression with other mask operations (``where`` and ``count_nonzero``; a multiply by the mask
cast to float, the fastest on CPU); the target is judged against each. Ours does
more: it validates (shapes always; finite values and a non-empty mask unless value checks are off),
clamps the log-ratio to [-20, 20], keeps masked positions out of value and gradient (NaN-safe),
returns the per-token loss and the clip diagnostics, and aggregates separately. Rows are given
with value checks on (the default) and off (``posttrain.validate.value_checks(False)``, the
hot-loop setting), forward only (the target) and forward + backward (reported).
"""

from __future__ import annotations

from functools import partial

import torch

from benchmarks._timing import Row, time_pair
from posttrain.estimators import aggregate, clipped_ratio_loss
from posttrain.validate import value_checks

TARGET_SLOWDOWN = 1.2
CLIP = 0.2


def fused_reference(logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean PPO-clip loss in one expression (no validation, clamp, diagnostics or NaN safety)."""
    r = torch.exp(logp - logp_old)
    a = adv.unsqueeze(-1)
    return (torch.maximum(-a * r, -a * r.clamp(1 - CLIP, 1 + CLIP)) * mask).sum() / mask.sum()


def fused_reference_float_mask(
    logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """The expression masking by a multiply with the mask as floats (not NaN-safe; the fastest on CPU)."""
    r = torch.exp(logp - logp_old)
    a = adv.unsqueeze(-1)
    m = mask.to(logp.dtype)
    return (torch.maximum(-a * r, -a * r.clamp(1 - CLIP, 1 + CLIP)) * m).sum() / m.sum()


def fused_reference_tuned(
    logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """The same expression with the two cheaper mask operations found while optimising ours.

    ``torch.where`` instead of multiplying by a boolean mask (which first promotes it to float), and
    ``count_nonzero`` instead of ``mask.sum()`` (which first copies the mask to int64).
    """
    r = torch.exp(logp - logp_old)
    a = adv.unsqueeze(-1)
    loss = torch.maximum(-a * r, -a * r.clamp(1 - CLIP, 1 + CLIP))
    return torch.where(mask, loss, 0.0).sum() / mask.count_nonzero()


def ours(logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    loss, _ = clipped_ratio_loss(logp, logp_old, adv, mask, clip_low=CLIP, clip_high=CLIP)
    return aggregate(loss, mask, "token-mean")


def run(*, b: int, t: int, repeats: int, seed: int = 0) -> list[Row]:
    gen = torch.Generator().manual_seed(seed)
    logp = -3.0 * torch.rand(b, t, generator=gen)
    logp_old = logp + 0.3 * torch.randn(b, t, generator=gen)  # ~30% of tokens clipped
    adv = torch.randn(b, generator=gen)
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(-1)
    args = (logp, logp_old, adv, mask)
    torch.testing.assert_close(ours(*args), fused_reference(*args), rtol=1e-4, atol=1e-6)

    def backward(fn):  # type: ignore[no-untyped-def]
        def step() -> None:
            lp = logp.detach().requires_grad_(True)
            fn(lp, logp_old, adv, mask).backward()

        return step

    def unchecked(fn):  # type: ignore[no-untyped-def]
        def call(*a: torch.Tensor) -> torch.Tensor:
            with value_checks(False):
                return fn(*a)  # type: ignore[no-any-return]

        return call

    for other in (fused_reference_tuned, fused_reference_float_mask):
        torch.testing.assert_close(other(*args), fused_reference(*args), rtol=1e-4, atol=1e-6)
    rows = []
    references = (
        ("fused: * mask, mask.sum()", fused_reference),
        ("fused: where, count_nonzero", fused_reference_tuned),
        ("fused: * float mask", fused_reference_float_mask),
    )
    for ref_name, ref in references:
        for name, mine, target in (
            (f"clipped loss + token-mean [B={b}, T={t}]", ours, TARGET_SLOWDOWN),
            ("  ... value checks off", unchecked(ours), TARGET_SLOWDOWN),
        ):
            t_ours, t_ref = time_pair(partial(mine, *args), partial(ref, *args), repeats=repeats)
            rows.append(Row(name, t_ours, t_ref, ref_name, target, higher_is_better=False))
        t_ours, t_ref = time_pair(backward(ours), backward(ref), repeats=repeats)
        rows.append(Row("  ... forward + backward", t_ours, t_ref, ref_name, None, higher_is_better=False))
    return rows
