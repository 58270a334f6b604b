"""RAIL in the LLM trainer (spec 11, section 9): branch continuations from a chosen prefix of a base rollout.

:class:`RailTrainer` changes only the rollout phase of :class:`~posttrain.llm.trainer.Trainer`. Per
prompt: ``K - b`` base responses are sampled; every prefix of depth 1..L-1 of a base response is a
candidate state with the features of spec 11 §7b (depth, normalised next-token entropy from the
trainer's forward, the base response's reward, the group mean, training progress, saturation);
one state is chosen (shadow phase: uniformly at random; live: the recoverability controller's
argmax behind the gate ``kappa`` with ``explore`` random choices; ``heuristic=True``: the
highest-entropy state, the static baseline) and ``b`` continuations are generated from
``prompt + prefix`` **through the rollout Protocol** (a prefix is just a longer prompt). A gated-out
prompt gets ``b`` ordinary samples instead (branching at the root), so every group has K responses.
Branch rows are ``prefix + continuation`` with behaviour log-probs ``base[:d] + engine``; the
realised gains (:func:`~posttrain.estimators.rail.recoverability_gain`) refit the controller
(:func:`~posttrain.estimators.rail.controller_update`) after each step. The update is the
algorithm's usual loss on the reshaped groups.

Simplifications: one intervention per prompt with a fixed width ``b`` at the engine's temperature
(the action space is *where* to branch; tempered branches need a per-call temperature in the
Protocol); a continuation may use up to ``max_new_tokens`` more tokens after its prefix; single
process only. Logged per step: ``rail/branched`` (fraction of prompts branched below the root),
``rail/depth`` and ``rail/gain`` (mean realised gain of branched prompts).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from posttrain.estimators.rail import controller_init, controller_predict, controller_update, recoverability_gain
from posttrain.llm._derived import rebuild_as
from posttrain.llm.batch import RolloutBatch
from posttrain.llm.generate import token_logprobs
from posttrain.llm.text import decode_responses, encode_prompts, right_pad
from posttrain.llm.trainer import Trainer

__all__ = ["RailTrainer"]


class RailTrainer(Trainer):
    """A :class:`Trainer` whose groups are ``K - branches`` base responses plus ``branches`` branch continuations.

    Args:
        branches: b, continuations per prompt (``1 <= b < K``). shadow_steps: steps with random states.
        kappa: gate on the predicted gain. explore: probability of a random state in the live phase.
        heuristic: use the static highest-entropy rule instead of the controller.
        window, gamma, delta, ridge: the controller's trace window, recency, Huber delta and ridge.
        **kwargs: the :class:`Trainer` arguments.
    """

    def __init__(
        self,
        cfg: Any,
        *,
        branches: int = 4,
        shadow_steps: int = 5,
        kappa: float = 0.0,
        explore: float = 0.1,
        heuristic: bool = False,
        window: int = 2000,
        gamma: float = 0.99,
        delta: float = 0.05,
        ridge: float = 1e-4,
        **kwargs: Any,
    ) -> None:
        super().__init__(cfg, **kwargs)
        if not 1 <= branches < cfg.rollout.group_size or self.world != 1:
            raise ValueError(f"branches: need 1 <= b < K = {cfg.rollout.group_size} and a single process")
        self.branches, self.shadow_steps, self.kappa, self.explore = int(branches), int(shadow_steps), kappa, explore
        self.heuristic = heuristic
        self.fit_options = {"window": window, "gamma": gamma, "delta": delta, "ridge": ridge}
        self.ctrl = controller_init(1, 7)
        self.coin = torch.Generator().manual_seed(cfg.seed * 7919 + 11)
        self.rail_log: dict[str, float] = {}

    @classmethod
    def from_trainer(cls, trainer: Trainer, **rail: Any) -> RailTrainer:
        """A RAIL trainer on the same model, task, engine, algorithm and fillers (fresh optimizer)."""
        return rebuild_as(cls, trainer, **rail)

    def _features(self, base: Any, rewards: Tensor, g: int, k0: int) -> tuple[Tensor, Tensor]:
        """``[G, C, 7]`` candidate features (C = k0 * T prefixes) and ``[G, C]`` validity (1 <= depth < length)."""
        with torch.no_grad():
            _, ent = token_logprobs(
                self.policy, base.prompt_ids, base.prompt_mask, base.response_ids, base.mask,
                temperature=self.cfg.rollout.temperature, with_entropy=True,
            )  # fmt: skip
        assert ent is not None
        t = base.response_ids.shape[-1]
        lengths = base.mask.sum(-1, keepdim=True)
        depth = torch.arange(t).expand(g * k0, t)
        valid = (depth >= 1) & (depth < lengths)
        mean = rewards.mean(-1, keepdim=True).expand(g, k0).reshape(-1, 1).expand(-1, t)
        cols = [
            torch.ones(g * k0, t), depth / self.cfg.rollout.max_new_tokens,
            ent.float() / math.log(len(self.tokenizer)), rewards.reshape(-1, 1).expand(-1, t), mean,
            torch.full((g * k0, t), self.step / max(self.cfg.optim.steps, 1)), ((mean == 0) | (mean == 1)).float(),
        ]  # fmt: skip
        feats = torch.stack([c.float() for c in cols], -1).reshape(g, k0 * t, 7)
        return feats.double(), valid.reshape(g, k0 * t)

    def _choose(self, feats: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        """Per prompt: the chosen candidate index and whether it branches below the root."""
        g = feats.shape[0]
        random_pick = torch.multinomial(
            valid.double() + (~valid.any(-1, keepdim=True)).double(), 1, generator=self.coin
        )[:, 0]
        if self.heuristic:
            score = feats[..., 2]  # normalised entropy
        elif self.step < self.shadow_steps:
            return random_pick, valid.any(-1)
        else:
            score = controller_predict(self.ctrl, feats)[..., 0]
        score = torch.where(valid, score, torch.full_like(score, -math.inf))
        best = score.argmax(-1)
        take = score.amax(-1) > (-math.inf if self.heuristic else self.kappa)
        if self.heuristic:
            return best, take
        coin = torch.rand(g, generator=self.coin, dtype=torch.float64) < self.explore
        explore = ~take & coin & valid.any(-1)
        return torch.where(explore, random_pick, best), take | explore

    def rollout(self) -> tuple[RolloutBatch, list[str]]:
        cfg, tok = self.cfg, self.tokenizer
        g, k, b = cfg.data.prompts_per_step, cfg.rollout.group_size, self.branches
        k0 = k - b
        problems = self.task.sample(self.data_rng, g)
        prompts = encode_prompts(tok, [p.prompt for p in problems], chat_template=cfg.model.chat_template)
        seed = cfg.seed * 1_000_003 + self.step * 101
        base = self.engine.generate(prompts, n=k0, seed=seed)
        base_texts = decode_responses(tok, base.response_ids, base.mask)
        base_r = torch.tensor([self.task.reward(problems[i // k0], s) for i, s in enumerate(base_texts)]).reshape(g, k0)
        feats, valid = self._features(base, base_r, g, k0)
        pick, branched = self._choose(feats, valid)
        t = base.response_ids.shape[-1]
        row = torch.arange(g) * k0 + pick // t  # base row of the chosen prefix
        depth = torch.where(branched, pick % t, torch.zeros_like(pick))
        prefixes = [base.response_ids[r, :d].tolist() for r, d in zip(row.tolist(), depth.tolist(), strict=True)]
        cont = self.engine.generate([p + x for p, x in zip(prompts, prefixes, strict=True)], n=b, seed=seed + 7)
        resp, logp, texts = [], [], []
        for i in range(g * k):  # group-major rows: k0 base responses, then b branches
            grp, j = divmod(i, k)
            if j < k0:
                src = grp * k0 + j
                m = base.mask[src]
                resp.append(base.response_ids[src][m].tolist())
                logp.append(base.logp[src][m].tolist())
            else:
                c, d = grp * b + (j - k0), int(depth[grp])
                m = cont.mask[c]
                resp.append(prefixes[grp] + cont.response_ids[c][m].tolist())
                logp.append(base.logp[int(row[grp]), :d].tolist() + cont.logp[c][m].tolist())
        ids, mask = right_pad(resp, tok.pad_token_id)
        logp_old = torch.zeros(ids.shape, dtype=base.logp.dtype)
        for i, lp in enumerate(logp):
            logp_old[i, : len(lp)] = torch.tensor(lp, dtype=base.logp.dtype)
        texts = decode_responses(tok, ids, mask)
        rewards = torch.tensor(
            [self.task.reward(problems[i // k], s) for i, s in enumerate(texts)], dtype=torch.float32
        )
        p_ids = base.prompt_ids.reshape(g, k0, -1)[:, :1].expand(g, k, -1).reshape(g * k, -1)
        p_mask = base.prompt_mask.reshape(g, k0, -1)[:, :1].expand(g, k, -1).reshape(g * k, -1)
        batch = RolloutBatch(
            prompt_ids=p_ids, prompt_mask=p_mask, response_ids=ids, mask=mask, rewards=rewards,
            group_size=k, logp_old=logp_old,
        )  # fmt: skip
        gains = recoverability_gain(base_r.double(), rewards.reshape(g, k)[:, k0:].double())
        chosen = feats[torch.arange(g), pick]
        if bool(branched.any()) and not self.heuristic:
            self.ctrl = controller_update(
                self.ctrl, chosen[branched], torch.zeros(int(branched.sum()), dtype=torch.long), gains[branched],
                self.step, **self.fit_options,  # type: ignore[arg-type]
            )  # fmt: skip
        n = max(int(branched.sum()), 1)
        self.rail_log = {
            "rail/branched": float(branched.float().mean()),
            "rail/depth": float(depth[branched].float().sum()) / n,
            "rail/gain": float(gains[branched].sum()) / n,
        }
        return self.prepare(batch), texts

    def train_step(self) -> dict[str, Any]:
        metrics = super().train_step()
        return {**metrics, **self.rail_log}
