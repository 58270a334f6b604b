"""``rollout.staleness``: the batch of step t comes from the policy of step max(0, t - k), deterministically and
resumably; SIS, the correction and replay then see a known lag."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from posttrain.errors import DomainError
from posttrain.llm.config import config_from_dict
from posttrain.llm.methods.sis import response_log_probs
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.run import build_trainer
from posttrain.llm.train.checkpoint import latest_checkpoint, load_state

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")

TIME_KEYS = {"step_time_s", "gen_time_s"}


def _raw(**over: Any) -> dict[str, Any]:
    """4 prompts x 4 samples, a reward that varies within groups, a large learning rate (the policy moves)."""
    raw: dict[str, Any] = {
        "model": {"tiny": {"num_hidden_layers": 1}},
        "data": {"task": "addition", "options": {"digits": 1}, "prompts_per_step": 4, "sft_steps": 0,
                 "eval_prompts": 4, "reward": "tests.llm.train._rewards:by_length"},
        "rollout": {"group_size": 4, "max_new_tokens": 4, "staleness": 2},
        "algorithm": {"method": "grpo"},
        "optim": {"steps": 5, "lr": 3e-2},
        "checkpoint": {"every": 0}, "logging": {"progress": False},
    }  # fmt: skip
    for key, value in over.items():
        section, name = key.split("__")
        raw[section][name] = value
    return raw


def _rows(run: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIME_KEYS} for r in rows]


def _fit_recording(trainer: Any) -> tuple[list[Any], list[dict[str, torch.Tensor]], list[dict[str, Any]]]:
    """Fit, keeping each step's batch as generated and the weights of every policy version (0 = initial)."""
    generated, versions = [], [copy.deepcopy(trainer.policy.state_dict())]

    def on_step(metrics: dict[str, Any]) -> None:
        generated.append(trainer.generated)
        versions.append(copy.deepcopy(trainer.policy.state_dict()))

    return generated, versions, trainer.fit(on_step=on_step)


def test_each_batch_is_generated_by_the_policy_k_steps_earlier(tmp_path: Path) -> None:
    """SIS at staleness 2: every batch's engine log-probs and SIS envelope are those of the policy of
    max(0, t - 2), not of the current one; the data stream is the on-policy run's; some tokens are rejected."""
    sis = {"method": "sis", "options": {"top_k": 100}}
    trainer = build_trainer(config_from_dict(_raw(algorithm__method="sis") | {"algorithm": sis}), tmp_path / "stale")
    generated, versions, history = _fit_recording(trainer)
    on_policy = build_trainer(config_from_dict(_raw(rollout__staleness=0)), tmp_path / "on")
    fresh, _, _ = _fit_recording(on_policy)
    probe = copy.deepcopy(trainer.policy)
    assert [g.version for g in generated] == [0, 0, 0, 1, 2]
    assert [h["rollout/lag"] for h in history] == [0, 1, 2, 2, 2]
    for t, gen in enumerate(generated):
        assert gen.step == t and gen.prompts == fresh[t].prompts and gen.seed == fresh[t].seed  # same data stream
        b = gen.batch
        probe.load_state_dict(versions[gen.version])
        with torch.no_grad():
            behaviour, _ = token_logprobs(probe, b.prompt_ids, b.prompt_mask, b.response_ids, b.mask)
            full = response_log_probs(probe, b, 1.0)
            top = full.topk(min(100, full.shape[-1]), dim=-1)  # K = min(top_k, V)
        torch.testing.assert_close(torch.where(b.mask, b.logp_old, 0.0), torch.where(b.mask, behaviour, 0.0),
                                   rtol=0, atol=1e-5)  # fmt: skip
        assert torch.equal(b.extras["sis_topk_ids"], top.indices)  # the envelope of the behaviour policy
        if gen.lag:  # the current policy of the step is another one
            probe.load_state_dict(versions[t])
            with torch.no_grad():
                current, _ = token_logprobs(probe, b.prompt_ids, b.prompt_mask, b.response_ids, b.mask)
            assert float((current - behaviour)[b.mask].abs().max()) > 1e-3
    assert history[0]["sis/accept_rate"] == 1.0 and min(h["sis/accept_rate"] for h in history[2:]) < 1.0


def test_resume_with_pending_batches_reproduces_an_uninterrupted_run(tmp_path: Path) -> None:
    raw = _raw(checkpoint__every=2, checkpoint__keep=5)
    full = build_trainer(config_from_dict(raw), tmp_path / "full")
    full.fit()
    interrupted = build_trainer(config_from_dict(raw), tmp_path / "resumed")
    interrupted.fit(stop_after=3)
    ckpt = latest_checkpoint(tmp_path / "resumed" / "checkpoints")
    assert ckpt is not None and ckpt.name == "step_000002"
    assert [p["step"] for p in load_state(ckpt)["pending"]] == [2, 3]  # generated before the checkpoint
    resumed = build_trainer(config_from_dict(raw), tmp_path / "resumed", resume=True)
    resumed.fit()
    a, b = _rows(tmp_path / "full"), _rows(tmp_path / "resumed")
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5] and a == b
    assert len({r["reward_mean"] for r in a}) > 1  # the runs are not trivially constant
    for p, q in zip(full.policy.parameters(), resumed.policy.parameters(), strict=True):
        assert torch.equal(p, q)


KILLED = textwrap.dedent(
    """
    import json, sys, time, torch
    from posttrain.llm.config import config_from_dict
    from posttrain.llm.run import build_trainer
    raw, run = json.loads(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(int(sys.argv[3]))  # the test process's: float32 reductions then match bit for bit
    trainer = build_trainer(config_from_dict(raw), run)
    trainer.fit(on_step=lambda m: time.sleep(0.5 if m["step"] < 3 else 600))  # hang after step 3's checkpoint
    """
)


@pytest.mark.slow
def test_kill_9_then_resume_reproduces_an_uninterrupted_run(tmp_path: Path) -> None:
    raw = _raw(checkpoint__every=1, checkpoint__keep=2)
    run = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    proc = subprocess.Popen([sys.executable, "-c", KILLED, json.dumps(raw), str(run), str(torch.get_num_threads())], env=env,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not (run / "checkpoints" / "step_000003").is_dir():
            assert proc.poll() is None and time.monotonic() < deadline, "the run died or never reached step 3"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    resumed = build_trainer(config_from_dict(raw), run, resume=True)
    assert resumed.step == 3 and [g.step for g in resumed.rollouts.queue] == [3, 4]
    resumed.fit()
    full = build_trainer(config_from_dict(raw), tmp_path / "full")
    full.fit()
    assert _rows(run) == _rows(tmp_path / "full")
    for p, q in zip(full.policy.parameters(), resumed.policy.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"rollout__branching": {"branches": 1}}, "rollout.branching: not supported with rollout.staleness"),
        ({"rollout__replay": {}, "algorithm__method": "sis"}, "rollout.replay: not supported with rollout.staleness"),
        ({"rollout__asynchronous": True, "algorithm__method": "sis"}, "rollout.asynchronous: method 'sis'"),
        ({"rollout__asynchronous": True, "rollout__staleness": 0}, "rollout.staleness: rollout.asynchronous needs"),
        ({"rollout__asynchronous": True, "rollout__engine": "vllm"}, "rollout.asynchronous: supports"),
        ({"rollout__asynchronous": True, "model__lora": {}}, "model.lora: not supported with rollout.asynchronous"),
        ({"rollout__staleness": -1}, "rollout.staleness"),
    ],
)
def test_config_refuses_what_a_lag_does_not_support(over: dict[str, Any], message: str) -> None:
    with pytest.raises(DomainError, match=message):
        config_from_dict(_raw(**over))
