"""``posttrain flops CONFIG.yaml``: the RACE FLOP accounting of a training config, before it runs.

The YAML is either an llm run config (`posttrain.llm.config`) or a small mapping of its own;
both may carry a ``flops:`` section that sets or overrides the accounting's fields:

    flops:                      # every key optional; defaults below
      n_params: 1.5e9           # policy non-embedding parameters N (llm: from the tiny or a local model's config)
      n_head: 0                 # the LM head's V d, part of N (llm: likewise)
      lora: false               # frozen base + adapters
      n_lora: 0                 # adapter parameters
      gradient_checkpointing: false
      n_layer: 0                # only for count_attention
      d_model: 0
      prompts_per_step: 16      # G (llm: data.prompts_per_step)
      group_size: 8             # K (llm: rollout.group_size)
      prompt_tokens: 64         # mean prompt length T_p (llm: measured on 256 of the task's prompts)
      response_tokens: 8        # mean response length T_r (llm: rollout.max_new_tokens, an upper bound)
      trained_per_prompt: null  # rollouts per prompt entering the loss (null: all K)
      steps: 40                 # U (llm: optim.steps)
      epochs: 1                 # mu (llm: optim.updates_per_batch)
      old_logp: false
      ref_forward: false        # llm: true when the method reads reference log-probs (e.g. a KL term)
      prefix_sharing: true
      count_attention: false
      reward: {kind: rule, n_params: 0, steps: 1, judge_output_tokens: 0}

The llm config's tiny model (``model.path: null``) gives ``N`` from its architecture (attention with
grouped KV heads + gated MLP, and the ``[V, d]`` LM head, whose matmul costs ``2 V d`` FLOPs a token
even when tied; the input embedding, a lookup, excluded); a hub id needs ``flops.n_params``
(count its LM head in it: ``V d`` is about a quarter of Qwen2.5-0.5B's multiplies); a local
``model.path`` directory, or a registered model name prepared on this machine, gives them from its config
as the trainer counts them (`posttrain.llm.train.step_log.policy_cost`).
``T_p`` of an llm config is the mean token count of 256 of its task's prompts (seeded by ``seed``):
characters for the tiny model's one-token-per-character tokenizer, the tokenizer of a local
``model.path`` directory otherwise; a hub id needs ``flops.prompt_tokens``.

The command prints two accountings (`posttrain.theory.race_flops.Accounting`): the paper's per-token count
(every prompt and response token of each row one forward of all ``N``), and what the trainer executes
with each group's prompt computed once (``SHARED_PROMPT``: KV-cached generation, each prompt prefilled
once; training passes over each prompt once and each response token but the last, the LM head ``n_head``
only where a log-prob is used).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from posttrain.errors import DomainError
from posttrain.llm.config import plan_from_dict, read_yaml_mapping
from posttrain.llm.methods.needs import Need
from posttrain.llm.tools.tiny import char_tokenizer
from posttrain.llm.typed import from_mapping, parse
from posttrain.theory.race_flops import Accounting, FlopSplit, PolicyCost, RewardCost, RewardKind, flops_per_step

__all__ = ["FlopsPlan", "load_plan", "plan_flops", "plan_from_mapping"]

LLM_SECTIONS = ("seed", "model", "data", "rollout", "algorithm", "optim", "checkpoint", "logging")


@dataclass(frozen=True)
class FlopsPlan:
    """Expected per-step token counts and size facts of a run (see the module docstring)."""

    n_params: float = 0.0
    n_head: float = 0.0
    lora: bool = False
    n_lora: float = 0.0
    gradient_checkpointing: bool = False
    n_layer: int = 0
    d_model: int = 0
    prompts_per_step: int = 16
    group_size: int = 8
    prompt_tokens: float = 64.0
    response_tokens: float = 8.0
    trained_per_prompt: int | None = None
    steps: int = 40
    epochs: int = 1
    old_logp: bool = False
    ref_forward: bool = False
    prefix_sharing: bool = True
    count_attention: bool = False
    reward: dict[str, Any] = field(default_factory=dict)


PROMPT_SAMPLE = 256
"""Prompts of the task whose mean token count is ``T_p`` for an llm config."""


def _local_dir(path: str | None) -> Path | None:
    """``model.path`` as a local directory (a registered name resolved to its prepared one), or None."""
    from posttrain.llm.tools.models import ModelNotPrepared, resolve_model_path

    try:
        resolved = resolve_model_path(path)
    except ModelNotPrepared:
        return None
    return Path(resolved) if resolved is not None and Path(resolved).is_dir() else None


def _mean_prompt_tokens(cfg: Any, task: Any) -> float | None:
    """Mean prompt length in tokens of `PROMPT_SAMPLE` task prompts, or None when no tokenizer is at hand."""
    prompts = [p.prompt for p in task.sample(random.Random(cfg.seed), PROMPT_SAMPLE)]
    if cfg.model.path is None:  # the tiny model's tokenizer: one token per character, no special tokens
        return sum(len(p) for p in prompts) / len(prompts)
    local = _local_dir(cfg.model.path)
    if local is None:
        return None
    from transformers import AutoTokenizer

    ids = cfg.model.prompt_format().encode(AutoTokenizer.from_pretrained(local), prompts)
    return sum(len(x) for x in ids) / len(ids)


def _from_llm(raw: Mapping[str, Any]) -> dict[str, Any]:
    plan = plan_from_dict(raw)
    cfg = plan.config
    out: dict[str, Any] = {
        "prompts_per_step": cfg.data.prompts_per_step,
        "group_size": cfg.rollout.group_size,
        "response_tokens": cfg.rollout.max_new_tokens,
        "steps": cfg.optim.steps,
        "epochs": cfg.optim.updates_per_batch,
        "ref_forward": Need.LOGP_REF in plan.algorithm.needs,  # as the trainer counts it
    }
    measured = _mean_prompt_tokens(cfg, plan.task)
    if measured is not None:
        out["prompt_tokens"] = measured
    if cfg.model.path is None:
        tiny = cfg.model.tiny
        d, kv = tiny.hidden_size, tiny.hidden_size * tiny.num_key_value_heads // tiny.num_attention_heads
        per_layer = 2 * d * d + 2 * d * kv + 3 * d * tiny.intermediate_size  # q, o; k, v (GQA); gated MLP
        head = len(char_tokenizer()) * d
        out.update(
            n_params=float(tiny.num_hidden_layers * per_layer + head),  # + the LM head
            n_head=float(head),
            n_layer=tiny.num_hidden_layers,
            d_model=tiny.hidden_size,
        )
    elif (local := _local_dir(cfg.model.path)) is not None:  # the size facts the trainer logs, from the config
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from posttrain.llm.train.step_log import policy_cost

        with torch.device("meta"):
            cost = policy_cost(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(local)))
        out.update(n_params=cost.n_params, n_head=cost.n_head, n_layer=cost.n_layer, d_model=cost.d_model)
    return out


def plan_from_mapping(raw: Mapping[str, Any]) -> FlopsPlan:
    """Build a `FlopsPlan` from a parsed YAML mapping (llm config and/or ``flops:`` section)."""
    if not isinstance(raw, Mapping):
        raise DomainError("config: expected a YAML mapping at the top level")
    own = dict(raw.get("flops") or {})
    rest = {k: v for k, v in raw.items() if k != "flops"}
    values: dict[str, Any] = {}
    llm = any(k in LLM_SECTIONS for k in rest)
    if llm:
        values.update(_from_llm(rest))
    elif rest:
        own = {**rest, **own}
    values.update(own)
    if llm and "prompt_tokens" not in values:
        raise DomainError(
            f"flops.prompt_tokens: model.path {rest['model']['path']!r} is not a local directory, so its tokenizer cannot "
            "measure the prompts; set flops.prompt_tokens (mean prompt length in tokens)"
        )
    plan = from_mapping(FlopsPlan, values, "flops")
    reward = {k: parse(f"flops.reward.{k}", v, float) if k == "n_params" else v for k, v in plan.reward.items()}
    plan = replace(plan, reward=reward)
    if not plan.n_params > 0:
        raise DomainError("flops.n_params: expected the policy's parameter count (> 0)")
    return plan


def load_plan(path: str | Path) -> FlopsPlan:
    """Read a YAML file with the strict loader and build its plan (a syntax error names the file and line)."""
    return plan_from_mapping(read_yaml_mapping(path))


def plan_flops(plan: FlopsPlan, *, accounting: Accounting = Accounting.PER_TOKEN) -> tuple[FlopSplit, FlopSplit]:
    """``(one step, whole run)`` accounting of a plan (every prompt and rollout at the mean lengths)."""
    g, k = int(plan.prompts_per_step), int(plan.group_size)
    trained = np.ones((g, k), dtype=bool)
    if plan.trained_per_prompt is not None:
        if not 0 <= plan.trained_per_prompt <= k:
            raise DomainError(f"trained_per_prompt: expected 0..{k}, got {plan.trained_per_prompt}")
        trained[:, plan.trained_per_prompt :] = False
    reward = dict(plan.reward)
    reward["kind"] = RewardKind(reward.get("kind", "rule"))
    step = flops_per_step(
        np.full(g, float(plan.prompt_tokens)),
        np.full((g, k), float(plan.response_tokens)),
        trained,
        policy=PolicyCost(
            n_params=float(plan.n_params),
            n_head=float(plan.n_head),
            n_lora=float(plan.n_lora),
            lora=bool(plan.lora),
            gradient_checkpointing=bool(plan.gradient_checkpointing),
            n_layer=int(plan.n_layer),
            d_model=int(plan.d_model),
        ),
        reward=RewardCost(**reward),
        epochs=int(plan.epochs),
        old_logp=bool(plan.old_logp),
        ref_forward=bool(plan.ref_forward),
        prefix_sharing=bool(plan.prefix_sharing),
        count_attention=bool(plan.count_attention),
        accounting=accounting,
    )
    return step, step.scaled(int(plan.steps))


def print_flops(path: str | Path, console: Any) -> None:
    """Print the per-step and whole-run accounting of ``path`` as a rich table: the paper's per-token count and
    the count with each group's prompt computed once."""
    from rich.table import Table

    plan = load_plan(path)
    paper, shared = plan_flops(plan), plan_flops(plan, accounting=Accounting.SHARED_PROMPT)
    table = Table(title=f"RACE FLOP accounting: {path} (N = {plan.n_params:.3g}, {plan.steps} steps)")
    for column in ("component", "per step, per token", "per step, prompt once", "run, per token", "run, prompt once"):
        table.add_column(column, justify="left" if column == "component" else "right")
    table.add_column("fraction (per token / prompt once)", justify="right")
    for name in ("search", "learning", "reward", "total"):
        values = [getattr(split, name) for split in (paper[0], shared[0], paper[1], shared[1])]
        fractions = [getattr(run, name) / run.total if run.total > 0 else 0.0 for run in (paper[1], shared[1])]
        table.add_row(name, *(f"{v:.4g}" for v in values), " / ".join(f"{f:.3f}" for f in fractions))
    console.print(table)
    console.print(
        f"update fraction p = {paper[1].p:.4f} per token (the paper's convention), {shared[1].p:.4f} with each "
        f"prompt computed once; log10 C_total = {np.log10(paper[1].total):.3f} per token, "
        f"{np.log10(shared[1].total):.3f} prompt once ({shared[1].total / paper[1].total:.2f}x)"
    )
