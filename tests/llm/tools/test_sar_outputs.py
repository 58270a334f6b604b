"""``posttrain sar`` / ``merge`` write one new directory, atomically, and never touch their inputs.

Findings covered: ``--alpha nan`` exiting 0 with NaN weights; non-finite input weights passed through; an
existing output overwritten without ``--overwrite``, with stale weight shards left beside the new file;
config files copied through a symbolic link in the output (the base's ``tokenizer_config.json`` rewritten).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from posttrain.errors import DomainError

pytest.importorskip("safetensors", reason="needs safetensors")
from safetensors.torch import save_file

from posttrain.llm.tools.sar import edit_checkpoint, load_weights

runner = CliRunner()


def _weights(directory: Path, seed: int, *, poison: float | None = None) -> None:
    g = torch.Generator().manual_seed(seed)
    directory.mkdir(parents=True)
    tensors = {f"model.layers.0.self_attn.{p}_proj.weight": torch.randn(24, 16, generator=g) for p in "qkvo"}
    tensors["model.embed_tokens.weight"] = torch.randn(10, 16, generator=g)
    if poison is not None:
        tensors["model.layers.0.self_attn.q_proj.weight"][3, 4] = poison
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text('{"model_type": "llama"}')
    (directory / "tokenizer_config.json").write_text('{"tuned": true}')


@pytest.fixture()
def pair(tmp_path: Path) -> tuple[Path, Path]:
    base, tuned = tmp_path / "base", tmp_path / "tuned"
    _weights(base, 0)
    _weights(tuned, 1)
    (base / "tokenizer_config.json").write_text('{"base": true}')
    return base, tuned


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("alpha", [math.nan, math.inf, -math.inf])
def test_non_finite_alpha_is_refused(tmp_path: Path, pair: tuple[Path, Path], alpha: float) -> None:
    with pytest.raises(DomainError, match=r"alphas\[0\]: expected a finite number"):
        edit_checkpoint(pair[0], [pair[1]], tmp_path / "out", alphas=[alpha], delta_fraction=0.25)
    assert not (tmp_path / "out").exists()
    result = runner.invoke(_app(), ["sar", str(pair[0]), str(pair[1]), str(tmp_path / "out"), "--alpha", "nan"])
    assert result.exit_code == 2 and "alpha" in result.output, result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("which", ["base", "tuned"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_weights_are_refused(tmp_path: Path, which: str, value: float) -> None:
    _weights(tmp_path / "base", 0, poison=value if which == "base" else None)
    _weights(tmp_path / "tuned", 1, poison=value if which == "tuned" else None)
    with pytest.raises(DomainError, match=rf"{which}.*q_proj.weight has non-finite values"):
        edit_checkpoint(tmp_path / "base", [tmp_path / "tuned"], tmp_path / "out", delta_fraction=0.25)
    assert not (tmp_path / "out").exists()


def test_an_existing_output_needs_overwrite_and_is_replaced_whole(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "model-00001-of-00002.safetensors").write_bytes(b"stale shard")
    (out / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(DomainError, match=r"out_dir: .* is not empty; pass --overwrite"):
        edit_checkpoint(pair[0], [pair[1]], out, delta_fraction=0.25)
    assert sorted(p.name for p in out.iterdir()) == ["model-00001-of-00002.safetensors", "model.safetensors.index.json"]
    edit_checkpoint(pair[0], [pair[1]], out, delta_fraction=0.25, overwrite=True)
    names = sorted(p.name for p in out.iterdir())
    assert "model-00001-of-00002.safetensors" not in names and "model.safetensors.index.json" not in names
    assert set(load_weights(out)) == set(load_weights(pair[0]))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary directory left
    (tmp_path / "empty").mkdir()
    edit_checkpoint(pair[0], [pair[1]], tmp_path / "empty", delta_fraction=0.25)  # an empty directory is fine


def test_links_in_the_output_are_never_written_through(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    base, tuned = pair
    before = {d.name: _snapshot(d) for d in (base, tuned)}
    out = tmp_path / "out"
    out.mkdir()
    for name in ("tokenizer_config.json", "config.json", "model.safetensors"):
        (out / name).symlink_to(base / name)  # e.g. an output made by linking the base's files
    edit_checkpoint(base, [tuned], out, delta_fraction=0.25, overwrite=True)
    assert {d.name: _snapshot(d) for d in (base, tuned)} == before
    assert not any(p.is_symlink() for p in out.iterdir())
    assert (out / "tokenizer_config.json").read_text() == '{"tuned": true}'


def test_an_output_holding_an_input_is_refused(tmp_path: Path) -> None:
    _weights(tmp_path / "models" / "base", 0)
    _weights(tmp_path / "models" / "tuned", 1)
    with pytest.raises(DomainError, match=r"out_dir: .* holds base_dir"):
        edit_checkpoint(
            tmp_path / "models" / "base", [tmp_path / "models" / "tuned"], tmp_path / "models", overwrite=True
        )
    assert (tmp_path / "models" / "base" / "model.safetensors").is_file()


def test_merge_command_refuses_an_existing_output_and_nan_inputs(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    base, tuned = pair
    _weights(tmp_path / "other", 2)
    out = tmp_path / "merged"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"someone else's")
    args = ["merge", str(base), str(out), str(tuned), str(tmp_path / "other"), "--method", "average"]
    refused = runner.invoke(_app(), args)
    assert refused.exit_code == 2 and "--overwrite" in refused.output, refused.output
    assert (out / "model.safetensors").read_bytes() == b"someone else's"
    done = runner.invoke(_app(), [*args, "--overwrite"])
    assert done.exit_code == 0, done.output
    assert all(torch.isfinite(w).all() for w in load_weights(out).values())


def _app():  # type: ignore[no-untyped-def]
    from posttrain.cli import app

    return app
