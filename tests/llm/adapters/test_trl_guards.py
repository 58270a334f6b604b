"""The TRL adapter's guard on settings it does not reproduce: public GRPOConfig fields, no TRL needed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from posttrain.errors import DomainError
from posttrain.llm.adapters.trl import GUARDED_ARGS, unsupported_settings

DEFAULTS: dict[str, Any] = {  # TRL 1.16's defaults of the guarded fields
    "top_entropy_quantile": 1.0,
    "off_policy_mask_threshold": None,
    "entropy_coef": 0.0,
    "use_adaptive_entropy": False,
    "multi_objective_aggregation": "sum_then_normalize",
    "router_aux_loss_coef": None,
}


def test_defaults_pass_and_every_field_is_guarded() -> None:
    assert set(DEFAULTS) == set(GUARDED_ARGS)
    assert unsupported_settings(SimpleNamespace(**DEFAULTS)) == []


@pytest.mark.parametrize(
    ("field", "value", "what"),
    [
        ("top_entropy_quantile", 0.2, "top_entropy_quantile"),
        ("off_policy_mask_threshold", 0.5, "off_policy_mask_threshold"),
        ("entropy_coef", 0.01, "entropy bonus"),
        ("use_adaptive_entropy", True, "entropy bonus"),
        ("multi_objective_aggregation", "normalize_then_sum", "normalize_then_sum"),
    ],
)
def test_each_unsupported_setting_is_named(field: str, value: Any, what: str) -> None:
    (found,) = unsupported_settings(SimpleNamespace(**(DEFAULTS | {field: value})))
    assert what in found


def test_router_aux_loss_is_read_from_args_then_the_model_config() -> None:
    moe = SimpleNamespace(output_router_logits=False, router_aux_loss_coef=0.001)
    dense = SimpleNamespace(router_aux_loss_coef=0.001)  # no router logits: not a MoE model
    assert unsupported_settings(SimpleNamespace(**DEFAULTS), moe) == ["a router aux loss (router_aux_loss_coef)"]
    assert unsupported_settings(SimpleNamespace(**(DEFAULTS | {"router_aux_loss_coef": 0.0})), moe) == []
    assert unsupported_settings(SimpleNamespace(**DEFAULTS), dense) == []


@pytest.mark.parametrize("renamed", GUARDED_ARGS)
def test_a_trl_that_renamed_a_guarded_field_is_refused(renamed: str) -> None:
    """Not a silent pass: a missing field means an unknown TRL."""
    args = SimpleNamespace(**{k: v for k, v in DEFAULTS.items() if k != renamed})
    with pytest.raises(DomainError, match=renamed):
        unsupported_settings(args)
