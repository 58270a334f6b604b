r"""The gold answer appended after every sampled trace, scored by teacher forcing in the training forward.

Methods that weight a trace $z$ by the likelihood of the gold answer after it,
$p_\theta(y^\star\mid x, z) = \prod_u\pi_\theta(y^\star_u\mid x, z, y^\star_{<u})$ (the likelihood variant
of GARL / PAFT; answer-likelihood rewards in general), need those answer tokens in the same sequence as
the trace, so that one forward gives both the trace's log-probs and the answer's, with gradient.
`AnswerSuffixStage` (``rollout.answer_suffix``) rebuilds each row of the raw batch as

    [prompt] [trace] [delimiter + answer + <eos>] [pad ...]

- the **trace** is the sampled response up to (excluding) its first ``<eos>`` or its first occurrence of
  the delimiter's token ids, whichever comes first: the model's own answer after the delimiter, if it wrote
  one, is replaced by the gold one (the format at train time is the format the task's verifier reads at
  evaluation: the delimiter must be that format, e.g. ``"="`` for a verifier that reads the last number);
- the **suffix** is ``tokenizer(delimiter + answer)`` followed by ``<eos>``; every suffix token is scored
  (``answer_mask``), the delimiter and the final ``<eos>`` included: the weight is the probability that the
  model, after the trace, writes the delimited answer and stops;
- ``mask`` covers trace and suffix, ``answer_mask`` the suffix only (`RolloutBatch.answer_mask`);
  ``logp_old`` keeps the engine's values on the trace and gets the suffix's from one no-grad forward of
  the current (behaviour) policy, so a method's statistics before micro-batching read ``logp_old`` there.

Simplifications: the delimiter is searched as a token-id sequence (exact for character tokenizers; a BPE
tokenizer can merge it with neighbouring text, then the cut falls at ``<eos>`` only); rewards stay the
verifier's scores of the sampled responses (what ``reward_mean`` logs); the trace's sampled tokens after
the cut get no gradient. Logged: ``answer/trace_len`` (mean tokens kept per trace), ``answer/cut_at_delimiter``
(fraction of traces cut at a delimiter the model wrote), ``answer/logp`` (mean summed suffix log-prob).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.rollout.stages import StatelessStage, StepContext
from posttrain.llm.rollout.text import right_pad
from posttrain.llm.typed import Checked

__all__ = ["AnswerSuffixConfig", "AnswerSuffixStage", "append_suffixes", "trace_lengths"]


@dataclass(frozen=True)
class AnswerSuffixConfig(Checked):
    """``rollout.answer_suffix``: append ``delimiter + gold answer + <eos>`` after every sampled trace."""

    delimiter: str = ""
    """Text between the trace and the gold answer: the answer format the task's verifier reads."""


def _first(row: Sequence[int], pattern: Sequence[int]) -> int | None:
    """Index of the first occurrence of ``pattern`` in ``row`` (None if absent or empty)."""
    n = len(pattern)
    if n == 0:
        return None
    return next((i for i in range(len(row) - n + 1) if list(row[i : i + n]) == list(pattern)), None)


def trace_lengths(
    response_ids: Int[Tensor, "B T"], mask: Bool[Tensor, "B T"], *, eos_id: int, delimiter_ids: Sequence[int] = ()
) -> tuple[list[int], list[bool]]:
    """Per row, the tokens kept as the trace (before the first ``eos_id`` or ``delimiter_ids``) and whether
    the cut fell at the delimiter.

    Examples:
        >>> ids = torch.tensor([[5, 6, 3, 0], [5, 9, 6, 3]])
        >>> trace_lengths(ids, ids > 0, eos_id=3, delimiter_ids=[9])
        ([2, 1], [False, True])
    """
    lengths, at_delim = [], []
    for row, m in zip(response_ids.tolist(), mask.tolist(), strict=True):
        tokens = [t for t, keep in zip(row, m, strict=True) if keep]
        stop = tokens.index(eos_id) if eos_id in tokens else len(tokens)
        cut = _first(tokens[:stop], delimiter_ids)
        lengths.append(stop if cut is None else cut)
        at_delim.append(cut is not None)
    return lengths, at_delim


def append_suffixes(
    response_ids: Int[Tensor, "B T"],
    lengths: Sequence[int],
    suffixes: Sequence[Sequence[int]],
    *,
    pad_id: int,
) -> tuple[Int[Tensor, "B U"], Bool[Tensor, "B U"], Bool[Tensor, "B U"]]:
    """Rows ``response_ids[b, :lengths[b]] + suffixes[b]``, right-padded: ``(ids, mask, suffix mask)``.

    Examples:
        >>> ids, m, a = append_suffixes(torch.tensor([[5, 6, 3], [7, 3, 0]]), [2, 0], [[8, 3], [8, 8, 3]], pad_id=0)
        >>> ids.tolist(), a.tolist()
        ([[5, 6, 8, 3], [8, 8, 3, 0]], [[False, False, True, True], [True, True, True, False]])
    """
    if len(lengths) != response_ids.shape[0] or len(suffixes) != response_ids.shape[0]:
        raise ShapeError(
            f"lengths, suffixes: expected {response_ids.shape[0]} of each (the rows of response_ids), "
            f"got {len(lengths)} and {len(suffixes)}"
        )
    if any(len(s) < 1 for s in suffixes):
        raise DomainError("suffixes: every row needs at least one appended token")
    rows = response_ids.tolist()
    ids, mask = right_pad([rows[b][: lengths[b]] + list(suffixes[b]) for b in range(len(rows))], pad_id)
    cols = torch.arange(ids.shape[1]).unsqueeze(0)
    answer = mask & (cols >= torch.tensor(list(lengths)).unsqueeze(1))
    return ids.to(response_ids.device), mask.to(response_ids.device), answer.to(response_ids.device)


class AnswerSuffixStage(StatelessStage):
    """The rollout stage of ``rollout.answer_suffix`` (see the module docstring); stateless.

    Args:
        config: the delimiter.
        tokenizer: the policy's tokenizer (encodes ``delimiter + answer``; its ``eos_token_id`` ends traces).
    """

    def __init__(self, config: AnswerSuffixConfig, *, tokenizer: Any) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.eos_id = int(tokenizer.eos_token_id)
        self.delimiter_ids = self._encode(config.delimiter) if config.delimiter else []

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def fresh_samples(self, group_size: int) -> int:
        return group_size

    def after_rollout(self, batch: RolloutBatch, ctx: StepContext) -> tuple[RolloutBatch, dict[str, float]]:
        if len(ctx.problems) != batch.num_groups:
            raise DomainError(
                f"problems: the answer suffix needs the gold answer of each of the {batch.num_groups} groups, "
                f"got {len(ctx.problems)} problems"
            )
        if batch.logp_old is None:
            raise DomainError("batch: logp_old (behaviour log-probs) must come with the rollout")
        k = batch.group_size
        per_group = [[*self._encode(self.config.delimiter + str(p.answer)), self.eos_id] for p in ctx.problems]
        suffixes = [per_group[b // k] for b in range(batch.batch_size)]
        lengths, at_delim = trace_lengths(
            batch.response_ids, batch.mask, eos_id=self.eos_id, delimiter_ids=self.delimiter_ids
        )
        ids, mask, answer = append_suffixes(batch.response_ids, lengths, suffixes, pad_id=ctx.pad_id)
        with torch.no_grad():
            scored, _ = token_logprobs(
                ctx.policy, batch.prompt_ids, batch.prompt_mask, ids, mask, temperature=ctx.temperature, group_size=k
            )
        width = min(ids.shape[1], batch.logp_old.shape[1])
        engine = torch.zeros(ids.shape, dtype=batch.logp_old.dtype, device=ids.device)
        engine[:, :width] = batch.logp_old[:, :width]
        logp_old = torch.where(answer, scored.to(engine.dtype), torch.where(mask, engine, 0.0))
        out = batch.replace(response_ids=ids, mask=mask, logp_old=logp_old, answer_mask=answer)
        logs = {
            "answer/trace_len": sum(lengths) / len(lengths),
            "answer/cut_at_delimiter": sum(at_delim) / len(at_delim),
            "answer/logp": float(torch.where(answer, scored, 0.0).sum(-1).mean()),
        }
        return out, logs
