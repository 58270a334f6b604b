"""Tasks whose problems come from a file: ``jsonl`` (prompt/answer lines) and ``dataset`` (local JSON / JSONL /
parquet through ``datasets``, with a column mapping).

Every row is checked at load (`posttrain.llm.rollout.rows.cell_text`: named by its number, counted from 1).
Completions are scored by a registered verifier a batch at a time within ``verifier_budget_s`` seconds
(`posttrain.llm.rollout.verifiers.judge_all`: unjudged, NaN, after it). Registered in
`posttrain.llm.rollout.tasks`.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.errors import DomainError
from posttrain.llm.rollout.problem import Problem
from posttrain.llm.rollout.rows import cell_text
from posttrain.llm.rollout.verifiers import DEFAULT_BUDGET_S, VERIFIERS, judge_all

__all__ = ["DATASET_FORMATS", "DatasetTask", "JsonlTask"]


class _Verified:
    """Scoring shared by the file-backed tasks: the gold answer of each row, judged by the task's registered
    verifier (``_score``) a batch at a time within ``verifier_budget_s``; the answer is the solution."""

    verifier_budget_s: float

    def reward(self, problem: Problem, completion: str) -> float:
        return self.rewards([problem], [completion])[0]

    def rewards(self, problems: list[Problem], completions: list[str]) -> list[float]:
        """One reward per completion, the batch judged within ``verifier_budget_s`` (NaN: unjudged)."""
        score: Callable[[str, str], float] = self._score  # type: ignore[attr-defined]
        return judge_all(score, completions, [p.answer for p in problems], budget_s=self.verifier_budget_s)

    def solution(self, problem: Problem, rng: random.Random) -> str:
        return problem.answer


@dataclass(frozen=True)
class JsonlTask(_Verified):
    """Problems from a JSONL file (``prompt``, ``answer`` keys), scored by a registered verifier."""

    path: str
    verifier: str = "numeric"
    verifier_budget_s: float = DEFAULT_BUDGET_S
    """The most one batch of verdicts may take, in seconds (unjudged after it; see `judge_all`)."""

    def __post_init__(self) -> None:
        _check_budget(self.verifier_budget_s)
        object.__setattr__(self, "_problems", self._load())
        factory: Any = VERIFIERS.get(self.verifier)
        object.__setattr__(self, "_score", factory())

    def _load(self) -> list[Problem]:
        """Every line checked (`cell_text`): a JSON object with a non-blank text ``prompt`` and ``answer``."""
        key, p = "data.options.path", Path(self.path)
        if not p.is_file():
            raise DomainError(f"{key}: no JSONL file at {self.path!r}")
        problems = []
        for n, line in enumerate(p.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            where = f"line {n} of {self.path!r}"
            try:
                row = json.loads(line)
            except (ValueError, RecursionError) as exc:
                raise DomainError(f"{key}: {where} is not JSON ({exc})") from None
            prompt = cell_text(key, where, row, "prompt", text_only=True)
            problems.append(Problem(prompt, cell_text(key, where, row, "answer")))
        if not problems:
            raise DomainError(f"{key}: {self.path!r} has no lines")
        return problems

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        problems: list[Problem] = self._problems  # type: ignore[attr-defined]
        return [problems[rng.randrange(len(problems))] for _ in range(n)]


def _check_budget(budget_s: Any) -> None:
    if isinstance(budget_s, bool) or not isinstance(budget_s, int | float) or not 0 < budget_s <= 86_400:
        raise DomainError(f"data.options.verifier_budget_s: expected seconds in (0, 86400], got {budget_s!r}")


DATASET_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}
"""``dataset`` task: the ``datasets`` builder of each file suffix (``format`` overrides it: json, jsonl, parquet)."""


def _load_rows(where: str, path: str, fmt: str | None) -> list[dict[str, Any]]:
    """Rows of a local JSON / JSONL / parquet file through ``datasets.load_dataset`` (no hub access)."""
    p = Path(path)
    if not p.is_file():
        raise DomainError(f"{where}: no file at {path!r}")
    builder = {"jsonl": "json", "json": "json", "parquet": "parquet"}.get(fmt or "") or DATASET_FORMATS.get(p.suffix)
    if builder is None:
        raise DomainError(
            f"{where}: cannot tell the format of {path!r}; set data.options.format to json, jsonl or parquet"
        )
    import datasets

    try:
        table = datasets.load_dataset(builder, data_files=str(p), split="train")
    except Exception as exc:  # a malformed file: the library's message, under the key
        raise DomainError(f"{where}: cannot read {path!r} as {builder} ({type(exc).__name__}: {exc})") from exc
    return list(table)


@dataclass(frozen=True)
class DatasetTask(_Verified):
    """Prompts (and answers) from a local JSON / JSONL / parquet file read with ``datasets``.

    ``prompt`` / ``answer``: the column names (a column mapping). Every other column reaches a custom
    reward function (``data.reward``) as a keyword list; without one, completions are scored by the
    registered ``verifier`` against the answer column. Held-out problems (evaluation) come from
    ``eval_path`` when set, else from the last ``eval_fraction`` of the rows (those then never train);
    with neither, evaluation samples the training rows. ``domain``: the column of each row's domain
    label (multi-teacher routing, ``model.teachers``); the task's `domains` are its distinct training
    values, sorted, and each `Problem` carries the index of its own.
    """

    path: str
    format: str | None = None
    prompt: str = "prompt"
    answer: str = "answer"
    verifier: str = "numeric"
    eval_path: str | None = None
    eval_fraction: float = 0.0
    domain: str | None = None
    verifier_budget_s: float = DEFAULT_BUDGET_S
    """The most one batch of verdicts may take, in seconds (unjudged after it; see `judge_all`)."""

    def __post_init__(self) -> None:
        _check_budget(self.verifier_budget_s)
        if self.format is not None and self.format not in ("json", "jsonl", "parquet"):
            raise DomainError(f"data.options.format: unknown name {self.format!r}; valid: json, jsonl, parquet")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise DomainError(f"data.options.eval_fraction: expected a number in [0, 1), got {self.eval_fraction}")
        if self.eval_path is not None and self.eval_fraction:
            raise DomainError("data.options.eval_fraction: set eval_path or eval_fraction, not both")
        rows = self._problems("data.options.path", self.path)
        cut = len(rows) - int(len(rows) * self.eval_fraction)
        if cut < 1 or (self.eval_fraction and cut == len(rows)):
            raise DomainError(
                f"data.options.eval_fraction: {self.eval_fraction} of {len(rows)} rows leaves no training or no "
                "evaluation row"
            )
        held = self._problems("data.options.eval_path", self.eval_path) if self.eval_path else rows[cut:]
        names = tuple(sorted({str(dict(p.columns)[self.domain]) for p in rows[:cut]})) if self.domain else ()
        object.__setattr__(self, "_domains", names)
        object.__setattr__(self, "_train", self._labelled(rows[:cut]))
        object.__setattr__(self, "_held", self._labelled(held) or self._labelled(rows[:cut]))
        factory: Any = VERIFIERS.get(self.verifier)
        object.__setattr__(self, "_score", factory())

    def _problems(self, where: str, path: str) -> list[Problem]:
        rows = _load_rows(where, path, self.format)
        if not rows:
            raise DomainError(f"{where}: {path!r} has no rows")
        for key, column in (("prompt", self.prompt), ("answer", self.answer), ("domain", self.domain)):
            if column is not None and column not in rows[0]:
                raise DomainError(
                    f"data.options.{key}: no column {column!r} in {path!r}; columns: {', '.join(rows[0])}"
                )
        extra = [c for c in rows[0] if c != self.prompt]
        problems = []
        for i, r in enumerate(rows, start=1):  # every row: a later one without a prompt must not train on "None"
            where = f"row {i} of {path!r}"
            prompt = cell_text("data.options.prompt", where, r, self.prompt, text_only=True)
            answer = cell_text("data.options.answer", where, r, self.answer)
            if self.domain is not None:
                cell_text("data.options.domain", where, r, self.domain)
            problems.append(Problem(prompt, answer, columns=tuple((c, r.get(c)) for c in extra)))
        return problems

    @property
    def domains(self) -> tuple[str, ...]:
        """The domain labels of the ``domain`` column (sorted); empty without one."""
        names: tuple[str, ...] = self._domains  # type: ignore[attr-defined]
        return names

    def _labelled(self, problems: list[Problem]) -> list[Problem]:
        """``problems`` with their domain index set (unchanged without a ``domain`` column)."""
        if self.domain is None:
            return problems
        labels = [str(dict(p.columns)[self.domain]) for p in problems]
        unknown = sorted(set(labels) - set(self.domains))
        if unknown:
            raise DomainError(
                f"data.options.domain: held-out label(s) {unknown} not among the training labels {list(self.domains)}"
            )
        return [dataclasses.replace(p, domain=self.domains.index(x)) for p, x in zip(problems, labels, strict=True)]

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        problems: list[Problem] = self._train  # type: ignore[attr-defined]
        return [problems[rng.randrange(len(problems))] for _ in range(n)]

    def held_out(self, rng: random.Random, n: int) -> list[Problem]:
        """Evaluation problems (from ``eval_path`` or the held-out fraction)."""
        problems: list[Problem] = self._held  # type: ignore[attr-defined]
        return [problems[rng.randrange(len(problems))] for _ in range(n)]
