"""The edge of ``posttrain pairs design`` and ``posttrain dpo``: configs to models, pool, design, pairs file, DPO run.

Directory of a design (``--out``):

    out/config.yaml        the resolved config
    out/tiny/, out/sft_metrics.jsonl, out/initial/   as in a training run: ``initial/`` is pi_0 (the DPO reference)
    out/pairs.jsonl        the designed pairs, labelled by the task's reward (`posttrain.llm.methods.pairs`)
    out/pool_pairs.jsonl   every labelled, non-tied within-prompt pair of the pool (a held-out set for ``dpo.eval_pairs``)
    out/pool.npz           the pool's features phi [G, K, D], sequence log-probs logp [G, K], rewards [G, K]
    out/design.json        the design log: objective, Frank-Wolfe gap, prompts covered, pool sizes, label counts, times

A DPO run directory holds ``config.yaml``, ``metrics.jsonl`` and ``checkpoints/`` (`posttrain.llm.train.dpo`).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from posttrain.errors import DomainError
from posttrain.llm.config import RunConfig, RunPlan
from posttrain.llm.methods.pairs import label_pairs, pool_forward, read_pairs, write_pairs
from posttrain.llm.policy import prepare_policy
from posttrain.llm.rollout.text import score_responses
from posttrain.llm.run import ENGINE_FACTORIES, as_plan, build_initial, load_model, training_task
from posttrain.llm.tools.models import resolve_model_path
from posttrain.llm.train.dpo import train_dpo
from posttrain.llm.train.rundir import atomic_write_text, check_run_dir, claim_run_dir
from posttrain.llm.train.sinks import metric_sinks
from posttrain.theory.dpo_design import within_prompt_pairs
from posttrain.theory.dpo_pair_selection import select_pairs

__all__ = ["design_from_config", "dpo_from_config", "sample_pool"]


def sample_pool(plan: RunPlan, model: Any, tokenizer: Any, task: Any, model_dir: Path) -> dict[str, Any]:
    """``pairs.prompts`` x ``pairs.completions`` samples of ``model`` (the ``rollout`` section's engine and sampling),
    scored by ``task``, with their features ``[G, K, D]`` and sequence log-probs ``[G, K]`` (float64 numpy)."""
    cfg = plan.config
    p = cfg.pairs
    g, k = p.prompts, p.completions
    problems = task.sample(random.Random(cfg.seed), g)
    prompts = cfg.model.prompt_format().encode(tokenizer, [x.prompt for x in problems])
    t0 = time.perf_counter()
    engine = ENGINE_FACTORIES[cfg.rollout.engine](cfg, plan.sampling, model, tokenizer, model_dir)
    r = engine.generate(prompts, n=k, seed=cfg.seed)
    rewards, texts = score_responses(tokenizer, task, problems, r.response_ids, r.mask, k)
    t1 = time.perf_counter()
    model.eval()
    feats, logps = [], []
    for s in range(0, g * k, 64):  # 64 rows a forward
        f, lp = pool_forward(model, r.prompt_ids[s : s + 64], r.prompt_mask[s : s + 64], r.response_ids[s : s + 64],
                             r.mask[s : s + 64], layer=p.layer)  # fmt: skip
        feats.append(f.double().cpu())
        logps.append(lp.double().cpu())
    phi, logp = torch.cat(feats).reshape(g, k, -1).numpy(), torch.cat(logps).reshape(g, k).numpy()
    return {
        "prompts": [x.prompt for x in problems], "texts": [texts[i * k : (i + 1) * k] for i in range(g)],
        "rewards": np.asarray(rewards, dtype=np.float64).reshape(g, k), "phi": phi, "logp": logp,
        "generate_s": t1 - t0, "features_s": time.perf_counter() - t1,
    }  # fmt: skip


def design_from_config(run: RunPlan | RunConfig, out_dir: str | Path, *, overwrite: bool = False) -> dict[str, Any]:
    """``posttrain pairs design``: pi_0 (SFT warm-up included), its pool, the design, the pairs file; returns the log."""
    plan = as_plan(run)
    cfg = plan.config
    p, out = cfg.pairs, Path(out_dir)
    check_run_dir(out, cfg, resume=False, overwrite=overwrite)
    task = training_task(plan)
    claim_run_dir(out, cfg, {}, overwrite=overwrite)
    initial = build_initial(cfg, out, task)
    model, tokenizer = load_model(initial, cfg)
    pool = sample_pool(plan, model, tokenizer, task, initial)
    dim = pool["phi"].shape[-1]
    if p.pca_dim is not None and p.pca_dim > dim:
        raise DomainError(f"pairs.pca_dim: expected <= the feature dimension {dim} (hidden size), got {p.pca_dim}")
    t0 = time.perf_counter()
    sel = select_pairs(
        pool["phi"], pool["logp"], p.n_pairs, beta=p.beta, ridge=p.ridge, pca_dim=p.pca_dim, per_prompt=p.per_prompt,
        seed=cfg.seed, max_iter=p.max_iter, tol=p.tol, max_per_prompt=p.max_per_prompt, design=p.design,
    )  # fmt: skip
    design_s = time.perf_counter() - t0
    rewards = pool["rewards"] if p.label == "reward" else None
    pairs, counts = label_pairs(sel.edges, sel.weights, pool["prompts"], pool["texts"], rewards, ties=p.ties)
    write_pairs(out / "pairs.jsonl", pairs)
    np.savez(out / "pool.npz", phi=pool["phi"], logp=pool["logp"], rewards=pool["rewards"])
    if rewards is not None:  # the held-out set: every labelled, non-tied pair of the pool
        edges = within_prompt_pairs(p.prompts, p.completions)
        every, _ = label_pairs(edges, sel.design.q, pool["prompts"], pool["texts"], rewards, ties="exclude")
        write_pairs(out / "pool_pairs.jsonl", every)
    per_prompt = np.bincount(sel.edges[:, 0], minlength=p.prompts)
    log = {
        "design": p.design, "objective": sel.design.objective, "uniform_objective": sel.uniform_objective,
        "status": sel.design.status, "iterations": sel.design.iterations, "fw_gap": sel.design.duality_gap,
        "prompts_covered": sel.prompts_covered, "prompts_drawn": int((per_prompt > 0).sum()),
        "max_pairs_of_a_prompt": int(per_prompt.max()),
        "pool": {"prompts": p.prompts, "completions": p.completions, "edges": int(p.prompts * p.completions *
                 (p.completions - 1) // 2), "feature_dim": dim, "pca_dim": p.pca_dim,
                 "reward_mean": float(np.nanmean(pool["rewards"])),
                 "distinct_completions_mean": float(np.mean([len(set(t)) for t in pool["texts"]]))},
        "labels": counts, "q_selected": {"min": float(sel.weights.min()), "max": float(sel.weights.max()),
                                         "sum": float(sel.weights.sum())},
        "times_s": {"generate": pool["generate_s"], "features": pool["features_s"], "design": design_s},
        "model_dir": str(initial),
    }  # fmt: skip
    atomic_write_text(out / "design.json", json.dumps(log, indent=1) + "\n")
    return log


def _pairs_file(where: str, value: str | None) -> Path:
    if value is None:
        raise DomainError(f"{where}: set it to a JSONL file of pairs (prompt, chosen, rejected per line)")
    path = Path(value)
    if not path.is_file():
        raise DomainError(f"{where}: {path} is not a file (run `posttrain pairs design` first?)")
    return path


def dpo_from_config(
    run: RunPlan | RunConfig, out_dir: str | Path, *, overwrite: bool = False, on_step: Any = None
) -> list[dict[str, Any]]:
    """``posttrain dpo``: the policy and frozen reference, ``dpo.pairs``, `train_dpo`; returns the metric rows."""
    plan = as_plan(run)
    cfg = plan.config
    d, out = cfg.dpo, Path(out_dir)
    path = _pairs_file("dpo.pairs", d.pairs)
    pairs = read_pairs(path, where="dpo.pairs")
    eval_pairs = read_pairs(_pairs_file("dpo.eval_pairs", d.eval_pairs), where="dpo.eval_pairs") if d.eval_pairs else []
    model_dir = Path(resolve_model_path(cfg.model.path) or "") if cfg.model.path else path.parent / "initial"
    if not cfg.model.path and not (model_dir / "config.json").is_file():
        raise DomainError(f"model.path: null and {model_dir} holds no model; set model.path to the DPO initial model")
    check_run_dir(out, cfg, resume=False, overwrite=overwrite)
    task = training_task(plan) if cfg.logging.eval_every else None
    claim_run_dir(out, cfg, {}, overwrite=overwrite)
    model, tokenizer = load_model(model_dir, cfg)
    m = cfg.model
    model = prepare_policy(model, lora=m.lora, gradient_checkpointing=m.gradient_checkpointing, base_path=model_dir)
    reference = load_model(m.reference or model_dir, cfg)[0]
    evaluate = None
    if task is not None:
        from posttrain.llm.train.evaluate import evaluate as held_out

        def evaluate(policy: Any) -> dict[str, float]:
            return held_out(policy, tokenizer, task, n_prompts=cfg.data.eval_prompts, n_samples=cfg.logging.eval_samples,
                            seed=cfg.seed, sampling=plan.sampling, **m.prompt_format().options())  # fmt: skip

    with metric_sinks(cfg, out) as to_sinks:

        def each(row: dict[str, Any]) -> None:
            to_sinks(row)
            if on_step is not None:
                on_step(row)

        return train_dpo(cfg, model=model, reference=reference, tokenizer=tokenizer, pairs=pairs, out_dir=out,
                         eval_pairs=eval_pairs, evaluate=evaluate, on_step=each)  # fmt: skip
