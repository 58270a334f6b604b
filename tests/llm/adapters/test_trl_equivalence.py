"""The adapted trainer equals TRL 1.16's GRPOTrainer: advantages, loss and gradient on random float64 batches.

Both trainers run TRL's own code (`_trl_harness`: only generation and the model's log-probs are fixed tensors),
the adapter with its estimators. Every batch has completions of several lengths and truncated ones; with
``mask_truncated_completions`` (the default here) TRL masks those rows entirely.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

trl = pytest.importorskip("trl", reason="TRL is not installed (the [trl] extra; make test-adapters installs it)")
pytest.importorskip("datasets", reason="TRL's datasets dependency is missing")

from posttrain.llm.adapters.trl import grpo_config_class, grpo_trainer_class  # noqa: E402
from posttrain.llm.adapters.trl_fields import GRPO_FIELDS, Handling  # noqa: E402
from tests.llm.adapters._trl_harness import build, loss_and_grad, random_batch, score  # noqa: E402

BASE: dict[str, Any] = {"beta": 0.04, "mask_truncated_completions": True, "loss_type": "grpo", "num_iterations": 2}
"""Unless a case says otherwise: a KL term (bias-corrected, TRL's default), truncated completions masked, and two
updates per generation, so TRL computes the behaviour log-probs and the ratios leave the clip range."""

CASES: dict[str, dict[str, Any]] = {
    **{f"loss_type={lt}": {"loss_type": lt} for lt in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")},
    "loss_type=cispo": {"loss_type": "cispo", "epsilon_high": 1.15},
    **{
        f"sequence-{lt}": {"loss_type": lt, "importance_sampling_level": "sequence"}
        for lt in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
    },
    "clip-higher": {"loss_type": "dapo", "epsilon": 0.1, "epsilon_high": 0.28},
    "delta": {"loss_type": "grpo", "epsilon_high": 0.28, "delta": 1.5},
    "delta-dapo": {"loss_type": "dapo", "delta": 1.3},
    "scale_rewards=none": {"scale_rewards": "none"},
    "scale_rewards=batch": {"scale_rewards": "batch"},
    "scale_rewards=group": {"scale_rewards": "group", "loss_type": "bnpo"},
    "no-bias-correction": {"use_bias_correction_kl": False},
    "no-bias-correction-sequence": {"use_bias_correction_kl": False, "importance_sampling_level": "sequence"},
    "beta=0": {"beta": 0.0, "loss_type": "dapo"},
    "unmasked-truncation": {"mask_truncated_completions": False, "loss_type": "dr_grpo"},
    "dr_grpo-horizon": {"loss_type": "dr_grpo", "max_completion_length": 9},
    "num_generations=2": {"num_generations": 2},
    "reward_weights": {"reward_weights": [1.0, 0.5], "loss_type": "dapo"},
    "on-policy": {"num_iterations": 1},
    "on-policy-dr_grpo": {"num_iterations": 1, "loss_type": "dr_grpo"},
    "steps_per_generation=2": {"num_iterations": 1, "steps_per_generation": 2, "loss_type": "dapo"},
    "generation_batch_size": {"num_iterations": 1, "generation_batch_size": 16, "loss_type": "dapo"},
    **{
        f"vllm-{mode}": {
            "vllm_importance_sampling_mode": mode,
            "vllm_importance_sampling_clip_min": 0.9 if mode.endswith("mask") else None,
            "vllm_importance_sampling_clip_max": 1.1,
            "loss_type": "dapo" if mode.startswith("token") else "grpo",
        }
        for mode in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
    },
    "vllm-cispo": {"loss_type": "cispo", "epsilon_high": 1.2, "vllm_importance_sampling_mode": "token_truncate"},
    "vllm-cap": {"vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_cap": 1.05},
    "vllm-correction-off": {"vllm_importance_sampling_correction": False},
    "eval": {"num_generations_eval": 2, "loss_type": "dapo"},
    "eval-grpo": {"num_generations_eval": 8},
}
"""Config overrides of each case; ``vllm-*`` cases run TRL's vLLM branch (``use_vllm`` on after construction),
``eval*`` cases the evaluation mode (no accumulation, ``num_generations_eval``)."""

VLLM_ONLY = {"use_vllm"}
"""Fields a case changes without setting them in the config (vLLM cannot start on CPU)."""


def _flags(name: str, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "vllm": name.startswith("vllm"),
        "train": not name.startswith("eval"),
        "funcs": len(config.get("reward_weights", [1.0])),
        "spread": 0.6 if "delta" in config else 0.3,  # ratios beyond delta occur
    }


def _delta_binds(out: dict[str, Any], batch: Any, delta: float) -> bool:
    """Some valid token with a negative advantage has a ratio above ``delta`` (the two-sided clip acts)."""
    mask = out["completion_mask"].bool()
    ratio = torch.exp(batch.logp - out["old_per_token_logps"])
    return bool(((ratio > delta) & (out["advantages"].unsqueeze(-1) < 0) & mask).any())


def test_the_cases_vary_every_field_the_adapter_reproduces_or_reads() -> None:
    """A field classed as reproduced (or produced by TRL's code for the loss) is exercised by some case."""
    varied = {key for config in CASES.values() for key in config} | set(BASE) | VLLM_ONLY
    needed = {name for name, (how, _) in GRPO_FIELDS.items() if how in (Handling.ESTIMATOR, Handling.TRL)}
    assert needed - varied == set()


_DEPRECATED_CAP = pytest.mark.filterwarnings("ignore:The `vllm_importance_sampling_cap` argument:FutureWarning")


@pytest.mark.parametrize("name", [pytest.param(n, marks=_DEPRECATED_CAP) if n == "vllm-cap" else n for n in CASES])
def test_adapter_equals_trl_in_advantages_loss_and_gradient(name: str, tiny_dir: Path, tmp_path: Path) -> None:
    config = BASE | CASES[name]
    flags = _flags(name, config)
    batch = random_batch(list(CASES).index(name), funcs=flags["funcs"], vllm=flags["vllm"], spread=flags["spread"])
    theirs = build(trl.GRPOTrainer, trl.GRPOConfig, tiny_dir, tmp_path, batch, **config)
    ours = build(grpo_trainer_class(), grpo_config_class(), tiny_dir, tmp_path, batch, **config)
    out_t = score(theirs, train=flags["train"], vllm=flags["vllm"])
    out_o = score(ours, train=flags["train"], vllm=flags["vllm"])
    assert set(out_o) == set(out_t)
    for key in set(out_t) - {"advantages"}:  # TRL's own code made both: identical
        assert out_o[key] is None or torch.equal(torch.as_tensor(out_o[key]), torch.as_tensor(out_t[key])), key
    torch.testing.assert_close(out_o["advantages"], out_t["advantages"], rtol=1e-9, atol=1e-10)
    assert bool((out_t["advantages"] != 0).any())
    if config["mask_truncated_completions"]:
        assert bool((out_t["completion_mask"].sum(-1) == 0).any())  # fully masked rows are in the batch
    if config.get("delta") is not None:
        assert _delta_binds(out_t, batch, config["delta"])
    v_t, g_t = loss_and_grad(theirs, out_t)
    v_o, g_o = loss_and_grad(ours, out_o)
    torch.testing.assert_close(v_o, v_t, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(g_o, g_t, rtol=1e-9, atol=1e-12)
    assert bool((g_t != 0).any())
    if config["num_iterations"] > 1:  # off-policy: the loss saw ratios other than 1
        assert not torch.allclose(out_t["old_per_token_logps"], batch.logp)
