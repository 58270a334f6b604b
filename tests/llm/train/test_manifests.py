"""A checkpoint is trusted only through a valid manifest; a bad one sets it aside, never raises or reads outside.

Findings covered: a checkpoint without ``checksums.json`` treated as intact; manifests of the wrong shape
(``[]``, ``null``, ``{"state.pt": 5}``) raising AttributeError/TypeError; entries with ``../`` or an
absolute path reading files outside the checkpoint; a symlink out of it; an unlisted weight file (loaded
by the ``*.safetensors`` glob) passing unchecked.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from posttrain.llm.train.checkpoint import intact_checkpoint
from posttrain.llm.train.rundir import CHECKSUMS, RunDirWarning, verify_checksums, write_checksums


def _checkpoint(root: Path, step: int, payload: bytes = b"weights") -> Path:
    ckpt = root / f"step_{step:06d}"
    (ckpt / "model").mkdir(parents=True)
    (ckpt / "model" / "model.safetensors").write_bytes(payload)
    (ckpt / "state.pt").write_bytes(b"state")
    write_checksums(ckpt)
    return ckpt


def test_an_intact_manifest_verifies(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, 1)
    assert verify_checksums(ckpt) is None
    table = json.loads((ckpt / CHECKSUMS).read_text())
    assert sorted(table) == ["model/model.safetensors", "state.pt"]


def test_a_missing_manifest_is_a_reason_not_a_pass(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, 1)
    (ckpt / CHECKSUMS).unlink()
    assert verify_checksums(ckpt) == f"no {CHECKSUMS}"


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        ("[]", "expected a mapping"),
        ("null", "expected a mapping"),
        ('"x"', "expected a mapping"),
        ("{}", "lists no file"),
        ('{"state.pt": 5}', "expected [size, sha256]"),
        ('{"state.pt": [5]}', "expected [size, sha256]"),
        ('{"state.pt": [-1, "' + "0" * 64 + '"]}', "expected [size, sha256]"),
        ('{"state.pt": [true, "' + "0" * 64 + '"]}', "expected [size, sha256]"),
        ('{"state.pt": [5, "zz"]}', "expected [size, sha256]"),
        ('{"state.pt": [5, null]}', "expected [size, sha256]"),
        ('{"../outside": [1, "' + "0" * 64 + '"]}', "outside the directory"),
        ('{"model/../../outside": [1, "' + "0" * 64 + '"]}', "outside the directory"),
        ('{"/etc/hostname": [1, "' + "0" * 64 + '"]}', "outside the directory"),
        ('{"": [1, "' + "0" * 64 + '"]}', "outside the directory"),
        ("{not json", "unreadable"),
    ],
)
def test_a_manifest_of_the_wrong_shape_is_a_reason(tmp_path: Path, manifest: str, reason: str) -> None:
    ckpt = _checkpoint(tmp_path, 1)
    (tmp_path / "outside").write_bytes(b"x")
    (ckpt / CHECKSUMS).write_text(manifest)
    got = verify_checksums(ckpt)
    assert got is not None and reason in got, got


def test_a_symlink_out_of_the_checkpoint_is_refused(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, 1)
    elsewhere = tmp_path / "elsewhere.safetensors"
    elsewhere.write_bytes(b"weights")
    (ckpt / "model" / "model.safetensors").unlink()
    (ckpt / "model" / "model.safetensors").symlink_to(elsewhere)  # same bytes, same digest
    got = verify_checksums(ckpt)
    assert got is not None and "symbolic link" in got, got
    ckpt2 = _checkpoint(tmp_path, 2)
    os.replace(ckpt2 / "model", tmp_path / "model2")
    (ckpt2 / "model").symlink_to(tmp_path / "model2", target_is_directory=True)
    got = verify_checksums(ckpt2)
    assert got is not None and "symbolic link" in got, got


def test_an_unlisted_file_is_refused(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, 1)
    (ckpt / "model" / "model-00002-of-00002.safetensors").write_bytes(b"planted")  # the loader's glob reads it
    got = verify_checksums(ckpt)
    assert got is not None and "model/model-00002-of-00002.safetensors is not in" in got, got


@pytest.mark.parametrize("damage", ["remove", "[]", "null", '{"state.pt": 5}', "flip-without-manifest"])
def test_intact_checkpoint_sets_aside_a_bad_manifest_and_falls_back(tmp_path: Path, damage: str) -> None:
    _checkpoint(tmp_path, 1)
    newest = _checkpoint(tmp_path, 2)
    if damage == "remove":
        (newest / CHECKSUMS).unlink()
    elif damage == "flip-without-manifest":
        (newest / CHECKSUMS).unlink()
        (newest / "model" / "model.safetensors").write_bytes(b"wEights")
    else:
        (newest / CHECKSUMS).write_text(damage)
    with pytest.warns(RunDirWarning, match=r"step_000002.*falling back"):
        assert intact_checkpoint(tmp_path) == tmp_path / "step_000001"  # read only: nothing renamed
    assert newest.is_dir()
    with pytest.warns(RunDirWarning, match=r"step_000002.*set aside"):
        assert intact_checkpoint(tmp_path, set_aside_corrupt=True) == tmp_path / "step_000001"
    assert not newest.exists() and (tmp_path / ".corrupt-step_000002").is_dir()
