"""Asynchronous rollouts (``rollout.asynchronous``): a worker process generates while the trainer updates.

The worker (``torch.multiprocessing``, spawn) holds its own copy of the policy, built from the policy's HF
config, and an HF engine on it; it runs the trainer's own `RolloutMaker` on the data stream from the trainer's
position, one batch per training step, and puts each batch, stamped with the version of the weights that
generated it, on a queue of at most ``s = rollout.staleness`` batches. Weight sync: after every step the
trainer copies its weights into a shared-memory buffer and bumps the version (one lock); before each batch
the worker loads the newest weights. The worker starts the batch of step ``j`` only once the version is at
least ``j - s``, so every batch's lag (``step - version``, logged as ``rollout/lag``) is at most ``s``, and it
is at least 0: the weights it samples with are never newer than the step's policy. The lag of a batch
depends on timing (generation faster than training: ``s``); problems and sampling seeds follow the step a
batch is for, as in the synchronous loop.

Shutdown: the trainer closes the worker when `fit` ends, returns or raises (``KeyboardInterrupt`` on
Ctrl-C included): a stop event, the queue drained, ``join``, then ``terminate`` / ``kill`` if it has not
exited. The worker ignores SIGINT (Ctrl-C reaches the whole process group; the trainer decides), exits
when its parent process is gone, and an exception in it reaches the trainer's next `AsyncRollouts.next`
with the worker's traceback. A checkpoint holds no in-flight batch: the data stream's state saved is the
one after the last batch trained on, so a resumed run regenerates the next batches from there with the
resumed weights (resumable, not bit-exact: the lags depend on timing).

Supported: one process (no data parallel), the HF engine, a full-weight policy (no LoRA); methods that read
a forward of the behaviour policy (SIS's envelope, OPD²'s top-K) are refused at config load. On a GPU the
design is the same with the worker's engine on its own device: the vLLM engine in the worker, synced from
the shared buffer (`VLLMEngine.sync_weights`) -- not implemented (refused at load).
"""

from __future__ import annotations

import io
import os
import queue
import random
import signal
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.multiprocessing as mp

from posttrain.llm.rollout.engine import HFEngine, SamplingConfig
from posttrain.llm.train.checkpoint import as_tuple
from posttrain.llm.train.pending import Generated

__all__ = ["AsyncRollouts", "WorkerSpec"]

_POLL_S = 0.2
"""Seconds between the worker's checks of the stop event and of its parent while it waits."""


@dataclass(frozen=True)
class WorkerSpec:
    """What the worker builds its model, engine and `RolloutMaker` from (picklable)."""

    model_config: Any
    dtype: torch.dtype
    tokenizer: Any
    task: Any
    sampling: SamplingConfig
    compile_decode: bool
    prompts_per_step: int
    seed: int
    chat_template: bool
    system: str | None
    n: int
    staleness: int
    start_step: int
    rng_state: Any
    threads: int
    parent: int


def _dumps(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def _loads(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def _worker(spec: WorkerSpec, weights: dict[str, torch.Tensor], version: Any, cond: Any, out: Any, stop: Any) -> None:
    """The worker process: generate the batches of steps ``start_step, start_step + 1, ...`` until stopped."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the trainer stops the worker
    try:
        from transformers import AutoModelForCausalLM

        from posttrain.llm.train.pending import RolloutMaker

        torch.set_num_threads(spec.threads)
        model = AutoModelForCausalLM.from_config(spec.model_config, dtype=spec.dtype).eval()
        engine = HFEngine(model, pad_id=spec.tokenizer.pad_token_id, eos_id=spec.tokenizer.eos_token_id,
                          sampling=spec.sampling, compile_decode=spec.compile_decode)  # fmt: skip
        maker = RolloutMaker(spec.tokenizer, spec.task, engine, spec.prompts_per_step, spec.seed,
                             chat_template=spec.chat_template, system=spec.system)  # fmt: skip
        rng, step, loaded = random.Random(), spec.start_step, -1
        rng.setstate(spec.rng_state)
        alive = lambda: not stop.is_set() and os.getppid() == spec.parent  # noqa: E731
        while alive():
            with cond:  # the batch of `step` needs weights of version >= step - staleness
                while alive() and version.value < step - spec.staleness:
                    cond.wait(_POLL_S)
                if not alive():
                    break
                if version.value != loaded:
                    model.load_state_dict(weights)
                    loaded = version.value
            generated = maker(rng, step, loaded, spec.n)
            item = ("batch", _dumps({**generated.state(), "rng_state": generated.rng_state}))
            while alive():
                try:
                    out.put(item, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue
            step += 1
    except BaseException:  # every failure goes to the trainer
        out.put(("error", traceback.format_exc()))


class AsyncRollouts:
    """The trainer's side of the worker: `next` (the batch of a step), `after_step` (weight sync), `close`.

    Args:
        policy: the bare HF policy (its config and weights are copied). tokenizer, task: as the trainer's.
        sampling: the run's sampling settings. staleness: the largest lag ``s >= 1`` (also the queue's bound).
        n: responses per prompt the engine samples. prompts_per_step, seed: the run's G and seed.
        chat_template, system: prompt encoding. compile_decode: the HF engine's option.
    """

    def __init__(
        self,
        policy: Any,
        *,
        tokenizer: Any,
        task: Any,
        sampling: SamplingConfig,
        staleness: int,
        n: int,
        prompts_per_step: int,
        seed: int,
        chat_template: bool = False,
        system: str | None = None,
        compile_decode: bool = False,
    ) -> None:
        if int(staleness) < 1:
            raise ValueError(f"staleness: the asynchronous mode needs a maximum staleness >= 1, got {staleness!r}")
        self.policy, self.staleness = policy, int(staleness)
        self._spec: Callable[[int, Any], WorkerSpec] = lambda start, rng_state: WorkerSpec(
            policy.config, next(policy.parameters()).dtype, tokenizer, task, sampling, compile_decode,
            prompts_per_step, seed, chat_template, system, int(n), self.staleness, start, rng_state,
            max(1, torch.get_num_threads() // 2), os.getpid(),
        )  # fmt: skip
        self.process: Any = None
        self.lags: list[int] = []

    @property
    def pid(self) -> int | None:
        """The worker's process id while it runs."""
        return None if self.process is None else self.process.pid

    def _start(self, step: int, rng: random.Random) -> None:
        ctx = mp.get_context("spawn")
        self._weights = {k: v.detach().cpu().clone().share_memory_() for k, v in self.policy.state_dict().items()}
        self._version = ctx.Value("q", step, lock=False)
        self._cond = ctx.Condition()
        self._stop = ctx.Event()
        self._out = ctx.Queue(maxsize=self.staleness)
        args = (self._spec(step, rng.getstate()), self._weights, self._version, self._cond, self._out, self._stop)
        self.process = ctx.Process(target=_worker, args=args, name="posttrain-rollout", daemon=True)
        self.process.start()

    def next(self, step: int, generate: Callable[[int], Generated], rng: random.Random) -> Generated:
        """The batch of ``step`` from the worker (started at the first call, from ``rng``'s state); ``rng`` is
        then set to the data stream's state after that batch (``generate`` is not used: the worker generates)."""
        if self.process is None:
            self._start(step, rng)
        while True:
            try:
                kind, payload = self._out.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.process.is_alive():
                    raise RuntimeError(f"rollout worker exited with code {self.process.exitcode}") from None
        if kind == "error":
            raise RuntimeError(f"rollout worker failed:\n{payload}")
        state = _loads(payload)
        generated = Generated.from_state(state)
        if generated.step != step or not 0 <= generated.lag <= self.staleness:
            raise RuntimeError(
                f"rollout worker: batch for step {generated.step} (version {generated.version}) at step {step}, "
                f"maximum staleness {self.staleness}"
            )
        rng.setstate(as_tuple(state["rng_state"]))
        self.lags.append(generated.lag)
        return generated

    def after_step(self, policy: Any, version: int) -> None:
        """Copy the policy's weights (``version`` completed steps) into the shared buffer for the worker."""
        if self.process is None:
            return
        with self._cond:
            with torch.no_grad():
                for name, value in policy.state_dict().items():
                    self._weights[name].copy_(value.detach())
            self._version.value = int(version)
            self._cond.notify_all()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the worker and wait for it (terminate, then kill, if it does not exit within ``timeout_s``)."""
        if self.process is None:
            return
        process, self.process = self.process, None
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        try:
            while True:
                self._out.get_nowait()  # a worker blocked on a full queue can then see the stop event
        except (queue.Empty, OSError, ValueError):
            pass
        process.join(timeout_s)
        if process.is_alive():
            process.terminate()
            process.join(5.0)
        if process.is_alive():
            process.kill()
            process.join()
        self._out.cancel_join_thread()
        self._out.close()

    def state_dict(self) -> list[dict[str, Any]]:
        """Nothing pending is saved (the worker regenerates from the data stream's saved state)."""
        return []

    def load_state_dict(self, state: Any) -> None:
        return None
