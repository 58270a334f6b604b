"""The paper table (`posttrain.papers`) against the package: every entry exists, every public estimator is listed."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import posttrain
import posttrain.estimators
from posttrain.errors import DomainError
from posttrain.papers import PAPERS, paper, papers_of, resolve

ROOT = Path(posttrain.__file__).parent


def _public_estimator_functions() -> set[str]:
    """``"family.module:function"`` for every function in the ``__all__`` of a public estimators module."""
    out = set()
    for info in pkgutil.walk_packages(posttrain.estimators.__path__, "posttrain.estimators."):
        if info.ispkg or info.name.rsplit(".", 1)[1].startswith("_"):
            continue
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if inspect.isfunction(obj) and obj.__module__ == info.name:
                out.add(f"{info.name.removeprefix('posttrain.estimators.')}:{name}")
    return out


def test_ids_are_unique_and_ordered() -> None:
    ids = [p.id for p in PAPERS]
    assert ids == ["core", *(f"{i:02d}" for i in range(1, 21))]


@pytest.mark.parametrize("p", PAPERS, ids=lambda p: p.id)
def test_every_listed_estimator_is_a_function_of_its_module(p) -> None:  # type: ignore[no-untyped-def]
    for entry in p.estimators:
        obj = resolve(entry)
        assert inspect.isfunction(obj), f"{p.id}: {entry} is not a function"
        assert obj.__module__ == "posttrain.estimators." + entry.split(":")[0], f"{p.id}: {entry} is defined elsewhere"
    assert len(set(p.estimators)) == len(p.estimators), f"{p.id}: an entry is listed twice"


@pytest.mark.parametrize("p", PAPERS, ids=lambda p: p.id)
def test_every_other_entry_exists(p) -> None:  # type: ignore[no-untyped-def]
    """Modules and attributes outside the estimators, found in the source (nothing imported: the LLM
    modules need the llm extra)."""
    for entry in p.elsewhere:
        module, _, attr = entry.partition(":")
        path = ROOT.joinpath(*module.split("."))
        source = path.with_suffix(".py") if path.with_suffix(".py").exists() else path / "__init__.py"
        assert source.exists(), f"{p.id}: no module posttrain.{module}"
        if attr:
            tree = ast.parse(source.read_text())
            names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            assert attr in names, f"{p.id}: posttrain.{module} defines no {attr}"
    for check in p.checks:
        assert list((ROOT / "paper_checks").glob(f"p{check[:2]}_*.py")), f"{p.id}: no paper check {check}"
    if p.page:
        assert (ROOT.parent / "docs" / p.page).exists(), f"{p.id}: no page docs/{p.page}"


def test_every_public_estimator_is_listed_under_a_paper_or_core() -> None:
    listed = {entry for p in PAPERS for entry in p.estimators}
    missing = sorted(_public_estimator_functions() - listed)
    assert not missing, f"public estimators under no paper (add them to posttrain.papers.PAPERS): {missing}"


def test_lookups() -> None:
    assert paper("6") is paper("06")
    assert paper("CORE").id == "core"
    with pytest.raises(DomainError, match=r"^paper: unknown id '99'"):
        paper("99")
    assert [p.id for p in papers_of("topk_reverse_kl_reward")] == ["08"]
    assert papers_of("losses.offpolicy:sis_loss") == [paper("16")]
    assert paper("16").qualified()[0] == "posttrain.estimators.importance.acceptance.token_in_topk"


def test_posttrain_list_prints_the_table_and_one_paper(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console
    from typer.testing import CliRunner

    from posttrain import cli
    from posttrain.cli import app

    runner = CliRunner()
    monkeypatch.setattr(cli, "console", Console(width=400))  # no names folded across lines
    table = runner.invoke(app, ["list", "paper"])
    assert table.exit_code == 0, table.output
    assert all(p.id in table.output for p in PAPERS) and "sis_rejection_test" in table.output
    one = runner.invoke(app, ["list", "--paper", "16"])
    assert one.exit_code == 0, one.output
    assert "posttrain.estimators.importance.acceptance" in one.output and "llm.methods.sis" in one.output
    assert "gspo_loss" not in one.output.replace("sis_gspo_loss", "")
    bad = runner.invoke(app, ["list", "--paper", "99"])
    assert bad.exit_code == 2 and "unknown id '99'" in bad.output
