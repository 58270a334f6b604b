"""The trainer's per-step log: the ``metrics.jsonl`` row and its RACE FLOP accounting.

Metrics per step: ``step``, ``reward_mean``, ``reward_std`` (over the groups whose rewards were all
computed), ``unjudged`` (samples whose reward could not be computed), ``excluded_groups`` (groups left
out of the loss for it), ``kl`` (mean estimator value to the
reference model, null without a KL term), ``entropy`` (mean token entropy of the sampled
responses), ``response_len``, ``loss``, ``grad_norm``, ``lr``, ``clip_frac`` and ``policy_kl``
(last update), ``logp_gap`` (mean ``|logp_old - logp|`` at the first, on-policy update: the
engine/trainer mismatch), ``gen_time_s``, ``step_time_s``, the FLOP split, then the metrics of the
bundle's hook (averaged over the updates) and of the rollout stages, and ``rollout/version`` /
``rollout/lag`` (the policy version that generated the batch and the steps since; docs: off_policy.md).
With ``algorithm.rollout_correction``, its ``pg/is_*`` statistics (`posttrain.llm.methods.correction`).

"Is it learning?" (`learning_diagnostics`): ``groups`` (G of the batch), ``zero_variance_groups`` (the share of
the judged groups whose K rewards are all equal: a group-baseline advantage is 0 on each of their samples),
``loss_tokens`` (tokens in the loss), ``advantage_std`` and ``advantage_abs_mean`` (over the loss tokens) and
``flat_step``: true when there was a judged group, every judged group was constant and every advantage in
the loss is 0, so the policy-gradient term of the step is exactly 0 (only a KL or entropy term moves the
policy); the progress display then prints a one-line warning. Rows not sampled from the policy
(``RolloutBatch.synthetic``, e.g. an appended reference solution) are left out of ``reward_mean``,
``reward_std`` and ``response_len``: they would inflate the training curves.

FLOPs per step (RACE accounting, `posttrain.theory.race_flops`, arXiv:2607.13389, of the path that ran):
``flops/search``, ``flops/learning``, ``flops/reward``, ``flops/total``, ``flops/p`` from the step's
actual prompt and response token counts: KV-cached generation with each prompt prefilled once, then
every rollout trained ``updates_per_batch`` times, with a reference forward when the algorithm needs
``logp_ref``, each group counted with its prompt computed once (``Accounting.SHARED_PROMPT``) where the
step's first training forward shared it and once per sample (``Accounting.UNSHARED``) where it did not
(`posttrain.llm.rollout.shared_prefix.recorded_groups`); a rule verifier (0 reward FLOPs). ``N``
is `policy_cost`'s count of the model's weight matrices with the LM head (its ``[V, d]`` matmul
costs ``2 V d`` FLOPs a position, tied to the input embedding or not: about a quarter of
Qwen2.5-0.5B's), counted only where logits are computed (``n_head = V d``), and without the input
embedding (a lookup, no multiply). Not counted: other filled needs (teacher forwards) and extra forwards
of hooks and stages (SIS, replay re-scoring, RAIL features). ``posttrain flops`` prints the paper's
per-token count beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.theory.race_flops import Accounting, FlopSplit, PolicyCost, learning_flops, search_flops

__all__ = ["learning_diagnostics", "policy_cost", "step_flops", "step_metrics"]


def policy_cost(model: torch.nn.Module, *, lm_head: bool = True) -> PolicyCost:
    """RACE size facts of a causal LM: ``N`` = elements of its weight matrices other than the input
    embedding (biases and norms excluded, as in ``posttrain flops``), the LM head included once
    even when tied to the input embedding (``lm_head=False``: without it, the non-embedding count of
    scaling laws); ``n_head``: the LM head's ``V d`` (0 without it); ``n_layer``, ``d_model`` from the HF
    config when present."""
    bare = getattr(model, "module", model)
    skip: set[int] = set()
    head = getattr(bare, "get_output_embeddings", lambda: None)()
    for get in ("get_input_embeddings", "get_output_embeddings"):
        emb = getattr(bare, get, lambda: None)()
        if emb is not None:
            skip.update(id(p) for p in emb.parameters())
    n = sum(p.numel() for p in bare.parameters() if p.ndim >= 2 and id(p) not in skip)
    n_head = sum(p.numel() for p in head.parameters() if p.ndim >= 2) if lm_head and head is not None else 0
    config = getattr(bare, "config", None)
    return PolicyCost(
        float(n + n_head),
        n_layer=int(getattr(config, "num_hidden_layers", 0) or 0),
        d_model=int(getattr(config, "hidden_size", 0) or 0),
        n_head=float(n_head),
    )


def step_flops(
    batch: RolloutBatch,
    cost: PolicyCost,
    *,
    epochs: int,
    ref_forward: bool,
    world: int,
    shared: Sequence[bool] | None = None,
) -> FlopSplit:
    """The RACE FLOP split of one step on ``batch`` (summed over ``world`` data-parallel ranks: a collective).

    ``shared``: per group, whether its training forward computed the prompt once (`recorded_groups` of the
    step's first update); None, or a record of another length than G: no group did.
    """
    g, k = batch.num_groups, batch.group_size
    tp = batch.prompt_mask.sum(-1).reshape(g, k)[:, 0].cpu().numpy()  # [G] (the K rows share the prompt)
    tr = batch.mask.sum(-1).reshape(g, k).cpu().numpy()  # [G, K]
    once = np.asarray(shared if shared is not None and len(shared) == g else [False] * g, dtype=bool)
    once = np.repeat(once[:, None], k, axis=1)  # [G, K]
    learning = sum(
        learning_flops(tp, tr, rows, policy=cost, epochs=epochs, ref_forward=ref_forward, accounting=accounting)
        for rows, accounting in ((once, Accounting.SHARED_PROMPT), (~once, Accounting.UNSHARED))
    )
    split = FlopSplit(search_flops(tp, tr, policy=cost, accounting=Accounting.UNSHARED), float(learning), 0.0)
    if world == 1:
        return split
    parts = torch.tensor([split.search, split.learning, split.reward], dtype=torch.float64)
    dist.all_reduce(parts)
    return FlopSplit(*(float(x) for x in parts))


def learning_diagnostics(batch: RolloutBatch) -> dict[str, Any]:
    """The "is it learning?" metrics of a prepared batch (module docstring); advantages must be filled."""
    rewards = batch.grouped_rewards()
    judged = batch.judged_groups()
    constant = (rewards == rewards[:, :1]).all(dim=1) & judged
    n_judged = int(judged.sum())
    lm = batch.loss_mask()
    adv = batch.advantages[lm].double() if batch.advantages is not None else torch.zeros(0, dtype=torch.float64)
    flat = n_judged > 0 and bool(constant.sum() == n_judged) and not bool(adv.abs().gt(0).any())
    return {
        "groups": batch.num_groups,
        "zero_variance_groups": float(constant.sum()) / n_judged if n_judged else None,
        "loss_tokens": int(lm.sum()),
        "advantage_std": float(adv.std(correction=0)) if adv.numel() else None,
        "advantage_abs_mean": float(adv.abs().mean()) if adv.numel() else None,
        "flat_step": flat,
    }


def step_metrics(
    step: int,
    batch: RolloutBatch,
    stats: dict[str, float],
    *,
    logp_gap: float | None,
    grad_norm: float | None,
    lr: float,
    gen_time_s: float,
    step_time_s: float,
    flops: FlopSplit,
    extra: dict[str, float],
) -> dict[str, Any]:
    """The ``metrics.jsonl`` row of a step; ``stats`` are the last update's loss statistics (None: no update)."""
    judged = batch.judged_groups().repeat_interleave(batch.group_size)
    sampled = torch.ones_like(judged) if batch.synthetic is None else ~batch.synthetic
    rewards = batch.rewards[judged & sampled]
    return {
        "step": step,
        "reward_mean": float(rewards.mean()) if rewards.numel() else None,
        "reward_std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
        "unjudged": int((~batch.judged).sum()) if batch.judged is not None else 0,
        "excluded_groups": int((~batch.judged_groups()).sum()),
        "kl": stats.get("kl"),
        "entropy": stats["entropy"],
        "response_len": float(batch.mask[sampled].sum(dim=1).float().mean()),
        "loss": stats["loss"],
        "grad_norm": grad_norm,
        "lr": lr,
        "clip_frac": stats.get("pg/clip_frac"),
        "policy_kl": stats.get("pg/approx_kl"),
        "logp_gap": logp_gap,
        **learning_diagnostics(batch),
        **{key: value for key, value in stats.items() if key.startswith("pg/is_")},
        "gen_time_s": gen_time_s,
        "step_time_s": step_time_s,
        **flops.as_dict(),
        **extra,
    }
