"""Select and Improve on the tiny causal LM: GRPO's accuracy change split into strategy selection and improvement.

The measurement of spec 19 (Krishnamurthy, Huang, Rajaraman 2026, arXiv:2606.13125, §3.3; the
decomposition is our diagnostic, :mod:`posttrain.theory.select_improve`) on a task that two labelled
strategies solve, small enough for a CPU: ``multiple`` (prompt ``m{a}<{b}:``, any positive multiple
of ``a`` below ``b`` is correct, ``b >= 2a``). A response's strategy is read off its answer:

* ``direct`` (0): the answer is ``a`` itself -- always correct;
* ``scaled`` (1): another positive multiple ``a k``, ``k >= 2`` -- correct iff ``a k < b``;
* ``other`` (2): anything else (not a positive multiple of ``a``, or not a number) -- never correct.

The SFT warm-up's reference solutions mix the first two (``k`` uniform on ``1..floor((b-1)/a)``, so
``direct`` is a minority), then GRPO trains on the binary reward. Before (``out/initial``, the SFT
model) and after GRPO, ``samples`` responses are sampled at temperature 1 for the same
``eval_prompts`` problems; :func:`~posttrain.theory.select_improve.strategy_table` gives routing
and strategy-conditional success, :func:`~posttrain.theory.select_improve.decompose_rollouts` the
exact split of the accuracy change.

Simplifications against the paper: one problem type instead of evaluation/inversion; strategies
are labelled from the final answer (no reasoning trace, so no detector); the tiny char model
(hidden 128, 2 layers) trained from scratch instead of a LoRA on Qwen2.5-1.5B; a few dozen GRPO
steps. Whatever the numbers, they are a measurement, not a reproduction of the paper's tables.

Run: ``python examples/select_improve_tiny.py --out runs/select_improve`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

import torch

from posttrain.llm.rollout.engine import HFEngine, SamplingConfig
from posttrain.llm.rollout.tasks import Problem, Task, make_task
from posttrain.llm.rollout.text import decode_responses, encode_prompts
from posttrain.theory.select_improve import StrategyTable, decompose_rollouts, strategy_table

STRATEGIES = ("direct", "scaled", "other")


def strategy_label(problem: Problem, completion: str) -> int:
    """0 ``direct`` (the answer is ``a``), 1 ``scaled`` (another positive multiple of ``a``), 2 ``other``.

    Example:
        >>> p = Problem("m3<10:", "3", (3, 10))
        >>> [strategy_label(p, c) for c in ("3", "9", "12", "4", "x")]
        [0, 1, 1, 2, 2]
    """
    a = problem.data[0]
    text = completion.strip()
    if not text.isdigit() or len(text) > 6 or int(text) <= 0 or int(text) % a:
        return 2
    return 0 if int(text) == a else 1


def measure(
    model: Any, tokenizer: Any, task: Task, problems: list[Problem], *, samples: int, seed: int
) -> tuple[StrategyTable, torch.Tensor, torch.Tensor]:
    """Sample ``samples`` responses per problem (temperature 1); return the table, labels ``[B]`` and correctness ``[B]``."""
    engine = HFEngine(
        model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, sampling=SamplingConfig(max_new_tokens=4)
    )
    out = engine.generate(encode_prompts(tokenizer, [p.prompt for p in problems]), n=samples, seed=seed)
    texts = decode_responses(tokenizer, out.response_ids, out.mask)
    rows = [problems[i // samples] for i in range(len(texts))]  # row g*K + k answers problem g
    labels = torch.tensor([strategy_label(p, t) for p, t in zip(rows, texts, strict=True)])
    correct = torch.tensor([task.reward(p, t) == 1.0 for p, t in zip(rows, texts, strict=True)])
    table = strategy_table(torch.zeros_like(labels), labels, correct, n_types=1, n_strategies=len(STRATEGIES))
    return table, labels, correct


def run(
    out_dir: str | Path,
    *,
    steps: int = 40,
    sft_steps: int = 60,
    seed: int = 0,
    eval_prompts: int = 64,
    samples: int = 8,
) -> dict[str, Any]:
    """SFT then GRPO on ``multiple`` with the project's trainer; routing, success and the split before/after."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.llm.config import config_from_dict
    from posttrain.llm.run import build_trainer

    cfg = config_from_dict(
        {
            "seed": seed,
            "model": {"tiny": {"num_hidden_layers": 2}},
            "data": {"task": "multiple", "prompts_per_step": 16, "sft_steps": sft_steps, "sft_lr": 1e-3},
            "rollout": {"group_size": 8, "max_new_tokens": 4},
            "optim": {"steps": steps, "lr": 5e-4},
            "logging": {"progress": False},
        }
    )
    trainer = build_trainer(cfg, out_dir)
    task = make_task("multiple")
    problems = task.sample(random.Random(10_000 + seed), eval_prompts)
    initial = Path(out_dir) / "initial"
    sft_model, tok = AutoModelForCausalLM.from_pretrained(initial), AutoTokenizer.from_pretrained(initial)
    before = measure(sft_model, tok, task, problems, samples=samples, seed=seed)
    trainer.fit()
    after = measure(trainer.policy, tok, task, problems, samples=samples, seed=seed)
    split = decompose_rollouts(before[0], after[0])
    return {
        "strategies": list(STRATEGIES),
        "accuracy_before": float(before[2].double().mean()),
        "accuracy_after": float(after[2].double().mean()),
        "routing_before": before[0].routing[0].tolist(),
        "routing_after": after[0].routing[0].tolist(),
        "success_before": before[0].success[0].tolist(),
        "success_after": after[0].success[0].tolist(),
        "selection": float(split.selection[0]),
        "improvement": float(split.improvement[0]),
        "total": float(split.total[0]),
        "labels_before": before[1].tolist(),
        "correct_before": before[2].tolist(),
        "labels_after": after[1].tolist(),
        "correct_after": after[2].tolist(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/select_improve")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    res = run(args.out, steps=args.steps, seed=args.seed)
    print(json.dumps({k: v for k, v in res.items() if not k.startswith(("labels", "correct"))}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
