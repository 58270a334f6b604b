"""The SAR checkpoint editor on saved tiny models: targets edited, the rest bit-identical to the base."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators.merging import sar_project

transformers = pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")
pytest.importorskip("safetensors", reason="needs safetensors")

from posttrain.llm.tools.tiny import ONE_LAYER, tiny_model  # noqa: E402


def _save(path: Path, seed: int, base: torch.nn.Module | None = None, scale: float = 0.05) -> torch.nn.Module:
    model = tiny_model(ONE_LAYER, 40)
    if base is not None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(scale * torch.randn(p.shape, generator=g))
    model.save_pretrained(path)
    return model


def test_sar_edit_changes_only_targets(tmp_path: Path) -> None:
    from posttrain.llm.tools.sar import edit_checkpoint, load_weights

    base = _save(tmp_path / "base", 0)
    _save(tmp_path / "rl", 1, base=base)
    report = edit_checkpoint(
        tmp_path / "base", [tmp_path / "rl"], tmp_path / "out", delta_fraction=0.25, randomized=False
    )
    b, r, o = (load_weights(tmp_path / d) for d in ("base", "rl", "out"))
    assert set(o) == set(b)
    assert report.targets == 7
    for name, w in o.items():
        if name.endswith("_proj.weight"):
            m, n = w.shape
            expected = b[name] + sar_project(b[name], r[name] - b[name], k=max(1, int(0.25 * min(m, n))))
            torch.testing.assert_close(w, expected, atol=1e-6, rtol=1e-6)
            assert not torch.equal(w, b[name])
        else:
            assert torch.equal(w, b[name]), name  # non-targets come from the base, bit for bit
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert reloaded.model.embed_tokens.weight.data_ptr() == reloaded.lm_head.weight.data_ptr()  # still tied


def test_bf16_saving_reports_erased_edits(tmp_path: Path) -> None:
    from posttrain.llm.tools.sar import edit_checkpoint

    base = _save(tmp_path / "base", 0)
    _save(tmp_path / "rl", 1, base=base, scale=1e-5)  # tiny RL deltas, as in real runs
    fp32 = edit_checkpoint(tmp_path / "base", [tmp_path / "rl"], tmp_path / "o32", save_dtype="float32")
    bf16 = edit_checkpoint(tmp_path / "base", [tmp_path / "rl"], tmp_path / "o16", save_dtype="bfloat16")
    # float32 keeps ~7 digits: only entries whose edit is below its ulp round away.
    assert fp32.erased_fraction < 0.01 and fp32.delta_rel_error < 0.01
    assert bf16.erased_fraction > 0.5 and bf16.delta_rel_error > 0.5


def test_merge_and_errors(tmp_path: Path) -> None:
    from posttrain.llm.tools.sar import edit_checkpoint

    base = _save(tmp_path / "base", 0)
    _save(tmp_path / "a", 1, base=base)
    _save(tmp_path / "b", 2, base=base)
    rep = edit_checkpoint(tmp_path / "base", [tmp_path / "a", tmp_path / "b"], tmp_path / "m", method="task_arithmetic")
    assert rep.targets == 7
    with pytest.raises(DomainError, match="method"):
        edit_checkpoint(tmp_path / "base", [tmp_path / "a"], tmp_path / "x", method="bogus")
    with pytest.raises(ShapeError, match="tuned_dirs"):
        edit_checkpoint(tmp_path / "base", [], tmp_path / "x")


def test_cli_sar_command(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from posttrain.cli import app

    base = _save(tmp_path / "base", 0)
    _save(tmp_path / "rl", 1, base=base)
    res = CliRunner().invoke(
        app, ["sar", str(tmp_path / "base"), str(tmp_path / "rl"), str(tmp_path / "out"), "--rank", "0.1", "--exact"]
    )
    assert res.exit_code == 0, res.output
    assert (tmp_path / "out" / "model.safetensors").exists() and (tmp_path / "out" / "config.json").exists()
