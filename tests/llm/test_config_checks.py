"""Every option mapping and number is checked when the config loads, before a model is built.

Findings covered: typos in data.options / algorithm.loss_options / algorithm.advantage_options /
optim.options / model.tiny / logging.eval_metric, NaN and inf numbers, YAML syntax errors naming the
file, GRPO with group_size 1, and each CLI command ending a bad input in one line with exit code 2.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posttrain.errors import DomainError
from posttrain.llm.config import config_from_dict, load_config

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"data": {"task": "multiple", "options": {"hihg": 9}}}, r"data\.options: unknown option\(s\) hihg.*high"),
        ({"data": {"task": "addition", "options": {"digits": "two"}}}, r"data\.options\.digits: expected an integer"),
        ({"algorithm": {"loss_options": {"clip_lo": 0.2}}}, r"algorithm\.loss_options: unknown option\(s\) clip_lo.*clip_low"),
        ({"algorithm": {"advantage_options": {"epz": 1.0}}}, r"algorithm\.advantage_options: unknown option\(s\) epz"),
        ({"optim": {"options": {"betaz": [0.9, 0.9]}}}, r"optim\.options: unknown option\(s\) betaz.*weight_decay"),
        ({"model": {"tiny": {"hidden": 8}}}, r"model\.tiny: unknown key\(s\) hidden.*hidden_size"),
        ({"logging": {"eval_metric": "pass@l"}}, r"logging\.eval_metric: unknown name 'pass@l'.*greedy_accuracy"),
        ({"optim": {"lr": float("nan")}}, r"optim\.lr: expected a finite number"),
        ({"optim": {"lr": float("inf")}}, r"optim\.lr: expected a finite number"),
        ({"rollout": {"temperature": float("nan")}}, r"rollout\.temperature: expected a finite number"),
        ({"optim": {"max_grad_norm": float("nan")}}, r"optim\.max_grad_norm: expected a finite number"),
        ({"algorithm": {"loss_options": {"clip_low": float("nan")}}}, r"algorithm\.loss_options\.clip_low: expected a finite"),
        ({"rollout": {"group_size": 1}}, r"rollout\.group_size: 1 .*zero"),
    ],
)  # fmt: skip
def test_bad_options_fail_at_load_naming_the_key(raw: dict, match: str) -> None:
    start = time.perf_counter()
    with pytest.raises(DomainError, match=match):
        config_from_dict(raw)
    assert time.perf_counter() - start < 5.0  # at load, not after building a model


def test_group_size_one_is_fine_where_advantages_do_not_need_a_group() -> None:
    cfg = config_from_dict({"rollout": {"group_size": 1}, "algorithm": {"advantage": "reinforce_pp"}})
    assert cfg.rollout.group_size == 1


def test_yaml_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("optim:\n  lr: 1e-3\n  steps: [1,\n")
    with pytest.raises(DomainError, match=rf"{path}:\d+:\d+: YAML syntax error") as info:
        load_config(path)
    assert "<unicode string>" not in str(info.value)
    with pytest.raises(DomainError, match=r"--set optim\.lr=\[: YAML syntax error"):
        load_config(None, ["optim.lr=["])


def _one_line(args: list[str], *needles: str) -> None:
    from posttrain.cli import app

    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1, result.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_every_command_ends_a_bad_input_in_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("data:\n  task: multiple\n  options: {hihg: 3}\n")
    for command in (["train", str(cfg)], ["es", str(cfg)], ["flops", str(cfg)]):
        _one_line([*command], "data.options", "hihg")
    _one_line(["train", str(EXAMPLES / "tiny_cpu.yaml"), "--set", "optim.lr=.nan"], "optim.lr", "finite")
    _one_line(["eval", str(tmp_path)], "is not a run directory")
    _one_line(["eval", str(tmp_path), "--k", "1,x"], "--k")
