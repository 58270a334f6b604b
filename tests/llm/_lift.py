"""The small run configuration shared by the issue-6 LLM lift tests (1-layer tiny model, 1-digit addition)."""

from __future__ import annotations

from typing import Any

from posttrain.llm.config import config_from_dict


def small_config(
    *,
    algorithm: dict[str, Any] | None = None,
    rollout: dict[str, Any] | None = None,
    checkpoint: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    **optim: Any,
) -> Any:
    """4 prompts x 4 samples, 3 new tokens, 2 SFT steps; ``rollout`` and ``model`` entries (e.g. ``replay``,
    ``teacher``) are added; ``checkpoint`` replaces ``every=0`` (no checkpoints); ``optim`` entries override
    ``steps=2, lr=1e-3``."""
    return config_from_dict({
        "model": {"tiny": {"num_hidden_layers": 1}, **(model or {})},
        "data": {"task": "addition", "options": {"digits": 1}, "prompts_per_step": 4, "sft_steps": 2,
                 "sft_batch_size": 8, "eval_prompts": 4},
        "rollout": {"group_size": 4, "max_new_tokens": 3, **(rollout or {})},
        "algorithm": algorithm or {"method": "grpo"},
        "optim": {"steps": 2, "lr": 1e-3, **optim},
        "checkpoint": checkpoint or {"every": 0}, "logging": {"progress": False},
    })  # fmt: skip


def record_rollouts(trainer: Any) -> list[Any]:
    """Wrap ``trainer.rollout`` so that every prepared batch is appended to the returned list."""
    batches: list[Any] = []
    rollout = trainer.rollout

    def recording() -> Any:
        batch, texts = rollout()
        batches.append(batch)
        return batch, texts

    trainer.rollout = recording
    return batches


def fit_example(out: Any, *overrides: str) -> tuple[Any, list[dict[str, Any]], float, float]:
    """30 steps of ``examples/tiny_cpu.yaml`` (seed 0, SFT warm-up) with ``--set`` overrides:
    ``(trainer, history, held-out reward before, after)``."""
    from pathlib import Path

    from posttrain.llm.config import load_config
    from posttrain.llm.run import build_trainer

    example = Path(__file__).resolve().parents[2] / "examples" / "tiny_cpu.yaml"
    sets = ["seed=0", "optim.steps=30", "checkpoint.every=0", "logging.progress=false", *overrides]
    trainer = build_trainer(load_config(example, sets), out)
    before = trainer.evaluate()["reward_mean"]
    history = trainer.fit()
    return trainer, history, before, trainer.evaluate()["reward_mean"]


def count_fills(trainer: Any, need: str) -> list[int]:
    """Wrap ``trainer.fillers[need]`` so that the step (counted from 1) of every call is appended to the returned list."""
    steps: list[int] = []
    fill = trainer.fillers[need]

    def counting(batch: Any) -> Any:
        steps.append(trainer.step + 1)
        return fill(batch)

    trainer.fillers[need] = counting
    return steps


def sis_test_by_hand(trainer: Any, rollout: Any, behaviour: list[Any], update: int) -> tuple[Any, Any]:
    """The SIS rejection test of update ``update`` (from 0) of the current step, redone from the estimator
    functions with the exact envelope (K = V): ``(logp of the sampled tokens [B, T], accepted [B, T])``.

    ``behaviour`` (a list the caller keeps per rollout batch) caches the first update's top-K ids and log-probs.
    """
    import torch

    from posttrain.estimators import sis_accept, sis_acceptance_prob
    from posttrain.llm.methods.algorithm import update_seed
    from posttrain.llm.methods.sis import response_log_probs

    full = response_log_probs(trainer.model, rollout, 1.0)  # [B, T, V], the current policy
    logp = full.gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)
    if not behaviour:  # first update: the policy is still the behaviour policy
        top = full.topk(full.shape[-1], dim=-1)
        behaviour.append((top.indices, top.values))
    idx, old = behaviour[0]
    a = sis_acceptance_prob(logp, rollout.logp_old, full.gather(-1, idx), old)  # the released test
    seed = update_seed(trainer.cfg.seed, trainer.step, update, trainer.rank)
    u = torch.rand(a.shape, generator=torch.Generator().manual_seed(seed), dtype=a.dtype)
    return logp, sis_accept(a, u) & rollout.mask
