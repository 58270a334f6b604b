"""Group-normalised advantages (GRPO) against a per-group Python loop in the style of verl.

The reference follows verl's ``compute_grpo_outcome_advantage``: collect each prompt's scores in a
dict keyed by the prompt id (a loop over the batch), take ``torch.mean`` / ``torch.std`` of each
group (a loop over groups), then normalise each sample (a loop over the batch). Both sides map flat
``[B]`` rewards to flat ``[B]`` advantages; the token broadcast, identical on both sides, is left out.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from benchmarks._timing import Row, time_pair
from posttrain.estimators import group_normalized_advantages, group_rewards

TARGET_SPEEDUP = 20.0


def loop_reference(scores: torch.Tensor, index: list[int], eps: float = 1e-6) -> torch.Tensor:
    """Per-group loop: verl-style GRPO advantages of flat scores with prompt ids ``index``."""
    id2score: dict[int, list[torch.Tensor]] = defaultdict(list)
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    id2mean, id2std = {}, {}
    for idx, values in id2score.items():
        group = torch.stack(values)
        id2mean[idx] = group.mean()
        id2std[idx] = group.std()
    out = scores.clone()
    for i in range(scores.shape[0]):
        out[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + eps)
    return out


def run(*, b: int, k: int, repeats: int, seed: int = 0) -> list[Row]:
    gen = torch.Generator().manual_seed(seed)
    g = b // k
    rewards = torch.randint(0, 2, (b,), generator=gen).to(torch.float32)  # binary verifier rewards
    ids = torch.arange(b) // k  # samples of one prompt are adjacent, as rollouts come back
    index = ids.tolist()

    def ours() -> torch.Tensor:
        return group_normalized_advantages(rewards.view(g, k)).reshape(-1)

    def ours_by_id() -> torch.Tensor:
        grouped, order = group_rewards(rewards, ids)
        out = torch.empty_like(rewards)
        out[order] = group_normalized_advantages(grouped).reshape(-1)
        return out

    torch.testing.assert_close(ours(), loop_reference(rewards, index), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours_by_id(), ours(), rtol=0, atol=0)
    rows = []
    for name, fn, target in (
        (f"group advantages [G={g}, K={k}]", ours, TARGET_SPEEDUP),
        ("  ... from flat rewards + group ids (group_rewards)", ours_by_id, None),
    ):
        t_ours, t_ref = time_pair(fn, lambda: loop_reference(rewards, index), repeats=repeats)
        rows.append(Row(name, t_ours, t_ref, "per-group Python loop (verl style)", target, higher_is_better=True))
    return rows
