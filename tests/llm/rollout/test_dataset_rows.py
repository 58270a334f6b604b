"""Every row of a dataset is checked when it is loaded, not only the first.

Findings covered: a later row without ``prompt`` trained on the prompt "None"; one without ``answer`` got
the gold answer "". The ``jsonl`` task had the same gap for values (an empty or null prompt, a line that
is not an object).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from posttrain.errors import DomainError
from posttrain.llm.rollout.tasks import make_task

pytest.importorskip("datasets", reason="the dataset task reads files through `datasets`")

GOOD = {"question": "What is 2+3?", "solution": "5", "topic": "add"}


def _write(path: Path, rows: list[Any]) -> Path:
    if path.suffix == ".parquet":
        import pandas as pd

        pd.DataFrame(rows).to_parquet(path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"question": None, "solution": "5", "topic": "add"}, r"data\.options\.prompt: row 3 of .* has no value in column 'question'"),
        ({"question": "", "solution": "5", "topic": "add"}, r"data\.options\.prompt: row 3 of .* has an empty 'question'"),
        ({"question": "  ", "solution": "5", "topic": "add"}, r"data\.options\.prompt: row 3 of .* has an empty 'question'"),
        ({"question": "q", "solution": None, "topic": "add"}, r"data\.options\.answer: row 3 of .* has no value in column 'solution'"),
        ({"question": "q", "solution": "", "topic": "add"}, r"data\.options\.answer: row 3 of .* has an empty 'solution'"),
        ({"question": "q", "solution": "5", "topic": None}, r"data\.options\.domain: row 3 of .* has no value in column 'topic'"),
    ],
)  # fmt: skip
def test_a_bad_later_row_is_named_at_load(tmp_path: Path, suffix: str, bad: dict[str, Any], message: str) -> None:
    path = _write(tmp_path / f"d{suffix}", [GOOD, GOOD, bad, GOOD])
    with pytest.raises(DomainError, match=message):
        make_task("dataset", path=str(path), prompt="question", answer="solution", domain="topic")


def test_a_row_missing_a_column_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.jsonl", [GOOD, {"question": "q", "topic": "add"}])  # `datasets` fills None
    with pytest.raises(DomainError, match=r"data\.options\.answer: row 2 of .* has no value in column 'solution'"):
        make_task("dataset", path=str(path), prompt="question", answer="solution")


def test_a_non_text_prompt_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.jsonl", [{"question": "q", "solution": "1"}, {"question": ["a", "b"], "solution": "1"}])
    with pytest.raises(DomainError, match=r"row 2 of .* column 'question' holds list, expected text"):
        make_task("dataset", path=str(path), prompt="question", answer="solution")


def test_the_held_out_file_is_checked_too(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.jsonl", [GOOD, GOOD])
    held = _write(tmp_path / "eval.jsonl", [GOOD, {"question": "q", "solution": None, "topic": "add"}])
    with pytest.raises(DomainError, match=r"data\.options\.answer: row 2 of .*eval\.jsonl"):
        make_task("dataset", path=str(train), eval_path=str(held), prompt="question", answer="solution")


def test_good_rows_load_unchanged(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.jsonl", [GOOD, {**GOOD, "solution": 7}])  # a numeric answer is text "7"
    task: Any = make_task("dataset", path=str(path), prompt="question", answer="solution")
    assert [p.answer for p in task._train] == ["5", "7"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"prompt": "", "answer": "1"}', r"path: line 2 of .* has an empty 'prompt'"),
        ('{"prompt": null, "answer": "1"}', r"path: line 2 of .* has no value in column 'prompt'"),
        ('{"prompt": "q", "answer": null}', r"path: line 2 of .* has no value in column 'answer'"),
        ('{"prompt": "q"}', r"path: line 2 of .* has no value in column 'answer'"),
        ("[1, 2]", r"path: line 2 of .* is not a JSON object"),
        ('{"prompt": "q", "answer": ', r"path: line 2 of .* is not JSON"),
    ],
)
def test_jsonl_task_names_the_bad_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n' + line + "\n")
    with pytest.raises(DomainError, match=message):
        make_task("jsonl", path=str(path))
