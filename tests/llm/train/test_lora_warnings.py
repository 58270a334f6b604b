"""The LoRA path is quiet: no transformers FutureWarning reaches a user who did nothing deprecated.

Finding covered: every LoRA run printed transformers' "`is_gradient_checkpointing` is deprecated" FutureWarning,
raised by peft 0.21's ``PeftModel.__init__`` reading the old property name (not by our code). It is filtered
at the one call into peft, for that message only: any other warning still shows.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

pytest.importorskip("peft", reason="LoRA needs peft")


def test_wrapping_a_model_with_lora_emits_no_future_warning(tiny: tuple[Any, Any]) -> None:
    from posttrain.llm.policy import LoraConfig, prepare_policy

    model, _ = tiny
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy = prepare_policy(model, lora=LoraConfig(r=4), gradient_checkpointing=False)
    assert hasattr(policy, "peft_config")
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == []


def test_the_filter_is_narrow(tiny: tuple[Any, Any]) -> None:
    from posttrain.llm.policy import LoraConfig, prepare_policy

    model, _ = tiny
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prepare_policy(model, lora=LoraConfig(r=4), gradient_checkpointing=False)
        warnings.warn("another deprecation", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == ["another deprecation"]
    assert not any(f[2] is FutureWarning and f[0] == "ignore" for f in warnings.filters if f[1] is None)
