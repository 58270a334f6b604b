"""RAIL in the LLM trainer (docs: methods/rail.md): branch continuations from a chosen prefix of a base rollout.

`BranchingStage` is a `RolloutStage` (``rollout.branching`` in the
config). Per prompt the loop samples ``K - b`` base responses (`fresh_samples`);
every prefix of depth 1..L-1 of a base response is a candidate state with the features of the paper (docs: methods/rail.md)
§7b (depth, normalised next-token entropy from the policy's forward, the base response's reward,
the group mean, training progress, saturation); one state is chosen (shadow phase: uniformly at
random; live: the recoverability controller's argmax behind the gate ``kappa`` with ``explore``
random choices; ``heuristic: true``: the highest-entropy state, the static baseline) and ``b``
continuations are generated from ``prompt + prefix`` **through the rollout Protocol** (a prefix is
just a longer prompt). A gated-out prompt gets ``b`` ordinary samples instead (branching at the
root), so every group has K responses. Branch rows are ``prefix + continuation`` with behaviour
log-probs ``base[:d] + engine``; the realised gains
(`recoverability_gain`) refit the controller
(`controller_update`) in the same step. The update is the
algorithm's usual loss on the reshaped groups.

State (checkpointed): the controller's traces and coefficients and the stage's random generator.
Simplifications: one intervention per prompt with a fixed width ``b`` at the engine's temperature
(the action space is *where* to branch; tempered branches need a per-call temperature in the
Protocol); a continuation may use up to ``max_new_tokens`` more tokens after its prefix; single
process only. Logged per step: ``rail/branched`` (fraction of prompts branched below the root),
``rail/depth`` and ``rail/gain`` (mean realised gain of branched prompts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from torch import Tensor

from posttrain.estimators import controller_init, controller_predict, controller_update, recoverability_gain
from posttrain.estimators.selection import ControllerState
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.stages import StepContext
from posttrain.llm.rollout.text import right_pad
from posttrain.llm.typed import Checked, Range

__all__ = ["BranchingConfig", "BranchingStage"]

NUM_FEATURES = 7


@dataclass(frozen=True)
class BranchingConfig(Checked):
    """``rollout.branching``: RAIL branch continuations from a chosen prefix (docs: methods/rail.md; `posttrain.llm.rollout.branching`).

    ``branches``: b continuations per prompt (``1 <= b < group_size``); ``shadow_steps``: steps with
    random states; ``kappa``: gate on the predicted gain; ``explore``: probability of a random state;
    ``heuristic``: the static highest-entropy rule instead of the controller; ``window``, ``gamma``,
    ``delta``, ``ridge``: the controller's trace window, recency, Huber delta and ridge.
    """

    branches: Annotated[int, Range(1, 1 << 12)] = 4
    shadow_steps: Annotated[int, Range(0, 10**8)] = 5
    kappa: float = 0.0
    explore: Annotated[float, Range(0.0, 1.0)] = 0.1
    heuristic: bool = False
    window: Annotated[int, Range(1, 10**7)] = 2000
    gamma: Annotated[float, Range(0.0, None, low_open=True)] = 0.99
    delta: Annotated[float, Range(0.0, None, low_open=True)] = 0.05
    ridge: Annotated[float, Range(0.0)] = 1e-4


class BranchingStage:
    """Groups of ``K - b`` base responses plus ``b`` continuations branched from one chosen prefix per prompt.

    Args:
        cfg: the stage's options (`BranchingConfig`).
        group_size: K, responses per prompt. max_new_tokens: the response limit.
        vocab_size: normalises the entropy feature. seed: the run seed (the exploration coin).
        world: data-parallel world size (must be 1).
    """

    def __init__(
        self, cfg: BranchingConfig, *, group_size: int, max_new_tokens: int, vocab_size: int, seed: int, world: int = 1
    ) -> None:
        if not 1 <= cfg.branches < group_size or world != 1:
            raise ValueError(f"branches: need 1 <= b < K = {group_size} and a single process")
        self.cfg, self.vocab_size, self.max_new_tokens = cfg, int(vocab_size), int(max_new_tokens)
        self.ctrl: ControllerState = controller_init(1, NUM_FEATURES)
        self.coin = torch.Generator().manual_seed(seed * 7919 + 11)

    def fresh_samples(self, group_size: int) -> int:
        return group_size - self.cfg.branches

    def _features(self, base: RolloutBatch, ctx: StepContext) -> tuple[Tensor, Tensor]:
        """``[G, C, 7]`` candidate features (C = k0 * T prefixes) and ``[G, C]`` validity (1 <= depth < length)."""
        ent = ctx.token_entropy(base)
        g, k0, t = base.num_groups, base.group_size, base.response_ids.shape[-1]
        ent, rewards = ent.cpu(), base.grouped_rewards().cpu()  # the controller lives on the CPU
        depth = torch.arange(t).expand(g * k0, t)
        valid = (depth >= 1) & (depth < base.mask.sum(-1, keepdim=True).cpu())
        mean = rewards.mean(-1, keepdim=True).expand(g, k0).reshape(-1, 1).expand(-1, t)
        cols = [
            torch.ones(g * k0, t), depth / self.max_new_tokens,
            ent.float() / math.log(self.vocab_size), rewards.reshape(-1, 1).expand(-1, t), mean,
            torch.full((g * k0, t), ctx.step / max(ctx.steps, 1)), ((mean == 0) | (mean == 1)).float(),
        ]  # fmt: skip
        feats = torch.stack([c.float() for c in cols], -1).reshape(g, k0 * t, NUM_FEATURES)
        return feats.double(), valid.reshape(g, k0 * t)

    def _choose(self, feats: Tensor, valid: Tensor, step: int) -> tuple[Tensor, Tensor]:
        """Per prompt: the chosen candidate index and whether it branches below the root."""
        g = feats.shape[0]
        random_pick = torch.multinomial(
            valid.double() + (~valid.any(-1, keepdim=True)).double(), 1, generator=self.coin
        )[:, 0]
        if self.cfg.heuristic:
            score = feats[..., 2]  # normalised entropy
        elif step < self.cfg.shadow_steps:
            return random_pick, valid.any(-1)
        else:
            score = controller_predict(self.ctrl, feats)[..., 0]
        score = torch.where(valid, score, torch.full_like(score, -math.inf))
        best = score.argmax(-1)
        take = score.amax(-1) > (-math.inf if self.cfg.heuristic else self.cfg.kappa)
        if self.cfg.heuristic:
            return best, take
        coin = torch.rand(g, generator=self.coin, dtype=torch.float64) < self.cfg.explore
        explore = ~take & coin & valid.any(-1)
        return torch.where(explore, random_pick, best), take | explore

    def after_rollout(self, batch: RolloutBatch, ctx: StepContext) -> tuple[RolloutBatch, dict[str, float]]:
        base, b = batch, self.cfg.branches
        assert base.logp_old is not None
        g, k0 = base.num_groups, base.group_size
        k = k0 + b
        feats, valid = self._features(base, ctx)
        pick, branched = self._choose(feats, valid, ctx.step)
        t = base.response_ids.shape[-1]
        row = torch.arange(g) * k0 + pick // t  # base row of the chosen prefix
        depth = torch.where(branched, pick % t, torch.zeros_like(pick))
        prefixes = [base.response_ids[r, :d].tolist() for r, d in zip(row.tolist(), depth.tolist(), strict=True)]
        prompts = [list(p) + x for p, x in zip(ctx.prompts, prefixes, strict=True)]
        cont = ctx.engine.generate(prompts, n=b, seed=ctx.seed + 7)
        resp, logp = [], []
        for i in range(g * k):  # group-major rows: k0 base responses, then b branches
            grp, j = divmod(i, k)
            if j < k0:
                src = grp * k0 + j
                m = base.mask[src]
                resp.append(base.response_ids[src][m].tolist())
                logp.append(base.logp_old[src][m].tolist())
            else:
                c, d = grp * b + (j - k0), int(depth[grp])
                m = cont.mask[c]
                resp.append(prefixes[grp] + cont.response_ids[c][m].tolist())
                logp.append(base.logp_old[int(row[grp]), :d].tolist() + cont.logp[c][m].tolist())
        ids, mask = right_pad(resp, ctx.pad_id)
        rows = [torch.tensor(lp, dtype=base.logp_old.dtype) for lp in logp]  # same lengths as resp
        logp_old = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=0.0)
        rewards = ctx.score(ids, mask, k)
        first = torch.arange(g, device=base.mask.device) * k0  # a group's K rows share its first base row's prompt
        dev = base.mask.device
        out = RolloutBatch(
            prompt_ids=base.prompt_ids[first].repeat_interleave(k, 0),
            prompt_mask=base.prompt_mask[first].repeat_interleave(k, 0),
            response_ids=ids.to(dev), mask=mask.to(dev), rewards=rewards.to(dev), group_size=k,
            logp_old=logp_old.to(dev),
        )  # fmt: skip
        gains = recoverability_gain(base.grouped_rewards().double().cpu(), rewards.reshape(g, k)[:, k0:].double())
        if bool(branched.any()) and not self.cfg.heuristic:
            self.ctrl = controller_update(
                self.ctrl, feats[torch.arange(g), pick][branched], torch.zeros(int(branched.sum()), dtype=torch.long),
                gains[branched], ctx.step, window=self.cfg.window, gamma=self.cfg.gamma, delta=self.cfg.delta,
                ridge=self.cfg.ridge,
            )  # fmt: skip
        n = max(int(branched.sum()), 1)
        return out, {
            "rail/branched": float(branched.float().mean()),
            "rail/depth": float(depth[branched].float().sum()) / n,
            "rail/gain": float(gains[branched].sum()) / n,
        }

    def after_update(self, batch: RolloutBatch, ctx: StepContext) -> None:
        return None

    # ------------------------------------------------------------------ explicit state
    def state_dict(self) -> dict[str, Any]:
        return {"controller": self.ctrl._asdict(), "coin": self.coin.get_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.ctrl = ControllerState(**state["controller"])
        self.coin.set_state(state["coin"])
