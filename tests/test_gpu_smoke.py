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
    keys = ("engine_tokens_per_s", "generate_tokens_per_s", "train_step_s", "train_step_unshared_s")
    for key in (*keys, "matmul_ceiling_flops_per_s", "shared_over_unshared"):
        assert math.isfinite(res[key]) and res[key] > 0, key
    assert 0 < res["mfu"] < 1
    # one group of K = 2 rows, no end-of-sequence token (every row runs to the end): the prompt once (6 tokens),
    # and each row's 8 response tokens but the last
    assert res["train_rows"] == 2 and res["train_tokens"] == 6 + 2 * (8 - 1)
    for key in ("train_step_host_syncs", "train_peak_bytes", "engine_peak_bytes"):
        if not torch.cuda.is_available():
            assert res[key] == "n/a on CPU"
        else:
            assert isinstance(res[key], int) and res[key] >= 0


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
