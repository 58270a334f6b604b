"""A corpus of bad run configs: each ends ``posttrain train`` at load in one line naming its key, exit code 2.

Every case goes through the real command (typer's runner, in process) with ``--out`` pointing at a fresh
directory, and must: exit with code 2, print exactly one line, that line containing the case's key (or the
file, for a file that is not a YAML mapping), no traceback, nothing written where the run would go, and
cost under 5 s of CPU. A few cases also run as ``python -m posttrain`` in a subprocess.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")

BASE = (
    "data: {task: addition, options: {digits: 1}, prompts_per_step: 2, eval_prompts: 2}\n"
    "rollout: {group_size: 8, max_new_tokens: 3}\n"
    "logging: {progress: false}\n"
)
"""A valid config the ``--set`` cases start from."""

TEACHER = "model.teacher=some/teacher"  # a teacher is named (never loaded: the config fails first)

SETS: list[tuple[str, list[str]]] = [
    # the findings of the reliability review
    ("rollout.top_p", ["rollout.top_p=1.5"]),
    ("rollout.top_k", ["rollout.top_k=-1"]),
    ("logging.eval_samples", ["logging.eval_samples=0"]),
    ("data.sft_lr", ["data.sft_lr=-1"]),
    ("data.sft_batch_size", ["data.sft_batch_size=0"]),
    ("data.options.digits", ["data.options.digits=-3"]),
    ("data.options.digits", ["data.options.digits=100000000"]),
    ("data.options.digits", ["data.options.digits=1e8"]),
    ("model.tiny.num_hidden_layers", ["model.tiny.num_hidden_layers=-1"]),
    ("optim.options.betas", ["optim.options={betas: 5}"]),
    ("optim.updates_per_batch", ["optim.updates_per_batch=1000000000"]),
    ("optim.steps", ["optim.steps=100000000000000000000000000"]),
    ("optim.steps", ["optim.steps=1e26"]),
    ("seed", ["seed=100000000000000000000000"]),
    ("seed", ["seed=9223372036854775808"]),
    ("seed", ["seed=-1"]),
    # sampling
    ("rollout.top_p", ["rollout.top_p=0"]),
    ("rollout.temperature", ["rollout.temperature=0"]),
    ("rollout.temperature", ["rollout.temperature=-1"]),
    ("rollout.temperature", ["rollout.temperature=.nan"]),
    ("rollout.temperature", ["rollout.temperature=.inf"]),
    ("rollout.temperature", ["rollout.temperature=hot"]),
    ("rollout.group_size", ["rollout.group_size=0"]),
    ("rollout.group_size", ["rollout.group_size=100000"]),
    ("rollout.max_new_tokens", ["rollout.max_new_tokens=0"]),
    ("rollout.max_new_tokens", ["rollout.max_new_tokens=10000000000"]),
    ("rollout.engine", ["rollout.engine=sglang"]),
    ("rollout.vllm_gpu_memory_utilization", ["rollout.vllm_gpu_memory_utilization=1.5"]),
    ("rollout.compile_decode", ["rollout.compile_decode=maybe"]),
    # data
    ("data.prompts_per_step", ["data.prompts_per_step=0"]),
    ("data.prompts_per_step", ["data.prompts_per_step=1000000000"]),
    ("data.eval_prompts", ["data.eval_prompts=0"]),
    ("data.sft_steps", ["data.sft_steps=-1"]),
    ("data.sft_steps", ["data.sft_steps=1000000000000"]),
    ("data.task", ["data.task=chess"]),
    ("data.options", ["data.options.hihg=3"]),
    ("data.options.digits", ["data.options.digits=true"]),
    ("data.options.digits", ["data.options.digits=[1, 2]"]),
    ("data.options", ["data.task=countdown", "data.options={count: 3, digits: 1}"]),
    ("data.options.count", ["data.task=countdown", "data.options={count: 100}"]),
    ("data.options.high", ["data.task=countdown", "data.options={high: 0}"]),
    ("data.options.bound", ["data.task=multiple", "data.options={high: 9, bound: 10}"]),
    ("data.options.high", ["data.task=multiple", "data.options={low: 9, high: 2}"]),
    ("data.options.template", ["data.task=chat_addition", "data.options={template: '{c}'}"]),
    ("data.options.path", ["data.task=jsonl", "data.options={path: /no/such/file.jsonl}"]),
    ("data.options.path", ["data.task=jsonl", "data.options={}"]),
    ("data.options.verifier", ["data.task=jsonl", "data.options={path: x.jsonl, verifier: nope}"]),
    (
        "data.options.tasks.a.options.digits",
        ["data.task=mixture", "data.options={tasks: {a: {task: addition, options: {digits: 100000}}}}"],
    ),
    ("data.options.tasks.a", ["data.task=mixture", "data.options={tasks: {a: nope}}"]),
    ("data.options.weights", ["data.task=mixture", "data.options={tasks: {a: addition}, weights: {b: 1}}"]),
    ("data.reward", ["data.reward=no colon"]),
    ("data.reward", ["data.reward=5"]),
    ("data.reward", ["data.reward=mod:"]),
    # model
    ("model.dtype", ["model.dtype=float8"]),
    ("model.lora.r", ["model.lora={r: 0}"]),
    ("model.lora.dropout", ["model.lora={dropout: 1.0}"]),
    ("model.lora.save", ["model.lora={save: full}"]),
    ("model.lora.target_modules", ["model.lora={target_modules: ' , '}"]),
    ("model.lora", ["model.lora={r: 4}", "rollout.engine=vllm"]),
    ("model.tiny.hidden_size", ["model.tiny={hidden_size: 100, num_attention_heads: 3}"]),
    ("model.tiny.num_key_value_heads", ["model.tiny.num_key_value_heads=3"]),
    ("model.tiny.arch", ["model.tiny.arch=gpt2"]),
    ("model.tiny.hidden_size", ["model.tiny.hidden_size=10000000"]),
    ("model.tiny", ["model.tiny.hidden=8"]),
    ("model.teachers", ["model.teachers={x: a}"]),
    ("model.teachers", ["model.teacher=a", "model.teachers={x: a}"]),
    ("model.teachers.a", ["model.teachers={a: 5}"]),
    ("model.system_prompt", ["model.system_prompt=[1]"]),
    ("model.chat_template", ["model.chat_template=maybe"]),
    # algorithm: names, penalties, estimator options
    ("algorithm.method", ["algorithm.method=grpoo"]),
    ("algorithm.advantage", ["algorithm.advantage=nope"]),
    ("algorithm.loss", ["algorithm.loss=nope"]),
    ("algorithm.kl", ["algorithm.kl=k4", "algorithm.kl_coef=0.1"]),
    ("algorithm.kl", ["algorithm.kl=k3"]),
    ("algorithm.kl_coef", ["algorithm.kl_coef=-1"]),
    ("algorithm.entropy_coef", ["algorithm.entropy_coef=-0.1"]),
    ("algorithm.aggregation", ["algorithm.aggregation=mean"]),
    ("algorithm.topk", ["algorithm.topk=0"]),
    ("algorithm.loss_options.clip_high", ["algorithm.loss_options.clip_high=-1"]),
    ("algorithm.loss_options.clip_low", ["algorithm.loss_options.clip_low=1.5"]),
    ("algorithm.loss_options.dual_clip", ["algorithm.loss_options.dual_clip=0.5"]),
    ("algorithm.loss_options.clip_low", ["algorithm.loss_options.clip_low=.nan"]),
    ("algorithm.loss_options", ["algorithm.loss_options.clip_lo=0.2"]),
    ("algorithm.loss_options.on_policy", ["algorithm.loss_options.on_policy=1"]),
    ("algorithm.advantage_options.eps", ["algorithm.advantage_options.eps=-1"]),
    ("algorithm.advantage_options", ["algorithm.advantage_options.epz=1"]),
    ("algorithm.advantage_options.gamma", ["algorithm.advantage=reinforce_pp", "algorithm.advantage_options.gamma=2"]),
    ("algorithm.advantage_options.q", ["algorithm.advantage=garl"]),
    ("algorithm.advantage", ["algorithm.advantage=hdpo"]),
    ("algorithm.options", ["algorithm.options={beta: 1}"]),
    ("rollout.group_size", ["rollout.group_size=1"]),
    # algorithm: method options (typed option classes) and needs
    ("algorithm.loss", ["algorithm.method=gflowrl", "algorithm.loss=ppo_clip"]),
    ("algorithm.options.beta", ["algorithm.method=gflowrl", "algorithm.options.beta=0"]),
    ("algorithm.options.variant", ["algorithm.method=gflowrl", "algorithm.options.variant=weird"]),
    ("algorithm.options", ["algorithm.method=gflowrl", "algorithm.options.bta=1"]),
    ("algorithm.options.clip", ["algorithm.method=flowrl", "algorithm.options.clip=1.0"]),
    ("algorithm.options.width", ["algorithm.method=flowrl", "algorithm.options.width=0"]),
    ("algorithm.options.base", ["algorithm.method=sis", "algorithm.options.base=gflowrl"]),
    ("algorithm.options.top_k", ["algorithm.method=sis", "algorithm.options.top_k=0"]),
    ("algorithm.options.switch_step", ["algorithm.method=opd_then_rl", TEACHER]),
    ("algorithm.options.switch_rule", ["algorithm.method=opd_then_rl", "algorithm.options.switch_rule=best", TEACHER]),
    ("model.teacher", ["algorithm.method=opd_then_rl", "algorithm.options.switch_step=2"]),
    ("model.teacher", ["algorithm.method=opd2"]),
    ("model.teacher", ["algorithm.method=exopd"]),
    ("model.teacher", ["algorithm.loss=opd"]),
    ("algorithm.options.clip_high", ["algorithm.method=exopd", "algorithm.options.clip_high=0", TEACHER]),
    ("algorithm.options.q", ["algorithm.method=garl", "algorithm.options.q=2"]),
    ("rollout.answer_suffix", ["algorithm.method=garl", "algorithm.options.variant=likelihood"]),
    ("algorithm.options.samples", ["algorithm.method=paft", "algorithm.options.samples=0"]),
    ("algorithm.options.switch_step", ["algorithm.method=garl", "algorithm.options.q_after=0.5"]),
    ("rollout.oracle", ["algorithm.method=orarl", "rollout.group_size=9"]),
    (
        "algorithm.options.prune_ratio",
        ["algorithm.method=orarl", "rollout.oracle={}", "algorithm.options.prune_ratio=1.0"],
    ),
    (
        "algorithm.options.q_pos",
        ["algorithm.method=orarl", "rollout.oracle={}", "rollout.group_size=9", "algorithm.options.q_pos=5"],
    ),
    ("algorithm.options.prune_ratio", ["algorithm.method=orarl", "rollout.oracle={}", "rollout.group_size=3"]),
    (
        "algorithm.options.context_template",
        ["algorithm.method=self_routing", "algorithm.options.context_template='{answer}'"],
    ),
    ("algorithm.options.sigma_m", ["algorithm.method=self_routing", "algorithm.options.sigma_m=0"]),
    ("algorithm.options.targets", ["algorithm.method=open_mopd", "algorithm.options.targets=[1, -1]", TEACHER]),
    (
        "algorithm.options.gap_reference",
        ["algorithm.method=open_mopd", "algorithm.options.gap_reference=divide", TEACHER],
    ),
    # rollout stages
    ("rollout.answer_suffix", ["rollout.answer_suffix={}"]),
    ("rollout.group_size", ["rollout.oracle={}", "rollout.group_size=1"]),
    ("rollout.oracle", ["rollout.oracle={}", "rollout.replay={}"]),
    ("rollout.replay.rule", ["rollout.replay={rule: nope}"]),
    ("rollout.replay.capacity", ["rollout.replay={capacity: 0}"]),
    ("rollout.replay.k_rep", ["rollout.replay={k_rep: 100000}"]),
    ("rollout.branching.branches", ["rollout.branching={branches: 8}"]),
    ("rollout.branching.explore", ["rollout.branching={explore: 2}"]),
    ("rollout.replay", ["rollout.replay=[1]"]),
    # optimisation
    ("optim.name", ["optim.name=Adamm"]),
    ("optim.lr", ["optim.lr=0"]),
    ("optim.lr", ["optim.lr=.nan"]),
    ("optim.micro_batch_size", ["optim.micro_batch_size=6"]),
    ("optim.max_grad_norm", ["optim.max_grad_norm=0"]),
    ("optim.scheduler", ["optim.scheduler=exp"]),
    ("optim.warmup_steps", ["optim.warmup_steps=-1"]),
    ("optim.options", ["optim.options={eps: -1}"]),
    ("optim.options", ["optim.options={betaz: [0.9, 0.9]}"]),
    ("optim.options.betas", ["optim.options={betas: [0.9]}"]),
    ("optim.options", ["optim.name=SGD", "optim.options={momentum: -1}"]),
    ("optim.options.momentum", ["optim.name=MuonWithAdamW", "optim.options={momentum: 1.5}"]),
    ("optim", ["optim.lrr=1"]),
    # checkpoints, logging, parallel, ES, pairs, DPO
    ("checkpoint.keep", ["checkpoint.keep=0"]),
    ("checkpoint.every", ["checkpoint.every=-1"]),
    ("logging.eval_every", ["logging.eval_every=-1"]),
    ("logging.eval_metric", ["logging.eval_metric=pass@l"]),
    ("distributed.strategy", ["distributed.strategy=zero3"]),
    ("distributed.strategy", ["distributed.strategy=fsdp", "rollout.engine=vllm"]),
    ("rollout.replay", ["distributed.strategy=fsdp", "rollout.replay={}"]),
    ("es.population", ["es.population=0"]),
    ("es.population", ["es.antithetic=true", "es.population=3"]),
    ("es.sigma", ["es.sigma=0"]),
    ("es.shaping", ["es.shaping=nope"]),
    ("pairs.completions", ["pairs.completions=1"]),
    ("pairs.n_pairs", ["pairs.n_pairs=100000"]),
    ("dpo.label_smoothing", ["dpo.label_smoothing=0.5"]),
    ("dpo.micro_batch_size", ["dpo.batch_size=4", "dpo.micro_batch_size=5"]),
    ("bogus", ["bogus=1"]),
    ("model", ["model=[]"]),
    ("--set", ["optim.lr"]),
    ("--set", ["optim..lr=1"]),
    ("--set optim.lr=[", ["optim.lr=["]),
]
"""``(the key the one line must name, --set overrides on top of BASE)``."""


def _laughs(key_path: str) -> str:
    """A 1.6 KB "billion laughs" document: nine levels of nine aliases under ``key_path``."""
    levels = ["a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    names = "abcdefghi"
    for prev, name in itertools.pairwise(names):
        levels.append(f"{name}: &{name} [{', '.join(f'*{prev}' for _ in range(9))}]")
    anchors = "anchors:\n" + "".join(f"  {line}\n" for line in levels)
    *sections, last = key_path.split(".")
    body, indent = "", ""
    for s in sections:
        body += f"{indent}{s}:\n"
        indent += "  "
    return anchors + body + f"{indent}{last}: *i\n"


FILES: list[tuple[str, bytes]] = [
    ("the file is empty", b""),
    ("the file is empty", b"# only a comment\n"),
    ("expected a YAML mapping", b"[1, 2]\n"),
    ("expected a YAML mapping", b"just a string\n"),
    ("duplicate key 'optim'", b"optim: {lr: 0.1}\noptim: {lr: 0.2}\n"),
    ("duplicate key 'digits'", b"data:\n  options:\n    digits: 1\n    digits: 2\n"),
    ("expands to more than", _laughs("seed").encode()),
    ("expands to more than", _laughs("data.options.digits").encode()),
    ("recursive alias", b"data:\n  options: &a {x: *a}\n"),
    ("not UTF-8 text", b"optim:\n  lr: 0.1 \xff\xfe\n"),
    ("nested deeper", b"seed: " + b"[" * 5000 + b"]" * 5000 + b"\n"),
    ("YAML syntax error", b"optim:\n  lr: 1e-3\n  steps: [1,\n"),
    ("YAML syntax error", b"seed: !!python/object/apply:os.system ['true']\n"),
    ("YAML syntax error", b"optim:\n\tlr: 0.1\n"),
    ("refused", b"seed: " + b"1" * 5000 + b"\n"),
    ("bytes; a config file is at most", b"seed: 0\n" + b"#" * (2 << 20) + b"\n"),
    ("anchors", b"anchors: 1\n"),
]
"""``(what the one line must say, file contents)``: files that are not a config the loader builds."""

runner = CliRunner()


def _one_line(tmp_path: Path, args: list[str], needle: str) -> float:
    """Run ``posttrain`` with ``args``; assert one line with ``needle``, exit code 2, nothing written; CPU seconds."""
    from posttrain.cli import app

    out = tmp_path / "run"
    start = time.process_time()
    result = runner.invoke(app, [*args, "--out", str(out)])
    cpu = time.process_time() - start
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert len(lines) == 1 and needle in lines[0], result.output
    assert "Traceback" not in result.output
    assert not out.exists(), sorted(out.iterdir())
    assert cpu < 5.0, cpu
    return cpu


def test_the_corpus_is_large() -> None:
    assert len(SETS) + len(FILES) >= 150


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    """Import the command's modules once, so the CPU bound measures the load, not the imports."""
    import posttrain.llm.run  # noqa: F401
    from posttrain.llm.config import config_from_dict

    config_from_dict({})


@pytest.mark.parametrize(("key", "sets"), SETS, ids=[f"{i}-{k}" for i, (k, _) in enumerate(SETS)])
def test_a_bad_value_ends_in_one_line_naming_its_key(tmp_path: Path, key: str, sets: list[str]) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(BASE)
    args = ["train", str(cfg)]
    for item in sets:
        args += ["--set", item]
    _one_line(tmp_path, args, key)


@pytest.mark.parametrize(("needle", "data"), FILES, ids=[f"{i}-{n[:20]}" for i, (n, _) in enumerate(FILES)])
def test_a_bad_file_ends_in_one_line_naming_it(tmp_path: Path, needle: str, data: bytes) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_bytes(data)
    _one_line(tmp_path, ["train", str(cfg)], needle)


def test_the_message_names_the_file_and_the_key(tmp_path: Path) -> None:
    from posttrain.cli import app

    cfg = tmp_path / "run.yaml"
    cfg.write_bytes(b"optim: {lr: 0.1}\noptim: {lr: 0.2}\n")
    line = runner.invoke(app, ["train", str(cfg)]).output.strip()
    assert line.endswith(f"{cfg}:2:1: refused: duplicate key 'optim'"), line


@pytest.mark.slow
@pytest.mark.parametrize(
    ("needle", "data"),
    [FILES[6], FILES[9], FILES[0], ("rollout.top_p", b"rollout: {top_p: 1.5}\n")],
)
def test_python_m_posttrain_exits_2_in_one_line(tmp_path: Path, needle: str, data: bytes) -> None:
    """The same through ``python -m posttrain`` in a subprocess: exit code 2, one line on stderr, a bounded CPU cost."""
    cfg = tmp_path / "run.yaml"
    cfg.write_bytes(data)
    before = os.times()
    proc = subprocess.run(
        [sys.executable, "-m", "posttrain", "train", str(cfg), "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], (proc.returncode, lines)
    assert not (tmp_path / "run").exists()
    assert cpu < 15.0, cpu  # the interpreter and torch's import included


def test_python_m_posttrain_does_not_import_from_the_working_directory(tmp_path: Path) -> None:
    """A module in the directory a command runs from does not shadow a library (``python -m`` puts it on the path)."""
    (tmp_path / "typer.py").write_text("raise SystemExit('imported from the working directory')\n")
    proc = subprocess.run(
        [sys.executable, "-m", "posttrain", "--help"], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "working directory" not in proc.stdout + proc.stderr
