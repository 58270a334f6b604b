"""Chat-template prompts with a system turn, and the ``chat_addition`` task for pretrained chat models."""

from __future__ import annotations

import random
from typing import Any

import pytest

from posttrain.errors import DomainError
from posttrain.llm.rollout.tasks import make_task
from posttrain.llm.rollout.text import encode_prompts


class ChatMLTokenizer:
    """A character tokenizer with a ChatML-style template whose default system turn is ``default``."""

    chat_template = "chatml"

    def apply_chat_template(
        self, messages: list[dict[str, str]], *, add_generation_prompt: bool, tokenize: bool
    ) -> str:
        assert add_generation_prompt and not tokenize
        if messages[0]["role"] != "system":
            messages = [{"role": "system", "content": "default"}, *messages]
        return "".join(f"<{m['role']}>{m['content']}</>" for m in messages) + "<assistant>"

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, Any]:
        return {"input_ids": [ord(c) for c in text]}


def _text(ids: list[int]) -> str:
    return "".join(map(chr, ids))


def test_system_turn_replaces_the_default() -> None:
    tok = ChatMLTokenizer()
    [plain] = encode_prompts(tok, ["2+3?"], chat_template=True)
    [system] = encode_prompts(tok, ["2+3?"], chat_template=True, system="calc")
    assert _text(plain) == "<system>default</><user>2+3?</><assistant>"
    assert _text(system) == "<system>calc</><user>2+3?</><assistant>"
    assert _text(encode_prompts(tok, ["2+3?"], system="calc")[0]) == "2+3?"  # no template: the raw prompt


def test_chat_addition_samples_its_ranges_and_scores_the_last_number() -> None:
    task = make_task("chat_addition", low=10, high=99, low_b=1, high_b=9)
    problems = task.sample(random.Random(0), 200)
    a = [p.data[0] for p in problems]
    b = [p.data[1] for p in problems]
    assert min(a) >= 10 and max(a) <= 99 and min(b) >= 1 and max(b) <= 9
    p = problems[0]
    assert p.prompt == f"What is {p.data[0]}+{p.data[1]}? Answer with just the number."
    s = p.data[0] + p.data[1]
    assert task.reward(p, f"{s}") == 1.0
    assert task.reward(p, f"{p.data[0]} + {p.data[1]} = {s}.") == 1.0
    assert task.reward(p, f"{s} is the sum of {p.data[0]}") == 0.0  # ends on another number
    assert task.reward(p, f"{s + 1}") == 0.0 and task.reward(p, "no idea") == 0.0
    assert make_task("chat_addition").reward(*_big()) == 1.0  # thousands separators are ignored


def _big() -> tuple[Any, str]:
    from posttrain.llm.rollout.tasks import Problem

    return Problem("What is 999+1?", "1000", (999, 1)), "That is 1,000."


def test_chat_addition_rejects_unknown_options() -> None:
    with pytest.raises(DomainError):
        make_task("chat_addition", digits=2)
