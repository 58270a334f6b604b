"""``rollout.asynchronous``: a worker process generates while the trainer updates. Its semantics on CPU: every
batch's lag is within the maximum staleness, the worker samples with the synced weights of the version it
reports, and it stops with the run: at the end, on an error in the worker and on Ctrl-C, leaving no process."""

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

from posttrain.llm.config import config_from_dict
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.run import build_trainer
from posttrain.llm.train.async_rollout import AsyncRollouts
from tests.llm.train.test_staleness import _raw

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")

pytestmark = pytest.mark.slow  # each test starts a worker process (a fresh interpreter importing torch)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
    out, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - out
        out |= frontier
    return out


def _worker_pids(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pid of every worker started from now on."""
    pids: list[int] = []
    start = AsyncRollouts._start

    def recording(self: AsyncRollouts, step: int, rng: Any) -> None:
        start(self, step, rng)
        pids.append(self.process.pid)

    monkeypatch.setattr(AsyncRollouts, "_start", recording)
    return pids


def test_lags_are_bounded_and_batches_come_from_the_synced_weights(tmp_path: Path, monkeypatch: Any) -> None:
    pids = _worker_pids(monkeypatch)
    trainer = build_trainer(config_from_dict(_raw(rollout__asynchronous=True, optim__steps=6)), tmp_path / "run")
    generated, versions = [], [copy.deepcopy(trainer.policy.state_dict())]

    def on_step(metrics: dict[str, Any]) -> None:
        generated.append(trainer.generated)
        versions.append(copy.deepcopy(trainer.policy.state_dict()))

    history = trainer.fit(on_step=on_step)
    lags = [g.lag for g in generated]
    assert [h["rollout/lag"] for h in history] == lags and all(0 <= lag <= 2 for lag in lags)
    assert [g.step for g in generated] == list(range(6)) and generated[-1].version >= 3  # >= 3 syncs were used
    probe = copy.deepcopy(trainer.policy)
    for gen in generated:
        b = gen.batch
        probe.load_state_dict(versions[gen.version])
        with torch.no_grad():
            logp, _ = token_logprobs(probe, b.prompt_ids, b.prompt_mask, b.response_ids, b.mask)
        gap = float((logp - b.logp_old)[b.mask].abs().max())
        assert gap < 1e-4, (gen.step, gen.version, gap)  # sampled with exactly that version's weights
        if gen.version:
            probe.load_state_dict(versions[gen.version - 1])
            with torch.no_grad():
                before, _ = token_logprobs(probe, b.prompt_ids, b.prompt_mask, b.response_ids, b.mask)
            assert float((before - b.logp_old)[b.mask].abs().max()) > 1e-3  # ... and not the previous ones
    assert len(pids) == 1 and not _alive(pids[0]) and trainer.rollouts.pid is None  # stopped when fit returned


def test_an_error_in_the_worker_stops_the_run_and_the_worker(tmp_path: Path, monkeypatch: Any) -> None:
    pids = _worker_pids(monkeypatch)
    raw = _raw(rollout__asynchronous=True)
    raw["data"]["reward"] = "tests.llm.train._rewards:fails_on_batches"
    trainer = build_trainer(config_from_dict(raw), tmp_path / "run")
    with pytest.raises(RuntimeError, match="failed on purpose"):  # the worker's traceback reaches the trainer
        trainer.fit()
    assert len(pids) == 1
    deadline = time.monotonic() + 30
    while _alive(pids[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pids[0]) and trainer.step == 0


CTRL_C = textwrap.dedent(
    """
    import json, sys, torch
    from posttrain.llm.config import config_from_dict
    from posttrain.llm.run import build_trainer
    if __name__ == "__main__":
        torch.set_num_threads(1)
        trainer = build_trainer(config_from_dict(json.loads(sys.argv[1])), sys.argv[2])
        trainer.fit(on_step=lambda m: print("STEP", m["step"], trainer.rollouts.pid, flush=True))
    """
)


def test_ctrl_c_stops_the_trainer_and_leaves_no_process(tmp_path: Path) -> None:
    script = tmp_path / "run_async.py"
    script.write_text(CTRL_C)
    raw = _raw(rollout__asynchronous=True, optim__steps=100_000)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    proc = subprocess.Popen(
        [sys.executable, str(script), json.dumps(raw), str(tmp_path / "run")], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,  # its own process group, as a terminal's job
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the first step is done: the worker runs
        assert line.startswith("STEP 1 "), line + (proc.stderr.read() if proc.stderr else "")
        worker = int(line.split()[2])
        family = _descendants(proc.pid)
        assert worker in family and _alive(worker)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: SIGINT to the whole process group
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in family) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in family if _alive(pid)]  # the worker (and multiprocessing's helpers) ended
