"""A run writes only inside its directory, and a resume reads its metrics defensively.

Findings covered: a dangling ``OUT/metrics.jsonl -> elsewhere`` not seen as an existing run (training then
appended to the link's target); ``--overwrite`` and ``--resume`` following links out of the run; a
temporary file name planted as a link; ``metrics.jsonl`` lines that are not objects or have a non-integer
step crashing ``--resume`` with a traceback.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from posttrain.llm.train.checkpoint import truncate_metrics
from posttrain.llm.train.rundir import (
    RunDirError,
    RunDirWarning,
    append_jsonl,
    atomic_write_text,
    check_run_dir,
    remove_run_files,
)


@pytest.fixture()
def elsewhere(tmp_path: Path) -> Path:
    target = tmp_path / "elsewhere"
    target.mkdir()
    return target


def test_a_dangling_link_is_an_existing_run_not_an_append_target(tmp_path: Path, elsewhere: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").symlink_to(elsewhere / "metrics.jsonl")  # dangling
    with pytest.raises(RunDirError, match=r"already holds a run \(metrics\.jsonl\)"):
        check_run_dir(out, None, resume=False, overwrite=False)
    assert not (elsewhere / "metrics.jsonl").exists()


@pytest.mark.parametrize("name", ["metrics.jsonl", "checkpoints", "eval.jsonl"])
def test_resume_refuses_a_run_file_that_is_a_link(tmp_path: Path, elsewhere: Path, name: str) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("seed: 0\n")
    (out / name).symlink_to(elsewhere / name)
    with pytest.raises(RunDirError, match=rf"{name} is a symbolic link"):
        check_run_dir(out, None, resume=True, overwrite=False)


def test_overwrite_removes_links_never_their_targets(tmp_path: Path, elsewhere: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (elsewhere / "metrics.jsonl").write_text('{"step": 1}\n')
    (elsewhere / "checkpoints").mkdir()
    (elsewhere / "checkpoints" / "keep.txt").write_text("not the run's")
    (out / "metrics.jsonl").symlink_to(elsewhere / "metrics.jsonl")
    (out / "checkpoints").symlink_to(elsewhere / "checkpoints", target_is_directory=True)
    assert check_run_dir(out, None, resume=False, overwrite=True) == {}
    remove_run_files(out)  # what claim_run_dir does with overwrite
    assert not (out / "metrics.jsonl").is_symlink() and not (out / "checkpoints").exists()
    assert (elsewhere / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert (elsewhere / "checkpoints" / "keep.txt").read_text() == "not the run's"


def test_atomic_write_does_not_follow_a_planted_temporary_link(tmp_path: Path, elsewhere: Path) -> None:
    victim = elsewhere / "victim"
    victim.write_text("untouched")
    (tmp_path / f".tmp-config.yaml-{os.getpid()}").symlink_to(victim)
    atomic_write_text(tmp_path / "config.yaml", "seed: 0\n")
    assert (tmp_path / "config.yaml").read_text() == "seed: 0\n" and victim.read_text() == "untouched"


def test_append_jsonl_refuses_a_link(tmp_path: Path, elsewhere: Path) -> None:
    append_jsonl(tmp_path / "eval.jsonl", {"a": 1})
    append_jsonl(tmp_path / "eval.jsonl", {"a": 2})
    assert [json.loads(ln)["a"] for ln in (tmp_path / "eval.jsonl").read_text().splitlines()] == [1, 2]
    (tmp_path / "linked.jsonl").symlink_to(elsewhere / "target.jsonl")
    with pytest.raises(RunDirError, match="symbolic link"):
        append_jsonl(tmp_path / "linked.jsonl", {"a": 3})
    assert not (elsewhere / "target.jsonl").exists()


def test_bad_metrics_lines_are_set_aside_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    bad = ["[1, 2]", '"text"', "null", '{"step": "2"}', '{"step": 2.5}', '{"step": true}', '{"x": 1}',
           '{"step": -1}', '{"step": 1e400}']  # fmt: skip
    good = ['{"step": 1, "x": 1}', '{"step": 2, "x": 2}', '{"step": 3, "x": 3}']
    path.write_text("\n".join([good[0], *bad, good[1], good[2], '{"step": 4, "x"']) + "\n")
    with pytest.warns(RunDirWarning, match=r"set aside 10 line\(s\)") as record:
        truncate_metrics(path, 2)
    assert "metrics.set-aside.jsonl" in str(record[0].message)
    assert path.read_text().splitlines() == good[:2]
    assert (tmp_path / "metrics.set-aside.jsonl").read_text().splitlines() == [*bad, '{"step": 4, "x"']


def test_an_atomic_directory_replaces_a_link_never_its_target(tmp_path: Path, elsewhere: Path) -> None:
    from posttrain.llm.train.rundir import atomic_directory

    (elsewhere / "keep.txt").write_text("not the run's")
    (tmp_path / "initial").symlink_to(elsewhere, target_is_directory=True)
    with atomic_directory(tmp_path / "initial") as tmp:
        (tmp / "config.json").write_text("{}")
    assert not (tmp_path / "initial").is_symlink() and (tmp_path / "initial" / "config.json").is_file()
    assert (elsewhere / "keep.txt").read_text() == "not the run's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "initial"]  # no .old- leftover
