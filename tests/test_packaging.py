"""Packaging: the lean core imports without the extras, the version has one source, the CLI names a missing extra."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import posttrain
from posttrain._extras import EXTRA_OF_MODULE

ROOT = Path(__file__).resolve().parents[1]

# Every module here must import with the core dependencies alone (torch, numpy, scipy, jaxtyping):
# the estimators (what verl's workers import through the plug-in), the simulators, the verl plug-in.
LEAN_PACKAGES = ("posttrain.estimators", "posttrain.simulators")
LEAN_MODULES = ("posttrain", "posttrain.llm.adapters.verl", "posttrain.llm.adapters.convert")

_BLOCKER = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # as if not installed: import raises ModuleNotFoundError, find_spec gives None
"""


def _run_blocked(blocked: set[str], body: str, *args: str) -> subprocess.CompletedProcess[str]:
    code = _BLOCKER + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code, ",".join(sorted(blocked)), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def _optional_modules() -> set[str]:
    """Every module an extra provides (hypothesis aside: the test runner itself imports it)."""
    return set(EXTRA_OF_MODULE) - {"hypothesis"}


@pytest.mark.slow
def test_lean_core_imports_without_any_extra() -> None:
    body = """
    import importlib, pkgutil
    names = list(sys.argv[2].split(","))
    for pkg in sys.argv[3].split(","):
        mod = importlib.import_module(pkg)
        names += [m.name for m in pkgutil.walk_packages(mod.__path__, pkg + ".")]
    for name in names:
        importlib.import_module(name)
    print(len(names))
    """
    out = _run_blocked(_optional_modules(), body, ",".join(LEAN_MODULES), ",".join(LEAN_PACKAGES))
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) > 10  # the walk found the estimator and simulator modules


def test_the_blocker_blocks() -> None:
    """The check above can fail: a module that needs an extra is refused under the same blocker."""
    out = _run_blocked({"cvxpy"}, "import posttrain.theory.dpo_design_solvers\n")
    assert out.returncode != 0 and "cvxpy" in out.stderr


def test_cli_without_its_extra_names_it_in_one_line() -> None:
    out = _run_blocked({"typer"}, "import runpy\nrunpy.run_module('posttrain.cli', run_name='__main__')\n")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "posttrain: this needs 'typer', from the [cli] extra: pip install 'posttrain[cli]' (or [full])"
    ]


def test_cli_command_needing_a_missing_extra_names_it_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from posttrain import cli

    def command() -> None:  # what `posttrain check 18` does without cvxpy
        raise ModuleNotFoundError("No module named 'cvxpy'", name="cvxpy")

    monkeypatch.setattr(cli, "app", command)
    monkeypatch.setitem(cli._STATE, "debug", False)  # another test in this process may have run --debug
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert str(exit_info.value).startswith("posttrain: this needs 'cvxpy', from the [theory] extra")
    monkeypatch.setattr(cli, "app", lambda: __import__("not_an_extra_module"))
    with pytest.raises(ModuleNotFoundError, match="not_an_extra_module"):  # no extra provides it: re-raised
        cli.main()


def test_version_has_one_source() -> None:
    try:
        installed = importlib.metadata.version("posttrain")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - run from a bare checkout
        pytest.skip("posttrain is not installed (pip install -e .)")
    assert installed == posttrain.__version__
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and "\nversion =" not in pyproject.split("[tool.setuptools.dynamic]")[0]


def test_license_file_is_the_declared_license() -> None:
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
