"""Config loading: defaults, overrides, and errors that list the valid choices."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.errors import DomainError
from posttrain.llm.config import RunConfig, apply_overrides, config_from_dict, config_to_dict, load_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("name", ["tiny_cpu.yaml", "qwen_0.5b_gpu.yaml"])
def test_examples_load(name: str, tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"  # the GPU example's data file (the task is built, its file read, at load)
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    sets = [f"data.options.path={data}"] if name.startswith("qwen") else []
    cfg = load_config(EXAMPLES / name, sets)
    assert config_from_dict(config_to_dict(cfg)) == cfg  # round trip through the resolved mapping


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"optim": {"lrr": 1.0}}, r"optim: unknown key\(s\) lrr; valid: steps, name, lr"),
        (
            {"algorithm": {"method": "grpoo"}},
            r"algorithm.method: unknown name 'grpoo'; valid: cispo, drgrpo, .*, grpo, gspo, .*, rloo, .*sis",
        ),
        ({"algorithm": {"kl": "k4", "kl_coef": 0.1}}, r"algorithm.kl: unknown name 'k4'; valid: k1, k2, k3"),
        ({"algorithm": {"aggregation": "mean"}}, r"algorithm.aggregation: .*valid: .*token-mean"),
        ({"data": {"task": "chess"}}, r"data.task: .*valid: addition, .*countdown"),
        ({"rollout": {"engine": "sglang"}}, r"rollout.engine: .*valid: hf, vllm"),
        ({"optim": {"name": "Adamm"}}, r"optim.name: .*AdamW"),
        ({"optim": {"lr": "fast"}}, r"optim.lr: expected a number, got 'fast'"),
        ({"optim": {"lr": -1.0}}, r"optim.lr: expected a number in \(0.0, 1000.0\], got -1.0"),
        ({"optim": {"micro_batch_size": 6}}, r"micro_batch_size: expected a positive multiple of rollout.group_size=8"),
        ({"algorithm": {"kl": "k3"}}, r"set both"),
        ({"bogus": 1}, r"config: unknown key\(s\) bogus"),
        ({"model": []}, r"model: expected a mapping"),
    ],
)
def test_config_errors_list_valid_choices(raw: dict, match: str) -> None:
    with pytest.raises(DomainError, match=match):
        config_from_dict(raw)


def test_unknown_method_lists_every_registered_method() -> None:
    from posttrain.llm.methods.catalog import METHODS

    with pytest.raises(DomainError) as err:
        config_from_dict({"algorithm": {"method": "grpoo"}})
    listed = str(err.value).split("valid: ", 1)[1].split(", ")
    assert listed == sorted(METHODS.names())


def test_overrides_and_yaml_scalars(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 1e-3\nalgorithm:\n  method: rloo\n")
    cfg = load_config(
        path, ["optim.lr=2e-4", "rollout.group_size=4", "algorithm.kl=k3", "algorithm.kl_coef=0.01", "model.path=null"]
    )
    assert isinstance(cfg, RunConfig)
    assert cfg.optim.lr == 2e-4 and cfg.rollout.group_size == 4 and cfg.algorithm.method == "rloo"
    assert cfg.algorithm.kl == "k3" and cfg.model.path is None
    with pytest.raises(DomainError, match="key=value"):
        apply_overrides({}, ["optim.lr"])
    with pytest.raises(DomainError, match="unknown key"):
        load_config(path, ["optim.nope=1"])
