"""The documentation's tutorials run: every ```python block of a tutorial page (and of a concepts page
with examples), in order, in one namespace.

A block preceded by the line ``<!-- slow -->`` runs only in the slow test of its page (it trains
the tiny model). The pages' own ``assert`` lines are what is checked: a tutorial that stops being
true fails here. Also: ``posttrain list`` prints readable one-line summaries (no raw markup).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
TUTORIALS = sorted((DOCS / "tutorials").glob("*.md"))
# Pages outside the tutorials whose python blocks are examples that must run too.
EXAMPLE_PAGES = sorted(
    p for p in [DOCS / "getting_started.md", *(DOCS / "concepts").glob("*.md")] if "```python" in p.read_text()
)
_BLOCK = re.compile(r"^(<!-- slow -->\n)?```python\n(.*?)^```", re.S | re.M)


def code_blocks(page: Path) -> list[tuple[bool, str]]:
    """``(slow, source)`` of every python block of ``page``, in order."""
    return [(bool(m.group(1)), m.group(2)) for m in _BLOCK.finditer(page.read_text())]


def run_page(page: Path, *, include_slow: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    ran = 0
    for i, (slow, source) in enumerate(code_blocks(page)):
        if slow and not include_slow:
            break  # later blocks may depend on a slow one
        exec(compile(source, f"{page.name}[block {i}]", "exec"), namespace)  # the page is ours
        ran += 1
    return ran


def test_tutorials_found() -> None:
    assert {p.name for p in TUTORIALS} >= {"exact_bandit.md", "own_estimator.md"}
    for page in TUTORIALS:
        assert code_blocks(page), f"{page.name} has no python blocks"


@pytest.mark.parametrize("page", TUTORIALS + EXAMPLE_PAGES, ids=lambda p: p.stem)
def test_tutorial_fast_blocks(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_page(page, include_slow=False, tmp_path=tmp_path, monkeypatch=monkeypatch) > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "page", [p for p in TUTORIALS if any(slow for slow, _ in code_blocks(p))], ids=lambda p: p.stem
)
def test_tutorial_all_blocks(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers", reason="the slow tutorial blocks train the tiny model ([llm] extra)")
    assert run_page(page, include_slow=True, tmp_path=tmp_path, monkeypatch=monkeypatch) == len(code_blocks(page))


def test_list_prints_plain_one_line_summaries() -> None:
    from posttrain.cli import load_registries, plain_summary
    from posttrain.registry import REGISTRIES

    load_registries()
    seen = 0
    for reg in REGISTRIES.values():
        for entry in reg:
            text = plain_summary(entry)
            seen += 1
            assert "\n" not in text
            assert not re.search(r":(math|func|class|mod|meth|data|attr):|``|\$|\\[A-Za-z]", text), (entry.name, text)
            assert text.count("(") >= text.count(")") - 1, (entry.name, text)  # not cut inside a formula's brackets
    assert seen > 50


def test_plain_summary_renders_math() -> None:
    from posttrain.cli import plain_summary
    from posttrain.registry import Entry

    def fn() -> None:
        r"""KL estimator :math:`\tfrac12(\ell - \ell_{ref})^2` with $\hat A = \beta\,d_t$
        over two lines.

        Second paragraph."""

    text = plain_summary(Entry("k", fn, "KL estimator :math:`\\tfrac12(\\ell - \\ell_{ref})^2` with", ""))
    assert text == "KL estimator 1/2(ℓ - ℓ_ref)^2 with A\u0302 = β d_t over two lines."
