"""Clipped-ratio loss + token-mean aggregation, forward + backward, against the bandwidth floor and verl.

Anchors, each measured in the same run and interleaved with ours (``median [min-max]``):

- the **floor**: 17 bytes per token (read ``logp``, ``logp_old`` as float32 and the bool mask,
  write the float32 loss forward and the float32 gradient backward) at the copy bandwidth
  measured just before; goal: ours within 10x of it;
- **verl** ``compute_policy_loss_vanilla`` (dual clip 3, token-mean, its own loss aggregation)
  when verl is importable (``PYTHONPATH`` with verl and the packages ``core_algos`` imports);
  goal: ours no slower (ratio <= 1). Without verl the row says so and is skipped;
- the plain expression ``max(-A r, -A clip(r)) * mask`` (what a reader would write, no
  validation or NaN safety), for reference.

Ours is `clipped_ratio_loss` then the default ``aggregate(loss, mask, "token-mean")``: the loss is
marked as 0 off this mask, so the default aggregation sums it without masking it a second time
(goal: <= 10x the floor). ``aggregate(..., premasked=True)`` has its own row, for reference.

Ours validates shapes (always) and values (unless ``value_checks(False)``), keeps masked NaN out
of value and gradient, clamps the log-ratio to +-20, returns diagnostics and aggregates separately.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from benchmarks._timing import Row, Spread, copy_bandwidth, interleaved
from posttrain.estimators import aggregate, clipped_ratio_loss

FLOOR_BYTES_PER_TOKEN = 17
TARGET_OVER_FLOOR = 10.0
TARGET_OVER_VERL = 1.0
CLIP = 0.2
DUAL = 3.0


def plain_expression(logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean dual-clip PPO loss as one eager expression (no validation, clamp, diagnostics or NaN safety)."""
    r = torch.exp(logp - logp_old)
    a = adv.unsqueeze(-1)
    loss = torch.maximum(-a * r, -a * r.clamp(1 - CLIP, 1 + CLIP))
    loss = torch.where(a < 0, torch.minimum(loss, -DUAL * a), loss)
    m = mask.to(logp.dtype)
    return (loss * m).sum() / m.sum()


def ours(logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The loss, then the default ``aggregate`` (the marked loss is not masked again)."""
    loss, _ = clipped_ratio_loss(logp, logp_old, adv, mask, clip_low=CLIP, clip_high=CLIP, dual_clip=DUAL)
    return aggregate(loss, mask, "token-mean")


def ours_premasked(logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The loss, then ``aggregate(premasked=True)`` (the caller's promise instead of the loss's mark)."""
    loss, _ = clipped_ratio_loss(logp, logp_old, adv, mask, clip_low=CLIP, clip_high=CLIP, dual_clip=DUAL)
    return aggregate(loss, mask, "token-mean", premasked=True)


def verl_loss() -> Callable[..., torch.Tensor] | None:
    """verl's ``compute_policy_loss_vanilla`` with its default config (token-mean), or None without verl."""
    try:
        from verl.trainer.ppo import core_algos
        from verl.workers.config import ActorConfig
    except Exception:  # verl or one of its imports missing
        return None
    config = ActorConfig(
        strategy="fsdp", clip_ratio=CLIP, clip_ratio_c=DUAL, ppo_micro_batch_size_per_gpu=1, rollout_n=8
    )

    def run(logp: torch.Tensor, logp_old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        token_adv = adv.unsqueeze(-1).expand_as(logp)
        loss, _ = core_algos.compute_policy_loss_vanilla(logp_old, logp, token_adv, mask, "token-mean", config)
        return loss

    return run


def _fwd_bwd(fn: Callable[..., torch.Tensor], args: tuple[torch.Tensor, ...]) -> Callable[[], None]:
    logp, rest = args[0], args[1:]

    def step() -> None:
        lp = logp.detach().requires_grad_(True)
        fn(lp, *rest).backward()

    return step


def run(*, b: int, t: int, repeats: int, seed: int = 0) -> list[Row]:
    gen = torch.Generator().manual_seed(seed)
    logp = -3.0 * torch.rand(b, t, generator=gen)
    logp_old = logp + 0.3 * torch.randn(b, t, generator=gen)  # ~30% of tokens clipped
    adv = torch.randn(b, generator=gen)
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(-1)
    args = (logp, logp_old, adv, mask)
    want = plain_expression(*args)
    torch.testing.assert_close(ours(*args), want, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(ours_premasked(*args), want, rtol=1e-4, atol=1e-6)
    fns = {
        "ours": _fwd_bwd(ours, args),
        "ours_premasked": _fwd_bwd(ours_premasked, args),
        "plain": _fwd_bwd(plain_expression, args),
    }
    verl = verl_loss()
    if verl is not None:
        verl_mask = mask.to(logp.dtype)  # verl's masks are numeric
        torch.testing.assert_close(verl(logp, logp_old, adv, verl_mask), want, rtol=1e-4, atol=1e-6)
        fns["verl"] = _fwd_bwd(verl, (logp, logp_old, adv, verl_mask))
    bandwidth = copy_bandwidth()
    times = interleaved(fns, repeats=repeats)
    floor_s = FLOOR_BYTES_PER_TOKEN * b * t / bandwidth.median
    floor = Spread(floor_s, floor_s, floor_s)
    label = f"clipped loss + default aggregate, fwd+bwd [B={b}, T={t}]"
    floor_ref = f"floor: {FLOOR_BYTES_PER_TOKEN} B/token at {bandwidth.median / 1e9:.1f} GB/s copy"
    rows = [
        _row(label, times["ours"], floor, floor_ref, TARGET_OVER_FLOOR),
        _row("  same, aggregate(premasked=True)", times["ours_premasked"], floor, floor_ref, None),
    ]
    if verl is not None:
        rows.append(_row(label, times["ours"], times["verl"], "verl compute_policy_loss_vanilla", TARGET_OVER_VERL))
    else:
        rows.append(_row(label + " (verl not importable: no verl row)", times["ours"], times["plain"], "-", None))
    rows.append(_row(label, times["ours"], times["plain"], "plain expression (no checks)", None))
    rows.append(_row("  plain expression", times["plain"], floor, floor_ref, None))
    return rows


def _row(name: str, mine: Spread, ref: Spread, ref_name: str, target: float | None) -> Row:
    return Row(name, mine.median, ref.median, ref_name, target, False, mine, ref)
