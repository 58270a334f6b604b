"""Spec 19's LLM-side measurement on the tiny causal LM (examples/select_improve_tiny.py): labelled rollouts, exact split."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("transformers", reason="the tiny model needs the [llm] extra (transformers)")


def _example() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "examples" / "select_improve_tiny.py"
    spec = importlib.util.spec_from_file_location("select_improve_tiny", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_select_improve_split_of_a_grpo_run(tmp_path: Path) -> None:
    """Labels agree with the verifier, sum_s pi_s R_s is the sampled accuracy, and the split is exact."""
    res = _example().run(tmp_path, steps=12, sft_steps=40, eval_prompts=24, samples=8)
    for side in ("before", "after"):
        labels, correct = res[f"labels_{side}"], res[f"correct_{side}"]
        assert all(c for s, c in zip(labels, correct, strict=True) if s == 0)  # direct: a itself, always correct
        assert not any(c for s, c in zip(labels, correct, strict=True) if s == 2)  # other: never correct
        mixture = sum(p * r for p, r in zip(res[f"routing_{side}"], res[f"success_{side}"], strict=True))
        assert mixture == pytest.approx(res[f"accuracy_{side}"], abs=1e-12)
    assert res["selection"] + res["improvement"] == pytest.approx(res["total"], abs=1e-12)
    assert res["total"] == pytest.approx(res["accuracy_after"] - res["accuracy_before"], abs=1e-12)
