"""The records archive: packing and restoring finished runs, and a restored source without weights running again."""

from __future__ import annotations

import json
import math
from pathlib import Path

from posttrain.real_checks.archive import cost, drop_weightless, pack, restore
from posttrain.real_checks.arm_table import ARMS
from posttrain.real_checks.arms import PROFILES
from posttrain.real_checks.runs import Runner


def _runner(root: Path) -> Runner:
    return Runner(PROFILES["smoke"], ARMS, root / "smoke")


def _finish(runner: Runner, arm: str, seed: int, **fields: object) -> dict:
    record = {"arm": arm, "seed": seed, "key": runner.key(arm, seed), **fields}
    folder = runner.folder(arm, seed)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "record.json").write_text(json.dumps(record) + "\n")
    return record


def test_a_packed_run_is_found_by_a_runner_on_another_root(tmp_path: Path):
    first, second = _runner(tmp_path / "a"), _runner(tmp_path / "b")
    record = _finish(first, "grpo", 3, eval={"rewards": [[1.0, 0.0]]})
    probe = tmp_path / "a" / "smoke" / "probes" / "add-0123" / "probe.json"
    probe.parent.mkdir(parents=True)
    probe.write_text('{"p0": 0.2}\n')
    (first.folder("es", 3) / "run").mkdir(parents=True)  # an unfinished run: no record, not archived
    archive = tmp_path / "archive"
    added = pack(tmp_path / "a", archive, "smoke")
    assert sorted(added) == sorted([record["key"], "add-0123"])
    bytes_once = sorted((p.name, p.read_bytes()) for p in archive.rglob("*") if p.is_file())
    assert pack(tmp_path / "a", archive, "smoke") == []  # kept once; the same bytes
    assert sorted((p.name, p.read_bytes()) for p in archive.rglob("*") if p.is_file()) == bytes_once
    assert second.cached("grpo", 3) is None
    assert sorted(restore(archive, tmp_path / "b", "smoke")) == sorted(added)
    assert second.cached("grpo", 3) == record and second.cached("es", 3) is None
    assert json.loads((tmp_path / "b" / "smoke" / "probes" / "add-0123" / "probe.json").read_text()) == {"p0": 0.2}
    assert restore(archive, tmp_path / "b", "smoke") == [] and restore(archive, tmp_path / "b", "full") == []


def test_a_source_restored_without_weights_runs_again_before_an_arm_that_reads_them(tmp_path: Path):
    runner = _runner(tmp_path)
    edit = next(name for name, arm in ARMS.items() if arm.source == "grpo")
    _finish(runner, "grpo", 0)
    folder = runner.folder("grpo", 0)
    assert drop_weightless(runner, [("grpo", 0)]) == []  # nothing reads its weights
    _finish(runner, edit, 1)
    _finish(runner, "grpo", 1)
    assert drop_weightless(runner, [(edit, 1)]) == []  # the reader is finished: it needs no weights
    assert drop_weightless(runner, [(edit, 0)]) == [folder.name]
    assert runner.cached("grpo", 0) is None and (folder / "record.archived.json").is_file()
    _finish(runner, "grpo", 0)
    (folder / "final").mkdir()
    assert drop_weightless(runner, [(edit, 0)]) == []  # weights present: the record stands
    assert runner.cached("grpo", 0) is not None


def test_the_archive_cost_counts_each_run_once_from_its_records(tmp_path: Path):
    runner = _runner(tmp_path)
    timings = {"grpo": (600.0, 300.0, 400.0, 100.0), "es": (1200.0, 600.0, 500.0, 200.0)}
    for arm, (train_cpu, eval_cpu, train_s, eval_s) in timings.items():
        _finish(runner, arm, 0, train_cpu_s=train_cpu, eval_cpu_s=eval_cpu, train_s=train_s, eval={"eval_s": eval_s})
    archive = tmp_path / "archive"
    pack(tmp_path, archive, "smoke")
    pack(tmp_path, archive, "smoke")  # packed twice, kept once
    got = cost(archive, "smoke")
    assert got["runs"] == 2
    assert math.isclose(got["cpu_h"], (900.0 + 1800.0) / 3600) and math.isclose(got["wall_h"], (500.0 + 700.0) / 3600)
    assert math.isclose(got["cpu_min_median"], (15.0 + 30.0) / 2)
    assert got["cpu_min_p10"] < got["cpu_min_median"] < got["cpu_min_p90"]
    empty = cost(archive, "full")
    assert empty["runs"] == 0 and empty["cpu_h"] == 0.0 and math.isnan(empty["cpu_min_median"])
