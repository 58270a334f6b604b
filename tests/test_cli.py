"""The ``posttrain`` command line: help and the registry listing."""

from __future__ import annotations

from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.estimators import ADVANTAGES, KL_ESTIMATORS, POLICY_LOSSES

runner = CliRunner()


def test_help_lists_the_commands() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    assert "list" in result.output and "check" in result.output


def test_list_prints_every_registered_estimator_with_its_paper() -> None:
    result = runner.invoke(app, ["list"], terminal_width=400)
    assert result.exit_code == 0, result.output
    for reg in (ADVANTAGES, POLICY_LOSSES, KL_ESTIMATORS):
        assert f"{reg.kind} ({len(reg)})" in result.output
        for entry in reg:
            assert entry.name in result.output
    assert "arXiv:2402.03300" in result.output  # GRPO's paper next to its entry


def test_list_one_kind_and_an_unknown_kind() -> None:
    result = runner.invoke(app, ["list", "kl"], terminal_width=400)
    assert result.exit_code == 0, result.output
    assert "k3" in result.output and "grpo" not in result.output
    bad = runner.invoke(app, ["list", "no-such-kind"])
    assert bad.exit_code != 0
    assert "unknown registry" in bad.output
