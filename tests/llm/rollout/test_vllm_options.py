"""VLLMEngine's ``enforce_eager``: the config value reaches ``vllm.LLM``; the default follows the device."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from posttrain.llm.config import config_from_dict
from posttrain.llm.rollout import vllm as vllm_engine


@pytest.fixture()
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """A stand-in ``vllm`` module whose ``LLM`` records its keyword arguments (vLLM need not be installed)."""
    calls: list[dict[str, Any]] = []
    fake = types.ModuleType("vllm")

    class LLM:
        def __init__(self, **kwargs: Any) -> None:
            calls.append(kwargs)

    fake.LLM = LLM  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", fake)
    return calls


@pytest.mark.parametrize("cuda", [False, True])
def test_default_enforce_eager_is_off_on_cuda(
    recorded: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, cuda: bool
) -> None:
    monkeypatch.setattr(vllm_engine.torch.cuda, "is_available", lambda: cuda)
    vllm_engine.VLLMEngine("model-dir", eos_id=1, pad_id=0)
    assert recorded[-1]["enforce_eager"] is (not cuda)


@pytest.mark.parametrize("value", [True, False])
def test_explicit_enforce_eager_is_passed_through(recorded: list[dict[str, Any]], value: bool) -> None:
    vllm_engine.VLLMEngine("model-dir", eos_id=1, pad_id=0, enforce_eager=value)
    assert recorded[-1]["enforce_eager"] is value


def test_config_field_parses() -> None:
    assert config_from_dict({"rollout": {"enforce_eager": False}}).rollout.enforce_eager is False
    assert config_from_dict({}).rollout.enforce_eager is None
