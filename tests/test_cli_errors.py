"""The command line's edges: --version, ``python -m posttrain``, one-line errors with exit code 2, --debug."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import posttrain
from posttrain.cli import app

runner = CliRunner()


def test_version_flag_and_python_dash_m() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"posttrain {posttrain.__version__}"
    proc = subprocess.run(
        [sys.executable, "-m", "posttrain", "--version"], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"posttrain {posttrain.__version__}"


def _one_line_error(args: list[str], *needles: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, result.output  # no traceback
    assert lines[0].startswith("error:"), lines
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_flops_bad_key_is_one_line_naming_it(tmp_path: Path) -> None:
    cfg = tmp_path / "typo.yaml"
    cfg.write_text("optim:\n  lrr: 1\n")
    _one_line_error(["flops", str(cfg)], "optim", "lrr")


def test_flops_yaml_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("optim:\n  lr: 1\n  steps: [\n")
    _one_line_error(["flops", str(cfg)], f"{cfg}:4:1: YAML syntax error")  # file:line:column


def test_sar_and_merge_missing_weights_are_one_line(tmp_path: Path) -> None:
    _one_line_error(["sar", str(tmp_path), str(tmp_path), str(tmp_path / "out")], "safetensors")
    _one_line_error(["merge", str(tmp_path), str(tmp_path / "out"), str(tmp_path)], "safetensors")


def test_debug_flag_shows_the_traceback(tmp_path: Path) -> None:
    cfg = tmp_path / "typo.yaml"
    cfg.write_text("optim:\n  lrr: 1\n")
    result = runner.invoke(app, ["--debug", "flops", str(cfg)])
    assert result.exit_code != 0 and result.exception is not None
    assert "lrr" in str(result.exception)  # re-raised, not swallowed into one line


def test_check_id_without_leading_zero_means_the_padded_id() -> None:
    from posttrain.paper_checks.runner import select_checks

    assert [c.id for c in select_checks(["2"])] == [c.id for c in select_checks(["02"])] == ["02"]


def test_pass_at_k_keeps_torch_input_as_torch() -> None:
    from posttrain.estimators import mean_at_k, pass_at_k

    c = torch.tensor([0, 1, 4])
    out = pass_at_k(4, c, 2)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    assert out.tolist() == pytest.approx([0.0, 0.5, 1.0])
    assert isinstance(mean_at_k(4, c, 2), torch.Tensor)
    assert not isinstance(pass_at_k(4, 1, 2), torch.Tensor)  # numpy in, numpy out
