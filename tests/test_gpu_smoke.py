"""The GPU smoke benchmark runs end to end at its tiny shape (on CPU here; the same code path on CUDA)."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="the smoke benchmark needs the [llm] extra (transformers)")

from benchmarks import gpu_smoke

NEEDS_CXX = pytest.mark.skipif(
    not any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "c++", "clang++")),
    reason="torch.compile on CPU (inductor) needs a C++ compiler; none is on PATH",
)


def test_tiny_run_reports_every_number(tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    res = gpu_smoke.main(["--tiny", "--json", str(out)])
    assert json.loads(out.read_text()) == res
    for key in ("engine_tokens_per_s", "generate_tokens_per_s", "train_step_s", "matmul_ceiling_flops_per_s"):
        assert math.isfinite(res[key]) and res[key] > 0, key
    assert 0 < res["mfu"] < 1
    assert res["train_tokens"] == 2 * (6 + 8)  # no end-of-sequence token: every row runs to the end
    if not torch.cuda.is_available():
        assert res["train_step_host_syncs"] == "n/a on CPU"
    else:
        assert isinstance(res["train_step_host_syncs"], int)


def test_model_has_the_qwen25_05b_shape_without_building_it() -> None:
    from transformers import Qwen2Config

    cfg = Qwen2Config(**gpu_smoke.QWEN25_05B)
    with torch.device("meta"):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(cfg)
    total = sum(p.numel() for p in model.parameters())
    assert 490e6 < total < 500e6  # Qwen2.5-0.5B: 494M parameters, embeddings tied
    assert 355e6 < gpu_smoke.non_embedding_params(model) < 362e6


def test_sync_counter_is_off_on_cpu() -> None:
    n, value = gpu_smoke.count_syncs(lambda: 3, torch.device("cpu"))
    assert (n, value) == ("n/a on CPU", 3)


@NEEDS_CXX
@pytest.mark.slow  # one torch.compile of the tiny model's decode step (~30 s on CPU)
def test_tiny_run_with_the_compiled_decode(tmp_path: Path) -> None:
    res = gpu_smoke.main(["--tiny", "--compile-decode"])
    assert "compiled_error" not in res, res.get("compiled_error")
    assert math.isfinite(res["compiled_engine_tokens_per_s"]) and res["compiled_engine_tokens_per_s"] > 0
    assert res["compile_s"] > 0
    assert res["compiled_over_eager"] == pytest.approx(res["compiled_engine_tokens_per_s"] / res["engine_tokens_per_s"])
