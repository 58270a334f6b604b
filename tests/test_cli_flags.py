"""Help and tables read well at 80 columns: flags shown as flags, table cells not broken mid-word.

Findings covered: ``posttrain --help`` showed ``--version <bool>`` (typer 0.29 prints a type for every option,
a flag included, unless it has a metavar); rich tables wrapped badly at 80 columns.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from posttrain.cli import app

runner = CliRunner()


def _option_lines(args: list[str]) -> dict[str, str]:
    result = runner.invoke(app, args, env={"COLUMNS": "80", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    lines = {}
    for line in result.output.splitlines():
        words = line.replace("│", " ").split()
        if words and words[0].startswith("--"):
            lines[words[0]] = " ".join(words)
    return lines


@pytest.mark.parametrize(
    ("args", "flags"),
    [([], ["--version", "--debug"]), (["sar"], ["--exact", "--overwrite"]), (["merge"], ["--overwrite"]),
     (["eval"], ["--json"])],
)  # fmt: skip
def test_flags_show_as_flags(args: list[str], flags: list[str]) -> None:
    lines = _option_lines([*args, "--help"])
    for flag in flags:
        assert flag in lines and "<bool>" not in lines[flag], lines.get(flag)


def test_the_edit_report_fits_80_columns(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    for name, seed in (("base", 0), ("tuned", 1)):
        g = torch.Generator().manual_seed(seed)
        (tmp_path / name).mkdir()
        save_file({"model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16, generator=g)},
                  str(tmp_path / name / "model.safetensors"))  # fmt: skip
    out = tmp_path / ("a-rather-long-output-directory-name-" * 3)
    result = runner.invoke(app, ["sar", str(tmp_path / "base"), str(tmp_path / "tuned"), str(out), "--rank", "0.5"],
                           env={"COLUMNS": "80"})  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if not line.startswith("written to")]  # a path, whole
    assert max(len(line) for line in lines) <= 80, result.output
    names = [line.replace("│", " ").split()[0] for line in lines if line.startswith("│")]
    assert "randomized_check_rel_error" in names and "stored_factor_params" in names, result.output
