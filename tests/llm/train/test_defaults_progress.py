"""Wrong defaults and silent no-ops of the tools, and feedback during long work.

Findings covered: ``posttrain eval RUN/initial`` using the run's task, ``posttrain flops`` measuring
the prompt length of the task, ``sar`` refusing to overwrite its inputs and being deterministic,
SFT losses reported while they run, an ES example config sized for a CPU.
"""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from posttrain.errors import DomainError
from posttrain.llm.config import config_from_dict, config_to_dict, load_config
from posttrain.llm.rollout.tasks import make_task
from posttrain.llm.train.rundir import write_checksums

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
runner = CliRunner()


def _run_dir(tmp_path: Path, tiny_dir: Path) -> Path:
    """A run directory by hand: config.yaml (task ``addition``) and the tiny model as ``initial/``."""
    run = tmp_path / "run"
    run.mkdir()
    cfg = config_from_dict({"data": {"task": "addition", "options": {"digits": 1}, "eval_prompts": 4},
                            "rollout": {"max_new_tokens": 2}})  # fmt: skip
    (run / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    shutil.copytree(tiny_dir, run / "initial")
    write_checksums(run / "initial")  # as a run writes it: eval verifies what a run wrote
    return run


def test_eval_of_a_run_subdirectory_uses_the_runs_task(tmp_path: Path, tiny_dir: Path) -> None:
    from posttrain.cli import app
    from posttrain.llm.cli import resolve_checkpoint

    run = _run_dir(tmp_path, tiny_dir)
    assert resolve_checkpoint(run / "initial") == (run / "initial", run)
    a = runner.invoke(app, ["eval", str(run / "initial"), "--json"])
    b = runner.invoke(app, ["eval", str(run / "initial"), "--json", "--config", str(run / "config.yaml")])
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    drop = {"checkpoint"}
    ma, mb = (json.loads(r.stdout.strip().splitlines()[-1]) for r in (a, b))
    assert {k: v for k, v in ma.items() if k not in drop} == {k: v for k, v in mb.items() if k not in drop}
    bare = runner.invoke(app, ["eval", str(tiny_dir)])  # a model directory with no run config around it
    assert bare.exit_code == 2 and "--config" in bare.output


def test_flops_measures_the_prompt_length_of_the_task() -> None:
    from posttrain.llm.tools.flops import plan_from_mapping

    raw = {"data": {"task": "multiple", "prompts_per_step": 4}, "rollout": {"group_size": 2}}
    plan = plan_from_mapping(raw)
    cfg = config_from_dict(raw)
    prompts = make_task("multiple").sample(random.Random(cfg.seed), 256)
    assert plan.prompt_tokens == pytest.approx(sum(len(p.prompt) for p in prompts) / 256)  # 1 token per char
    assert 5 <= plan.prompt_tokens <= 7  # "m7<50:" is 6 characters, not the generic 64
    with pytest.raises(DomainError, match=r"flops\.prompt_tokens"):
        plan_from_mapping({"model": {"path": "org/not-local"}, "flops": {"n_params": 1e9}})
    assert (
        plan_from_mapping({"model": {"path": "org/x"}, "flops": {"n_params": 1e9, "prompt_tokens": 9}}).prompt_tokens
        == 9
    )


def _weights(directory: Path, seed: int) -> None:
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    directory.mkdir(parents=True)
    tensors = {
        f"model.layers.{i}.self_attn.{p}_proj.weight": torch.randn(48, 40, generator=g)
        for i in range(2)
        for p in "qkvo"
    }
    tensors["model.embed_tokens.weight"] = torch.randn(10, 40, generator=g)
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text("{}")


def test_sar_refuses_to_write_over_its_inputs_and_is_deterministic(tmp_path: Path) -> None:
    from posttrain.llm.tools.sar import edit_checkpoint, load_weights

    base, tuned = tmp_path / "base", tmp_path / "tuned"
    _weights(base, 0)
    _weights(tuned, 0)
    w = load_weights(tuned)
    from safetensors.torch import save_file

    save_file({k: v + 0.01 * torch.randn_like(v) for k, v in w.items()}, str(tuned / "model.safetensors"))
    before = (base / "model.safetensors").read_bytes()
    for out in (base, tuned, tmp_path / "base" / "."):
        with pytest.raises(DomainError, match="out_dir"):
            edit_checkpoint(base, [tuned], out, delta_fraction=0.1)
    assert (base / "model.safetensors").read_bytes() == before
    torch.manual_seed(1)
    edit_checkpoint(base, [tuned], tmp_path / "a", delta_fraction=0.1)
    torch.manual_seed(2)  # a different global RNG state must not matter
    edit_checkpoint(base, [tuned], tmp_path / "b", delta_fraction=0.1)
    a, b = load_weights(tmp_path / "a"), load_weights(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sft_losses_are_reported_while_they_run(tmp_path: Path) -> None:
    from posttrain.llm.run import build_trainer

    cfg = config_from_dict(
        {"model": {"tiny": {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 64}},
         "data": {"task": "addition", "options": {"digits": 1}, "sft_steps": 3, "sft_batch_size": 4},
         "logging": {"progress": False}}
    )  # fmt: skip
    seen: list[tuple[int, float]] = []
    build_trainer(cfg, tmp_path / "run", on_sft_step=lambda step, loss: seen.append((step, loss)))
    assert [s for s, _ in seen] == [1, 2, 3]
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "sft_metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == seen


def test_es_example_is_sized_for_a_cpu() -> None:
    cfg = load_config(EXAMPLES / "es_tiny_cpu.yaml")
    evaluations = cfg.es.steps * cfg.es.population * (cfg.es.prompts_per_step or cfg.data.prompts_per_step)
    assert cfg.model.path is None and cfg.model.device == "cpu"
    assert evaluations <= 20_000  # greedy generations of a tiny model: minutes on a CPU, not hours


def test_es_command_reports_every_step(tmp_path: Path) -> None:
    from posttrain.cli import app

    sets = ["es.steps=2", "es.population=2", "es.prompts_per_step=2", "data.sft_steps=1", "data.sft_batch_size=2"]
    result = runner.invoke(
        app, ["es", str(EXAMPLES / "es_tiny_cpu.yaml"), "--out", str(tmp_path / "es"),
              *[a for s in sets for a in ("--set", s)]]
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = [json.loads(ln) for ln in (tmp_path / "es" / "es_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert "es 2/2" in result.output  # the progress line's last state
    if importlib.util.find_spec("matplotlib") is not None:
        from posttrain.llm.train.curves import curve_points

        assert (tmp_path / "es" / "curves.png").is_file()
        assert "ES population reward" in curve_points(tmp_path / "es")


def test_smollm2_example_saves_checkpoints_a_killed_run_can_be_evaluated_from() -> None:
    cfg = load_config(EXAMPLES / "smollm2_cpu.yaml")
    assert 0 < cfg.checkpoint.every < cfg.optim.steps  # a run killed midway leaves a checkpoint
    assert cfg.optim.steps % cfg.checkpoint.every == 0  # and the last step is one of them
