"""A run a person can watch: progress reaches any stream as it happens, timers stop with their phase, curves.

Findings covered: with stdout to a file or ``nohup`` nothing was printed until the end (a SmolLM2 log
stayed empty for 21 minutes); the setup timer kept running through the SFT warm-up; no plot of a run
without TensorBoard.
"""

from __future__ import annotations

import dataclasses
import io
import json
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from posttrain.llm.train import curves
from posttrain.llm.train.progress import RunProgress, run_progress

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")


def _plain() -> tuple[Console, io.StringIO]:
    stream = io.StringIO()
    return Console(file=stream, force_terminal=False, width=120), stream


def test_plain_lines_are_written_as_the_run_goes() -> None:
    console, stream = _plain()
    with run_progress(steps=3, sft_steps=2, console=console, interval_s=1e9) as progress:
        assert "setup: building the model" in stream.getvalue()
        progress.sft_step(1, 2.5)
        text = stream.getvalue()
        assert "setup done in" in text and "sft 1/2  loss 2.5000" in text  # the setup timer stopped here
        progress.sft_step(2, 1.25)
        assert "sft 2/2  loss 1.2500" in stream.getvalue()
        progress.ready(0)
        progress.train_step({"step": 1, "reward_mean": 0.25, "kl": None, "entropy": 0.5})
        assert "train 1/3  reward 0.250  kl -  entropy 0.500" in stream.getvalue()
        progress.train_step({"step": 2, "reward_mean": 0.5, "kl": 0.01, "entropy": 0.4})
        assert "train 2/3" not in stream.getvalue()  # within interval_s of the previous line
        progress.train_step({"step": 3, "reward_mean": 0.75, "kl": 0.02, "entropy": 0.3})
        assert "train 3/3" in stream.getvalue()  # a phase's last step always prints
    assert "left)" in stream.getvalue() and "s/step" in stream.getvalue()


def test_live_bars_stop_each_timer_when_its_phase_ends() -> None:
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=True, width=120)
    with run_progress(steps=2, sft_steps=2, console=console) as progress:
        assert progress.live
        bar = progress._bar
        setup = progress.phases["setup"].task
        assert bar.tasks[setup].stop_time is None
        progress.sft_step(1, 2.0)
        assert bar.tasks[setup].stop_time is not None  # not running through the warm-up any more
        sft = progress.phases["sft"].task
        progress.sft_step(2, 1.0)
        progress.ready(0)
        assert bar.tasks[sft].stop_time is not None
        progress.train_step({"step": 1, "reward_mean": 0.5, "kl": 0.0, "entropy": 1.0})
        assert bar.tasks[progress.phases["train"].task].completed == 1


def test_a_resumed_run_counts_from_its_checkpoint() -> None:
    console, stream = _plain()
    with RunProgress(console=console, interval_s=1e9) as progress:
        progress.declare("train", 10)
        progress.ready(6)
        progress.train_step({"step": 7, "reward_mean": 0.5, "kl": 0.0, "entropy": 1.0})
    text = stream.getvalue()
    assert "setup done in" in text and "train: steps 7..10" in text and "train 7/10" in text


def test_quiet_prints_nothing() -> None:
    console, stream = _plain()
    with run_progress(steps=2, console=console, show=False) as progress:
        progress.ready(0)
        progress.train_step({"step": 1, "reward_mean": 0.5, "kl": 0.0, "entropy": 1.0})
    assert stream.getvalue() == ""


def _small_run(tmp_path: Path, *, every: int) -> Any:
    from posttrain.llm.config import LoggingConfig
    from tests.llm._lift import small_config

    cfg = small_config(steps=2, checkpoint={"every": every, "keep": 1})
    return dataclasses.replace(cfg, logging=LoggingConfig(progress=True))


def test_train_writes_progress_lines_and_curves_when_stdout_is_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib", reason="curves need the [plots] extra")
    from posttrain.llm.run import train

    drawn: list[int] = []
    real = curves.write_curves

    def counted(run_dir: Any) -> Any:
        drawn.append(len((Path(run_dir) / "metrics.jsonl").read_text().splitlines()))  # rows drawn
        return real(run_dir)

    monkeypatch.setattr(curves, "write_curves", counted)
    assert not sys.stdout.isatty()
    train(_small_run(tmp_path, every=1), tmp_path / "run")
    out = capsys.readouterr().out
    assert "setup done in" in out and "train 1/2" in out and "train 2/2" in out, out
    assert drawn == [1, 2, 2]  # at each checkpoint (every=1), then at the end
    png = (tmp_path / "run" / curves.CURVES).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24])[0] > 200


def test_curves_draw_the_logged_quantities_and_leave_gaps(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="curves need the [plots] extra")
    rows = [
        {"step": s, "reward_mean": 0.1 * s, "reward_std": 0.05, "kl": None, "entropy": 1.0 / s, "response_len": 5 + s}
        | ({"eval/greedy_accuracy": 0.2 * s, "eval/pass@1": 0.1 * s} if s % 2 == 0 else {})
        for s in range(1, 7)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 7, "rew')
    points = curves.curve_points(tmp_path)
    assert list(points) == [
        "reward (mean, band: ± std)",
        "entropy (nats / token)",
        "response length (tokens)",
        "held-out accuracy",
    ]
    assert points["held-out accuracy"]["eval/greedy_accuracy"] == [(2, 0.4), (4, 0.8), (6, 1.2000000000000002)]
    assert curves.write_curves(tmp_path) == tmp_path / curves.CURVES
    assert (tmp_path / curves.CURVES).read_bytes()[:4] == b"\x89PNG"
    assert curves.write_curves(tmp_path / "nothing-here") is None


def test_without_matplotlib_one_warning_and_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n')
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.ticker"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(curves, "_warned", False)
    with pytest.warns(UserWarning, match="matplotlib is not installed"):
        assert curves.write_curves(tmp_path) is None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert curves.write_curves(tmp_path) is None  # the second time: silent
    assert not (tmp_path / curves.CURVES).exists()
