"""Progress of a run that reaches any stream: live bars on a terminal, plain lines everywhere else.

A run goes through phases, each with a timer: ``setup`` (the model build), then for example ``sft``
(the warm-up), ``train`` (RL steps) or ``es`` (ES steps). `RunProgress.step` reports a phase's step and
`RunProgress.ready` says the model is built; entering a phase stops the timer of the one before it. The
setup timer stops when the SFT warm-up reports its first step (that step is counted in the setup: the
warm-up reports steps when they end) or, without a warm-up, when the model is ready.

- On a terminal (``console.is_terminal``): rich progress bars, one per phase, redrawn in place.
- Anywhere else (a file, a pipe, ``nohup``): plain lines, flushed as they are written, so a log shows the
  run while it runs. A phase's first and last steps are always printed, the others at most once per
  ``interval_s`` seconds, with the time per step and an estimate of the time left::

      [   4.1s] setup done in 4.1 s
      [   4.3s] sft 1/20  loss 2.3026
      [   9.0s] sft 20/20  loss 0.4121  (0.24 s/step)
      [  14.2s] train 1/16  reward 0.250  kl -  entropy 0.912  (5.2 s/step, ~1m18s left)
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

__all__ = ["RunProgress", "flat_step_warning", "run_progress", "step_info"]


def _num(value: Any, digits: int = 3) -> str:
    return "-" if value is None or value != value else f"{value:.{digits}f}"


def step_info(metrics: Mapping[str, Any]) -> str:
    """One training step's summary: reward, KL, entropy (``-`` for a value the step did not have), then the share of
    zero-variance groups when the step logged it."""
    info = (
        f"reward {_num(metrics.get('reward_mean'))}  kl {_num(metrics.get('kl'), 4)}  "
        f"entropy {_num(metrics.get('entropy'))}"
    )
    return info + (
        f"  zero-var {_num(metrics['zero_variance_groups'], 2)}" if "zero_variance_groups" in metrics else ""
    )


def flat_step_warning(metrics: Mapping[str, Any]) -> str | None:
    """The one-line warning of a step whose policy gradient was 0 because every group was constant, else None."""
    if not metrics.get("flat_step"):
        return None
    return (
        f"warning: step {metrics['step']}: every group's rewards were equal (zero variance), so every advantage "
        "and the policy gradient were 0; only a KL or entropy term moved the policy"
    )


def _duration(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


@dataclass
class _Phase:
    name: str
    total: int | None
    start: float
    first: int = 0
    done: int = 0
    last_line: float = -1.0
    task: Any = None
    times: list[float] = field(default_factory=list)


class RunProgress:
    """See the module docstring. Use as a context manager (`run_progress`); ``show=False`` prints nothing.

    Args:
        console: where to write (default: standard output); its ``is_terminal`` picks bars or lines.
        show: False prints nothing (``--quiet``).
        interval_s: plain lines: the least time between two lines of one phase (first and last always print).
    """

    def __init__(self, *, console: Console | None = None, show: bool = True, interval_s: float = 10.0) -> None:
        self.console = console or Console()
        self.show = show
        self.live = show and self.console.is_terminal
        self.interval_s = interval_s
        self.t0 = time.monotonic()
        self.phases: dict[str, _Phase] = {}
        self.current: _Phase | None = None
        self._bar: Any = None

    # ------------------------------------------------------------------ output
    def _line(self, text: str) -> None:
        if self.show and not self.live:
            self.console.print(f"[{time.monotonic() - self.t0:7.1f}s] {text}", highlight=False, markup=False,
                               soft_wrap=True)  # fmt: skip
            self.console.file.flush()

    def __enter__(self) -> RunProgress:
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("[bold]{task.description:<5}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.fields[info]}"), console=self.console,
            )  # fmt: skip
            self._bar.__enter__()
        self.enter("setup", None, info="building the model (and the SFT warm-up, if any)")
        return self

    def __exit__(self, *exc: Any) -> None:
        self._end_current()
        if self._bar is not None:
            self._bar.__exit__(*exc)

    # ------------------------------------------------------------------ phases
    def _end_current(self) -> None:
        phase = self.current
        if phase is None:
            return
        self.current = None
        elapsed = time.monotonic() - phase.start
        if self._bar is not None:
            if phase.total is None:
                self._bar.update(phase.task, total=1, completed=1, info="done")
            self._bar.stop_task(phase.task)  # its timer stops here
        if phase.total is None:
            self._line(f"{phase.name} done in {elapsed:.1f} s")

    def enter(self, name: str, total: int | None, *, completed: int = 0, info: str = "") -> None:
        """Begin phase ``name`` (``total`` steps, None: untimed work such as the setup), ending the current one."""
        if self.current is not None and self.current.name == name:
            return
        self._end_current()
        phase = _Phase(name, total, time.monotonic(), first=completed, done=completed)
        if self._bar is not None:
            phase.task = self._bar.add_task(name, total=total, completed=completed, info=info)
        elif total is None and info:
            self._line(f"{name}: {info}")
        self.phases[name], self.current = phase, phase

    def step(self, name: str, completed: int, info: str = "") -> None:
        """Phase ``name`` has ``completed`` steps (entering it if it is not the current phase: that step is then its
        origin, its own duration unknown, and the time per step counts from it)."""
        if self.current is None or self.current.name != name:
            self.enter(name, self.phases[name].total if name in self.phases else None, completed=completed)
        phase = self.current
        assert phase is not None
        now = time.monotonic()
        phase.done = completed
        if self._bar is not None:
            self._bar.update(phase.task, completed=completed, info=info)
            return
        last = phase.total is not None and completed >= phase.total
        if phase.last_line < 0 or last or now - phase.last_line >= self.interval_s:
            phase.last_line = now
            timing = ""
            if completed > phase.first:
                per_step = (now - phase.start) / (completed - phase.first)
                left = (
                    "" if last or phase.total is None else f", ~{_duration(per_step * (phase.total - completed))} left"
                )
                timing = f"({per_step:.2f} s/step{left})"
            of = f"/{phase.total}" if phase.total is not None else ""
            self._line("  ".join(part for part in (f"{name} {completed}{of}", info, timing) if part))

    def ready(self, step: int = 0, name: str = "train") -> None:
        """The model is built: phase ``name`` begins at ``step`` (a resumed run's checkpoint step)."""
        total = self.phases[name].total if name in self.phases else None
        self.enter(name, total, completed=step)
        if total is not None:
            self._line(f"{name}: steps {step + 1}..{total}" if step < total else f"{name}: all {total} steps done")

    def declare(self, name: str, total: int) -> None:
        """Announce phase ``name``'s step count before it starts (its first `step` then enters it)."""
        self.phases.setdefault(name, _Phase(name, total, time.monotonic()))

    # ------------------------------------------------------------------ the trainer's callbacks
    def sft_step(self, step: int, loss: float) -> None:
        """``on_sft_step`` of `posttrain.llm.run.build_trainer`."""
        self.step("sft", step, f"loss {loss:.4f}")

    def train_step(self, metrics: Mapping[str, Any]) -> None:
        """``on_step`` of `posttrain.llm.train.trainer.Trainer.fit`."""
        self.step("train", int(metrics["step"]), step_info(metrics))
        warning = flat_step_warning(metrics)
        if warning is not None and self.show:
            if self.live:
                self.console.print(warning, highlight=False, markup=False, soft_wrap=True)
            else:
                self._line(warning)


@contextmanager
def run_progress(
    *, steps: int, sft_steps: int = 0, show: bool = True, console: Console | None = None, interval_s: float = 10.0
) -> Iterator[RunProgress]:
    """A `RunProgress` for a training run of ``steps`` RL steps after ``sft_steps`` SFT steps."""
    with RunProgress(console=console, show=show, interval_s=interval_s) as progress:
        if sft_steps:
            progress.declare("sft", sft_steps)
        progress.declare("train", steps)
        yield progress
