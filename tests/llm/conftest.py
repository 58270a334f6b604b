"""Shared fixtures for the llm tests: a tiny model + tokenizer saved once per session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers", reason="the tiny model needs the [llm] extra (transformers)")
    from posttrain.llm.tools.tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture()
def tiny(tiny_dir: Path) -> tuple[Any, Any]:
    """A fresh (model, tokenizer) loaded from disk through the Auto classes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)
