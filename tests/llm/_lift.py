"""The small run configuration shared by the issue-6 LLM lift tests (1-layer tiny model, 1-digit addition)."""

from __future__ import annotations

from typing import Any

from posttrain.llm.config import config_from_dict


def small_config(*, algorithm: dict[str, Any] | None = None, **optim: Any) -> Any:
    """4 prompts x 4 samples, 3 new tokens, 2 SFT steps; ``optim`` entries override ``steps=2, lr=1e-3``."""
    return config_from_dict({
        "model": {"tiny": {"num_hidden_layers": 1}},
        "data": {"task": "addition", "options": {"digits": 1}, "prompts_per_step": 4, "sft_steps": 2,
                 "sft_batch_size": 8, "eval_prompts": 4},
        "rollout": {"group_size": 4, "max_new_tokens": 3},
        "algorithm": algorithm or {"method": "grpo"},
        "optim": {"steps": 2, "lr": 1e-3, **optim},
        "checkpoint": {"every": 0}, "logging": {"progress": False},
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
