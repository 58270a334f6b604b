"""``posttrain flops CONFIG.yaml``: the RACE FLOP accounting of a training config, before it runs.

The YAML is either an llm run config (`posttrain.llm.config`) or a small mapping of its own;
both may carry a ``flops:`` section that sets or overrides the accounting's fields:

    flops:                      # every key optional; defaults below
      n_params: 1.5e9           # policy non-embedding parameters N (required unless a tiny llm model)
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
      ref_forward: false        # llm: true when algorithm.kl is set
      prefix_sharing: true
      count_attention: false
      reward: {kind: rule, n_params: 0, steps: 1, judge_output_tokens: 0}

The llm config's tiny model (``model.path: null``) gives ``N`` from its architecture (attention with
grouped KV heads + gated MLP, and the ``[V, d]`` LM head, whose matmul costs ``2 V d`` FLOPs a token
even when tied; the input embedding, a lookup, excluded); a hub/local model needs ``flops.n_params``
(count its LM head in it: ``V d`` is about a quarter of Qwen2.5-0.5B's multiplies).
``T_p`` of an llm config is the mean token count of 256 of its task's prompts (seeded by ``seed``):
characters for the tiny model's one-token-per-character tokenizer, the tokenizer of a local
``model.path`` directory otherwise; a hub id needs ``flops.prompt_tokens``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from posttrain.errors import DomainError
from posttrain.llm.config import config_from_dict, from_mapping, parse_scalar
from posttrain.llm.tools.tiny import TinyConfig, char_tokenizer
from posttrain.theory.race_flops import FlopSplit, PolicyCost, RewardCost, RewardKind, flops_per_step

__all__ = ["FlopsPlan", "load_plan", "plan_flops", "plan_from_mapping"]

LLM_SECTIONS = ("seed", "model", "data", "rollout", "algorithm", "optim", "checkpoint", "logging")


@dataclass(frozen=True)
class FlopsPlan:
    """Expected per-step token counts and size facts of a run (see the module docstring)."""

    n_params: float = 0.0
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


def _mean_prompt_tokens(cfg: Any) -> float | None:
    """Mean prompt length in tokens of `PROMPT_SAMPLE` task prompts, or None when no tokenizer is at hand."""
    from posttrain.llm.rollout.tasks import make_task

    prompts = [
        p.prompt for p in make_task(cfg.data.task, **cfg.data.options).sample(random.Random(cfg.seed), PROMPT_SAMPLE)
    ]
    if cfg.model.path is None:  # the tiny model's tokenizer: one token per character, no special tokens
        return sum(len(p) for p in prompts) / len(prompts)
    if not Path(cfg.model.path).is_dir():
        return None
    from transformers import AutoTokenizer

    from posttrain.llm.rollout.text import encode_prompts

    ids = encode_prompts(AutoTokenizer.from_pretrained(cfg.model.path), prompts, chat_template=cfg.model.chat_template)
    return sum(len(x) for x in ids) / len(ids)


def _from_llm(raw: Mapping[str, Any]) -> dict[str, Any]:
    cfg = config_from_dict(raw)
    out: dict[str, Any] = {
        "prompts_per_step": cfg.data.prompts_per_step,
        "group_size": cfg.rollout.group_size,
        "response_tokens": cfg.rollout.max_new_tokens,
        "steps": cfg.optim.steps,
        "epochs": cfg.optim.updates_per_batch,
        "ref_forward": cfg.algorithm.kl is not None,
    }
    measured = _mean_prompt_tokens(cfg)
    if measured is not None:
        out["prompt_tokens"] = measured
    if cfg.model.path is None:
        tiny = TinyConfig(**cfg.model.tiny)
        d, kv = tiny.hidden_size, tiny.hidden_size * tiny.num_key_value_heads // tiny.num_attention_heads
        per_layer = 2 * d * d + 2 * d * kv + 3 * d * tiny.intermediate_size  # q, o; k, v (GQA); gated MLP
        out.update(
            n_params=float(tiny.num_hidden_layers * per_layer + len(char_tokenizer()) * d),  # + the LM head
            n_layer=tiny.num_hidden_layers,
            d_model=tiny.hidden_size,
        )
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
    reward = {k: parse_scalar(f"flops.reward.{k}", v, float) if k == "n_params" else v for k, v in plan.reward.items()}
    plan = replace(plan, reward=reward)
    if not plan.n_params > 0:
        raise DomainError("flops.n_params: expected the policy's parameter count (> 0)")
    return plan


def load_plan(path: str | Path) -> FlopsPlan:
    """Read a YAML file with the safe loader and build its plan (a syntax error names the file and line)."""
    from posttrain.llm.config import read_yaml

    return plan_from_mapping(read_yaml(path) or {})


def plan_flops(plan: FlopsPlan) -> tuple[FlopSplit, FlopSplit]:
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
    )
    return step, step.scaled(int(plan.steps))


def print_flops(path: str | Path, console: Any) -> None:
    """Print the per-step and whole-run accounting of ``path`` as a rich table."""
    from rich.table import Table

    plan = load_plan(path)
    step, run = plan_flops(plan)
    table = Table(title=f"RACE FLOP accounting: {path} (N = {plan.n_params:.3g}, {plan.steps} steps)")
    table.add_column("component")
    table.add_column("per step", justify="right")
    table.add_column("run", justify="right")
    table.add_column("fraction", justify="right")
    for name, a, b, frac in (
        ("search", step.search, run.search, run.s),
        ("learning", step.learning, run.learning, run.p),
        ("reward", step.reward, run.reward, run.f),
        ("total", step.total, run.total, 1.0),
    ):
        table.add_row(name, f"{a:.4g}", f"{b:.4g}", f"{frac:.3f}")
    console.print(table)
    console.print(f"update fraction p = {run.p:.4f}; log10 C_total = {np.log10(run.total):.3f}")
