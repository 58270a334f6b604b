"""TRL-style trainer features on the tiny model: a custom reward function, local dataset prompts,
dtype, gradient checkpointing and LoRA (peft) with adapter / merged checkpoints."""

from __future__ import annotations

import json
import math
import random
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from posttrain.errors import DomainError
from posttrain.llm.config import config_from_dict

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")


def _raw(**over: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "model": {"tiny": {"num_hidden_layers": 1}},
        "data": {"task": "addition", "options": {"digits": 1}, "prompts_per_step": 2, "eval_prompts": 2},
        "rollout": {"group_size": 4, "max_new_tokens": 3},
        "algorithm": {"method": "grpo"},
        "optim": {"steps": 2, "lr": 1e-2, "updates_per_batch": 1},
        "checkpoint": {"every": 1, "keep": 2},
        "logging": {"progress": False},
    }
    for key, value in over.items():
        section, name = key.split("__")
        raw[section][name] = value
    return raw


@pytest.fixture()
def reward_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An importable module of reward functions (TRL's signature, and some broken ones)."""
    name = f"trl_rewards_{abs(hash(tmp_path)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            CALLS = []

            def length(prompts, completions, **kwargs):
                CALLS.append({"prompts": list(prompts), "completions": list(completions), **kwargs})
                return [float(len(c)) for c in completions]

            def unjudged(prompts, completions, **kwargs):
                return [None] * len(completions)

            def short(prompts, completions, **kwargs):
                return [1.0]

            def no_kwargs(prompts, completions):
                return [0.0] * len(completions)

            NOT_CALLABLE = 3
            """
        )
    )
    (tmp_path / "trl_broken_mod.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "trl_marked_mod.py").write_text(
        f"from pathlib import Path\nPath({str(tmp_path / 'imported')!r}).write_text('yes')\n"
        "def f(prompts, completions, **kwargs):\n    raise ValueError('reward exploded')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


# ------------------------------------------------------------------ 1. custom reward function
@pytest.mark.parametrize("spec", ["no_colon", "mod:", ":f", "my mod:f", "mod:f:g", "1mod:f"])
def test_reward_spec_form_fails_at_load_naming_the_key(spec: str) -> None:
    with pytest.raises(DomainError, match=r"^data\.reward: expected 'package\.module:function'"):
        config_from_dict(_raw(data__reward=spec))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("trl_no_such_module_xyz:f", "cannot import module"),
        ("trl_broken_mod:f", "boom at import"),
        ("{mod}:missing", "has no attribute"),
        ("{mod}:NOT_CALLABLE", "not callable"),
        ("{mod}:no_kwargs", "TRL's reward signature"),
        ("trl_marked_mod:f", "raised ValueError: reward exploded"),
    ],
)
def test_bad_reward_function_fails_when_training_builds_the_task(
    reward_module: str, spec: str, message: str, tmp_path: Path
) -> None:
    """The module is imported (and the function tried once) when training builds the task, not at load; a failure
    there names data.reward and leaves the run directory untouched."""
    from posttrain.llm.run import build_trainer

    cfg = config_from_dict(_raw(data__reward=spec.format(mod=reward_module)))  # the form only: no import
    with pytest.raises(DomainError, match=rf"^data\.reward: .*{message}"):
        build_trainer(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_loading_a_config_does_not_import_its_reward_module(reward_module: str, tmp_path: Path) -> None:
    """Loading (also what ``--resume`` and ``posttrain eval`` do with a run's config) runs none of the module's code."""
    from posttrain.llm.config import load_config

    path = tmp_path / "run.yaml"
    path.write_text("data: {task: addition, reward: trl_marked_mod:f}\n")
    assert load_config(path).data.reward == "trl_marked_mod:f"
    assert not (tmp_path / "imported").exists()


def test_reward_function_gets_trl_arguments_and_none_is_unjudged(reward_module: str) -> None:
    import importlib

    from posttrain.llm.rollout.reward_fn import with_reward_function
    from posttrain.llm.rollout.tasks import Problem, make_task

    task = with_reward_function(make_task("addition", digits=1), f"{reward_module}:length")
    problems = [Problem("1+2=", "3", columns=(("answer", "3"), ("level", 1))), Problem("4+4=", "8")]
    assert task.rewards(problems, ["33", "8"]) == [2.0, 1.0]
    call = importlib.import_module(reward_module).CALLS[-1]
    assert call == {"prompts": ["1+2=", "4+4="], "completions": ["33", "8"], "answer": ["3", "8"], "level": [1, None]}
    assert all(
        math.isnan(r)
        for r in with_reward_function(task.task, f"{reward_module}:unjudged").rewards(problems, ["a", "b"])
    )
    with pytest.raises(DomainError, match="returned 1 rewards for 2 completions"):
        with_reward_function(task.task, f"{reward_module}:short").rewards(problems, ["a", "b"])


def test_trainer_scores_with_the_reward_function(tmp_path: Path, reward_module: str) -> None:
    from posttrain.llm.run import build_trainer

    trainer = build_trainer(config_from_dict(_raw(data__reward=f"{reward_module}:length")), tmp_path / "run")
    batch, texts = trainer.rollout()
    assert batch.rewards.tolist() == [float(len(t)) for t in texts]
    none = build_trainer(config_from_dict(_raw(data__reward=f"{reward_module}:unjudged")), tmp_path / "none")
    before = [p.detach().clone() for p in none.model.parameters()]
    m = none.train_step()
    assert m["loss"] is None  # nothing judged: no update
    assert all(torch.equal(a, b) for a, b in zip(before, none.model.parameters(), strict=True))


# ------------------------------------------------------------------ 2. local dataset prompts
def _rows(n: int) -> list[dict[str, Any]]:
    return [{"question": f"{i}+{i}=", "solution": str(2 * i), "level": i % 3} for i in range(n)]


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_dataset_task_reads_local_files_with_a_column_mapping(tmp_path: Path, suffix: str) -> None:
    from posttrain.llm.rollout.tasks import make_task

    rows = _rows(10)
    path = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        import pandas as pd

        pd.DataFrame(rows).to_parquet(path)
    task = make_task("dataset", path=str(path), prompt="question", answer="solution", eval_fraction=0.2)
    train = {p.prompt for p in task.sample(random.Random(0), 200)}
    held = {p.prompt for p in task.held_out(random.Random(0), 50)}
    assert train == {r["question"] for r in rows[:8]} and held == {r["question"] for r in rows[8:]}
    p = task.sample(random.Random(1), 1)[0]
    assert (
        p.answer == str(2 * int(p.prompt.split("+")[0])) and dict(p.columns)["level"] == int(p.prompt.split("+")[0]) % 3
    )
    assert task.reward(p, p.answer) == 1.0 and task.reward(p, "x") == 0.0


def test_dataset_task_bad_values_fail_at_load_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows(4)))

    def load(**options: Any) -> Any:
        return config_from_dict(
            _raw(data__task="dataset", data__options={"path": str(path), "prompt": "question", **options})
        )

    with pytest.raises(DomainError, match=r"^data\.options\.answer: no column 'answer'"):
        load()
    with pytest.raises(DomainError, match=r"^data\.options\.path: no file"):
        load(path=str(tmp_path / "missing.jsonl"), answer="solution")
    with pytest.raises(DomainError, match=r"^data\.options: unknown option\(s\) colums"):
        load(answer="solution", colums="x")
    with pytest.raises(DomainError, match=r"^data\.options\.format: unknown name 'csv'"):
        load(answer="solution", format="csv")
    with pytest.raises(DomainError, match=r"^data\.options\.eval_fraction"):
        load(answer="solution", eval_fraction=1.5)
    cfg = load(answer="solution", eval_fraction=0.25)
    assert cfg.data.options["eval_fraction"] == 0.25


def test_trainer_on_dataset_prompts(tmp_path: Path) -> None:
    from posttrain.llm.run import build_trainer

    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows(6)))
    opts = {"path": str(path), "prompt": "question", "answer": "solution"}
    trainer = build_trainer(config_from_dict(_raw(data__task="dataset", data__options=opts)), tmp_path / "run")
    m = trainer.train_step()
    assert m["loss"] is not None and 0.0 <= m["reward_mean"] <= 1.0


# ------------------------------------------------------------------ 3. dtype and gradient checkpointing
def test_bfloat16_policy_and_reference(tmp_path: Path) -> None:
    from posttrain.llm.run import build_trainer, load_model

    raw = _raw(model__dtype="bfloat16", algorithm__kl="k3", algorithm__kl_coef=0.05)
    trainer = build_trainer(config_from_dict(raw), tmp_path / "run")
    assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in load_model(tmp_path / "run" / "initial", trainer.cfg)[0].parameters()} == {torch.bfloat16}
    m = trainer.train_step()  # the reference (same loader) fills logp_ref in bfloat16
    assert m["loss"] is not None and math.isfinite(m["loss"]) and math.isfinite(m["kl"])
    with pytest.raises(DomainError, match=r"^model\.dtype: unknown name 'fp8'"):
        config_from_dict(_raw(model__dtype="fp8"))


def _loss_and_grads(model: Any, tok: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
    from posttrain.llm.rollout.logprobs import token_logprobs

    torch.manual_seed(0)
    prompt = torch.tensor([[5, 6, 7, 8], [0, 9, 10, 11]])
    pmask = prompt != 0
    resp = torch.tensor([[12, 13, 14], [15, 16, 3]])
    model.train()
    model.zero_grad()
    logp, _ = token_logprobs(model, prompt, pmask, resp, torch.ones_like(resp, dtype=torch.bool), temperature=1.0)
    loss = -logp.sum()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_gradient_checkpointing_gives_the_same_loss_and_gradient(tiny: tuple[Any, Any]) -> None:
    from posttrain.llm.policy import prepare_policy

    model, tok = tiny
    loss, grads = _loss_and_grads(model, tok)
    ckpt = prepare_policy(model, lora=None, gradient_checkpointing=True)
    on = getattr(type(ckpt), "is_activation_checkpointing", None)
    assert ckpt.is_activation_checkpointing if on is not None else ckpt.is_gradient_checkpointing
    assert ckpt.config.use_cache is False
    loss2, grads2 = _loss_and_grads(ckpt, tok)
    assert len(grads) == len(grads2) > 0
    torch.testing.assert_close(loss2, loss, atol=1e-5, rtol=0)
    for a, b in zip(grads, grads2, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)


# ------------------------------------------------------------------ 4. LoRA through peft
def test_lora_bad_values_fail_at_load_naming_the_key() -> None:
    for lora, message in (
        ({"r": 0}, r"model\.lora\.r: expected an integer in \[1, 16384\], got 0"),
        ({"dropout": 1.0}, r"model\.lora\.dropout"),
        ({"save": "full"}, r"model\.lora\.save: unknown name 'full'"),
        ({"rank": 4}, r"model\.lora: unknown key\(s\) rank"),
        ({"target_modules": " , "}, r"model\.lora\.target_modules"),
    ):
        with pytest.raises(DomainError, match=message):
            config_from_dict(_raw(model__lora=lora))
    with pytest.raises(DomainError, match=r"^model\.lora: not supported with rollout\.engine='vllm'"):
        config_from_dict(_raw(model__lora={"r": 4}, rollout__engine="vllm"))


def _logits(model: Any) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([[5, 6, 7, 8, 9]])).logits


@pytest.mark.parametrize("save", ["adapter", "merged"])
def test_lora_trains_only_adapters_and_checkpoints_load(tmp_path: Path, save: str, reward_module: str) -> None:
    from transformers import AutoModelForCausalLM

    from posttrain.llm.run import build_trainer

    lora = {"r": 4, "alpha": 8, "target_modules": "q_proj,v_proj", "save": save}
    raw = _raw(model__lora=lora, model__gradient_checkpointing=True, data__reward=f"{reward_module}:length")
    cfg = config_from_dict({**raw, "optim": {**raw["optim"], "options": {"weight_decay": 0.0}}})
    trainer = build_trainer(cfg, tmp_path / "run")
    named = dict(trainer.model.named_parameters())
    trainable = {n for n, p in named.items() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in named.items()}
    trainer.fit()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable and any("lora_B" in n for n in changed)
    ckpt = trainer.out_dir / "checkpoints" / f"step_{trainer.step:06d}" / "model"
    adapter_dir = ckpt if save == "adapter" else ckpt / "adapter"
    assert (adapter_dir / "adapter_config.json").is_file()
    assert (ckpt / "model.safetensors").is_file() == (save == "merged")
    expected = _logits(trainer.model)
    loaded = AutoModelForCausalLM.from_pretrained(str(ckpt))  # adapter: base from initial/ + adapter
    torch.testing.assert_close(_logits(loaded), expected, atol=1e-5, rtol=1e-5)
    from typer.testing import CliRunner

    from posttrain.cli import app

    result = CliRunner().invoke(app, ["eval", str(ckpt.parent), "--k", "1", "--json"])  # a checkpoint directory
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.output.strip().splitlines()[-1])
    assert metrics["reward_mean"] > 0  # scored by the reward function (length > 0), not the task's 0/1 check
    resumed = build_trainer(cfg, tmp_path / "run", resume=True)
    assert resumed.step == trainer.step
    torch.testing.assert_close(_logits(resumed.model), expected, atol=1e-6, rtol=0)
