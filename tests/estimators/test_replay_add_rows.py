"""`replay_add` against its first form (take the kept rows by boolean mask, concatenate, slice to capacity)."""

from __future__ import annotations

import torch

from posttrain.estimators import headroom, replay_add, replay_init
from posttrain.estimators.selection import ReplayBuffer, mixed_outcome, replay_take


def _reference_add(buf: ReplayBuffer, tokens, mask, rewards, advantages, logp_gen, prompt, step, capacity):  # type: ignore[no-untyped-def]
    keep = mixed_outcome(rewards) & mask.flatten(1).any(dim=-1)
    h = headroom(logp_gen, advantages, mask)
    t_gen = torch.full((tokens.shape[0],), step, dtype=torch.long)
    fresh = replay_take(ReplayBuffer(tokens, mask, rewards, advantages, logp_gen, prompt, h, h, t_gen), keep)
    merged = ReplayBuffer(*(torch.cat([old, new]) for old, new in zip(buf, fresh, strict=True)))
    return replay_take(merged, slice(max(merged.size - capacity, 0), None))  # type: ignore[arg-type]


def test_replay_add_equals_the_mask_take_concat_slice_form() -> None:
    g = torch.Generator().manual_seed(0)
    fast = ref = replay_init(4, 3, dtype=torch.float64)
    entered_none = 0
    for step in range(40):
        groups = int(torch.randint(1, 6, (), generator=g))
        rewards = (torch.rand(groups, 4, generator=g, dtype=torch.float64) < (0.1 if step % 3 else 0.5)).double()
        args = {
            "tokens": torch.randint(0, 9, (groups, 4, 3), generator=g),
            "mask": torch.rand(groups, 4, 3, generator=g) < 0.8,
            "rewards": rewards,
            "advantages": rewards - rewards.mean(-1, keepdim=True),
            "logp_gen": -torch.rand(groups, 4, 3, generator=g, dtype=torch.float64),
            "prompt": torch.randint(0, 50, (groups,), generator=g),
        }
        cap = 7 if step < 30 else 3  # the capacity shrinks: an eviction without ingress
        before = fast.size
        fast = replay_add(fast, **args, step=step, capacity=cap)
        ref = _reference_add(ref, **args, step=step, capacity=cap)
        entered_none += fast.size == before
        for name, a, b in zip(ReplayBuffer._fields, fast, ref, strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b), (step, name)
    assert entered_none > 0 and fast.size == 3
