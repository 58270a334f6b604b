"""Each sampling and prompt-format option is read from the config in one module (the schema) and handed on
as a value (`RolloutConfig.sampling`, `ModelConfig.prompt_format`), so no two parts of a run can disagree."""

from __future__ import annotations

import ast
from pathlib import Path

import posttrain

ROOT = Path(posttrain.__file__).parent
ONE_PLACE = {
    ("rollout", "temperature"), ("rollout", "top_p"), ("rollout", "top_k"),
    ("model", "chat_template"), ("model", "system_prompt"),
}  # fmt: skip
SCHEMA = ROOT / "llm" / "config" / "schema.py"


def _reads(source: str, label: str) -> list[str]:
    """``section.option`` reads in ``source``: an attribute ``option`` of an attribute ``section``."""
    found = []
    for node in ast.walk(ast.parse(source, label)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            if (node.value.attr, node.attr) in ONE_PLACE:
                found.append(f"{label}:{node.lineno}: {node.value.attr}.{node.attr}")
    return found


def test_sampling_and_prompt_options_are_read_only_in_the_schema() -> None:
    files = [p for p in sorted(ROOT.rglob("*.py")) if p != SCHEMA]
    reads = [r for p in files for r in _reads(p.read_text(), str(p.relative_to(ROOT.parent)))]
    assert reads == [], "read these through RolloutConfig.sampling() / ModelConfig.prompt_format():\n" + "\n".join(
        reads
    )


def test_the_finder_sees_a_read() -> None:
    source = "t = self.cfg.rollout.temperature\ns = cfg.model.system_prompt\nok = sampling.temperature\n"
    assert _reads(source, "x.py") == ["x.py:1: rollout.temperature", "x.py:2: model.system_prompt"]
