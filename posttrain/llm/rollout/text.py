"""Text <-> token ids at the edge of the trainer: prompt encoding (chat template if asked) and decoding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

__all__ = ["PromptFormat", "decode_responses", "encode_prompts", "right_pad", "score_responses"]


@dataclass(frozen=True)
class PromptFormat:
    """How a run turns prompts into token ids: as a user turn of the tokenizer's chat template
    (``chat_template``) after a ``system`` turn, or as plain text. One value per run
    (``ModelConfig.prompt_format``), handed to whatever encodes prompts."""

    chat_template: bool = False
    system: str | None = None

    def encode(self, tokenizer: Any, prompts: Sequence[str]) -> list[list[int]]:
        """`encode_prompts` with this format."""
        return encode_prompts(tokenizer, prompts, chat_template=self.chat_template, system=self.system)

    def options(self) -> dict[str, Any]:
        """The ``chat_template`` / ``system`` keywords of the functions that encode prompts themselves."""
        return {"chat_template": self.chat_template, "system": self.system}


def encode_prompts(
    tokenizer: Any, prompts: Sequence[str], *, chat_template: bool = False, system: str | None = None
) -> list[list[int]]:
    """Token ids of each prompt; with ``chat_template`` (and a tokenizer that has one) as a user turn,
    after a ``system`` turn when given (else the template's default system turn, if it has one)."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        head = [{"role": "system", "content": system}] if system is not None else []
        texts = [
            tokenizer.apply_chat_template(
                [*head, {"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
            )
            for p in prompts
        ]
        return [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    return [list(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]


def decode_responses(tokenizer: Any, response_ids: Int[Tensor, "B T"], mask: Bool[Tensor, "B T"]) -> list[str]:
    """Decoded responses (special tokens such as ``<eos>`` dropped)."""
    return [
        tokenizer.decode(row[m].tolist(), skip_special_tokens=True)
        for row, m in zip(response_ids.cpu(), mask.cpu(), strict=True)
    ]


def score_responses(
    tokenizer: Any,
    task: Any,
    problems: Sequence[Any],
    response_ids: Int[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    n: int,
) -> tuple[list[float], list[str]]:
    """Task rewards and texts of group-major responses, ``n`` per problem (row ``i`` answers ``problems[i // n]``)."""
    texts = decode_responses(tokenizer, response_ids, mask)
    batched = getattr(task, "rewards", None)  # a batch reward function (TRL's signature), e.g. data.reward
    if batched is not None:
        return [float(r) for r in batched([problems[i // n] for i in range(len(texts))], texts)], texts
    return [float(task.reward(problems[i // n], t)) for i, t in enumerate(texts)], texts


def right_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[Int[Tensor, "B T"], Bool[Tensor, "B T"]]:
    """Right-pad token id lists into ``([B, T] ids, [B, T] mask)``.

    Examples:
        >>> ids, m = right_pad([[5, 6], [7]], pad_id=0)
        >>> ids.tolist(), m.tolist()
        ([[5, 6], [7, 0]], [[True, True], [True, False]])
    """
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for row, s in enumerate(seqs):
        ids[row, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
        mask[row, : len(s)] = True
    return ids, mask
