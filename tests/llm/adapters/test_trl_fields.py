"""Every GRPOConfig field is classified, and each setting the TRL adapter does not reproduce is refused by name.

The refusal tests without TRL read the fields from a namespace of TRL 1.16's defaults; the classification and
the refusals at construction need TRL.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from posttrain.errors import DomainError
from posttrain.llm.adapters.trl_fields import GRPO_FIELDS, TRAINING_ARGUMENTS, Handling, refused_settings

DEFAULTS: dict[str, Any] = {  # TRL 1.16's defaults of the fields refused_settings reads
    "loss_type": "dapo",
    "scale_rewards": "group",
    "epsilon": 0.2,
    "epsilon_high": None,
    "delta": None,
    "importance_sampling_level": "token",
    "top_entropy_quantile": 1.0,
    "off_policy_mask_threshold": None,
    "entropy_coef": 0.0,
    "use_adaptive_entropy": False,
    "multi_objective_aggregation": "sum_then_normalize",
}

REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "top_entropy_quantile": ({"top_entropy_quantile": 0.2}, "top_entropy_quantile"),
    "off_policy_mask_threshold": ({"off_policy_mask_threshold": 0.5}, "off_policy_mask_threshold"),
    "entropy_coef": ({"entropy_coef": 0.01}, "entropy_coef"),
    "use_adaptive_entropy": ({"use_adaptive_entropy": True}, "use_adaptive_entropy"),
    "multi_objective_aggregation": ({"multi_objective_aggregation": "normalize_then_sum"}, "multi_objective_aggregation"),
    "sapo": ({"loss_type": "sapo"}, "loss_type"),
    "vespo": ({"loss_type": "vespo"}, "loss_type"),
    "delta <= 1 + epsilon_high": ({"delta": 1.1}, "delta"),
    "delta with sequence ratios": ({"delta": 2.0, "importance_sampling_level": "sequence"}, "delta"),
    "cispo with sequence ratios": ({"loss_type": "cispo", "epsilon_high": 5.0, "importance_sampling_level": "sequence"}, "importance_sampling_level"),
    "cispo cap below 1": ({"loss_type": "cispo"}, "epsilon_high"),
    "epsilon >= 1": ({"epsilon": 1.5}, "epsilon"),
    "scale_rewards unknown": ({"scale_rewards": "max"}, "scale_rewards"),
    "advantage beside scale_rewards": ({"advantage": "rloo", "scale_rewards": "none"}, "scale_rewards"),
    "policy_loss beside epsilon": ({"policy_loss": "ppo_clip", "epsilon": 0.3}, "epsilon"),
    "policy_loss beside delta": ({"policy_loss": "ppo_clip", "delta": 3.0}, "delta"),
    "policy_loss beside sequence ratios": ({"policy_loss": "ppo_clip", "importance_sampling_level": "sequence"}, "importance_sampling_level"),
    "policy_loss beside cispo": ({"policy_loss": "ppo_clip", "loss_type": "cispo"}, "loss_type"),
    "aggregation beside loss_type": ({"aggregation": "token-mean", "loss_type": "grpo"}, "loss_type"),
}  # fmt: skip
"""A setting the adapter refuses -> (the fields set, the field its message must name)."""


def test_defaults_pass() -> None:
    assert refused_settings(SimpleNamespace(**DEFAULTS)) == []


@pytest.mark.parametrize("name", list(REFUSED))
def test_each_refusal_is_one_line_naming_its_field(name: str) -> None:
    fields, field = REFUSED[name]
    lines = refused_settings(SimpleNamespace(**(DEFAULTS | fields)))
    assert [line.split("=")[0] for line in lines] == [field]
    assert "\n" not in lines[0]


def test_every_refused_field_has_a_refusal_test() -> None:
    refused = {name for name, (how, _) in GRPO_FIELDS.items() if how is Handling.REFUSED}
    tested = {field for _, field in REFUSED.values()} | {"router_aux_loss_coef"}  # the MoE test below
    assert refused <= tested


@pytest.mark.parametrize("renamed", list(DEFAULTS))
def test_a_trl_that_renamed_a_read_field_is_refused(renamed: str) -> None:
    """Not a silent pass: a missing field means an unknown TRL."""
    with pytest.raises(DomainError, match=renamed):
        refused_settings(SimpleNamespace(**{k: v for k, v in DEFAULTS.items() if k != renamed}))


# with TRL


def _trl() -> Any:
    return pytest.importorskip("trl", reason="TRL is not installed (the [trl] extra; make test-adapters installs it)")


def test_every_grpo_config_field_is_classified() -> None:
    """A field a new TRL release adds (or removes) fails here until it is classified in GRPO_FIELDS."""
    trl = _trl()
    from transformers import TrainingArguments

    inherited = {f.name for f in dataclasses.fields(TrainingArguments)}
    own = {f.name for f in dataclasses.fields(trl.GRPOConfig)} - inherited
    assert sorted(own - set(GRPO_FIELDS)) == [], "unclassified GRPOConfig fields"
    assert sorted(set(GRPO_FIELDS) - own) == [], "classified fields GRPOConfig no longer has"
    assert all(reason for _, reason in GRPO_FIELDS.values()) and TRAINING_ARGUMENTS
    assert {f.name: f.default for f in dataclasses.fields(trl.GRPOConfig) if f.name in DEFAULTS} == DEFAULTS


@pytest.mark.parametrize("name", list(REFUSED))
def test_the_config_refuses_at_construction(name: str, tmp_path: Path) -> None:
    _trl()
    from posttrain.llm.adapters.trl import grpo_config_class

    fields, field = REFUSED[name]
    with pytest.raises(DomainError, match=rf"(?m)^{field}="):
        grpo_config_class()(output_dir=str(tmp_path), use_cpu=True, report_to=[], bf16=False, **fields)


def test_a_moe_router_aux_loss_is_refused_by_the_trainer(tmp_path: Path) -> None:
    """TRL enables the aux loss for a model with router logits and a non-zero coefficient (the model's own here)."""
    _trl()
    datasets = pytest.importorskip("datasets", reason="TRL's datasets dependency is missing")
    from transformers import MixtralConfig, MixtralForCausalLM

    from posttrain.llm.adapters.trl import grpo_config_class, grpo_trainer_class
    from posttrain.llm.tools.tiny import char_tokenizer

    tok = char_tokenizer()
    config = MixtralConfig(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_local_experts=2, num_experts_per_tok=1, pad_token_id=0, bos_token_id=2,
        eos_token_id=3,
    )  # fmt: skip
    assert config.router_aux_loss_coef > 0

    def build(**overrides: Any) -> Any:
        args = grpo_config_class()(
            output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4, num_generations=4, report_to=[],
            bf16=False, **overrides,
        )  # fmt: skip
        return grpo_trainer_class()(
            model=MixtralForCausalLM(config),
            reward_funcs=lambda prompts, completions, **_: [0.0] * len(prompts),
            args=args,
            train_dataset=datasets.Dataset.from_list([{"prompt": "ab"}] * 4),
            processing_class=tok,
        )

    with pytest.raises(DomainError, match=r"^router_aux_loss_coef="):
        build()
    assert not build(router_aux_loss_coef=0.0).aux_loss_enabled
