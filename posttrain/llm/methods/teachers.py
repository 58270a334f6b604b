r"""Several frozen teachers, one routed to each row by its prompt's domain (``model.teachers``).

Multi-teacher on-policy distillation (Open-MOPD, Gao et al. 2026, arXiv:2608.19098) hard-routes every
prompt to the teacher of its known domain: the teacher weights are one-hot by the label and an
unknown label raises (no uniform fallback). The label is the task's `Problem.domain` (an index into
the task's ``domains`` names: the ``mixture`` task's components, or the ``dataset`` task's
``domain`` column); the trainer puts it into ``RolloutBatch.domain``.

- `teachers_in_domain_order`: ``model.teachers`` (domain name -> model) checked against the task's
  domains and listed in index order;
- `check_same_tokenizer`: a teacher must share the policy's tokenizer (top-K log-probs are gathered
  at the student's token ids);
- `routed_filler`: one filler per teacher -> the filler of the routed field. Teacher ``d`` runs one
  batched forward over the rows of domain ``d`` only (only the routed teacher is needed per row), so
  a step costs one teacher forward per row whatever the number of teachers. The result equals
  `route_teacher_logprobs` of every teacher's forward on every row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.llm.rollout.batch import RolloutBatch

__all__ = ["check_same_tokenizer", "routed_filler", "select_rows", "teachers_in_domain_order"]

Filler = Callable[[RolloutBatch], Tensor]


def teachers_in_domain_order(teachers: Mapping[str, Any], domains: Sequence[str], task: str) -> list[str]:
    """The models of ``teachers`` (domain name -> path or registered name) in the order of ``domains``.

    Raises:
        DomainError: the task labels no domain, a key that is not one of its domains, a domain
            without a teacher, or a value that is not a string; each names its ``model.teachers`` key.

    Examples:
        >>> teachers_in_domain_order({"b": "/t/b", "a": "/t/a"}, ("a", "b"), "mixture")
        ['/t/a', '/t/b']
    """
    if not domains:
        raise DomainError(
            f"model.teachers: data.task {task!r} labels no domain; use the 'mixture' task or the 'dataset' "
            "task's domain column"
        )
    for name, value in teachers.items():
        if name not in domains:
            raise DomainError(f"model.teachers.{name}: unknown domain; the task's domains: {', '.join(domains)}")
        if not isinstance(value, str) or not value:
            raise DomainError(f"model.teachers.{name}: expected a model path or registered name, got {value!r}")
    missing = [d for d in domains if d not in teachers]
    if missing:
        raise DomainError(f"model.teachers: no teacher for domain(s) {', '.join(missing)} of data.task {task!r}")
    return [teachers[d] for d in domains]


def check_same_tokenizer(key: str, tokenizer: Any, model: Any, policy_tokenizer: Any, policy: Any) -> None:
    """Raise `DomainError` naming ``key`` unless the teacher's tokenizer and output width equal the policy's."""
    mine, theirs = tokenizer.get_vocab(), policy_tokenizer.get_vocab()
    if mine != theirs:
        diff = sorted(set(mine.items()) ^ set(theirs.items()))[:3]
        raise DomainError(
            f"{key}: its tokenizer differs from the policy's ({len(mine)} vs {len(theirs)} tokens, e.g. {diff}); "
            "the teacher's log-probs are gathered at the student's token ids, so both need one tokenizer"
        )
    width, want = model.get_output_embeddings().weight.shape[0], policy.get_output_embeddings().weight.shape[0]
    if width != want:
        raise DomainError(f"{key}: its vocabulary has {width} logits, the policy's {want}; expected the same")


def select_rows(batch: RolloutBatch, index: Tensor) -> RolloutBatch:
    """The rows ``index`` (whole groups) of ``batch`` with what a teacher forward reads: prompt, response, support."""
    return RolloutBatch(
        prompt_ids=batch.prompt_ids[index], prompt_mask=batch.prompt_mask[index],
        response_ids=batch.response_ids[index], mask=batch.mask[index], rewards=batch.rewards[index],
        group_size=batch.group_size, topk_ids=None if batch.topk_ids is None else batch.topk_ids[index],
    )  # fmt: skip


def routed_filler(fillers: Sequence[Filler], field: str) -> Filler:
    """The filler of ``field`` that runs ``fillers[d]`` on the rows of domain ``d`` and stitches the rows back.

    Raises (when called):
        DomainError: ``batch.domain`` missing (the task labels no domain, or a rollout stage rebuilt
            the batch without it) or a label without a teacher.
    """
    n = len(fillers)

    def fill(batch: RolloutBatch) -> Tensor:
        domain = batch.domain
        if domain is None:
            raise DomainError(
                f"{field}: routing to one of {n} teachers needs batch.domain (the task's domain labels; rollout "
                "stages that rebuild the batch do not carry them), got None"
            )
        if bool((domain >= n).any()):
            raise DomainError(f"domain: unknown label; expected ids in [0, {n}), got {sorted(set(domain.tolist()))}")
        out: Tensor | None = None
        for d in torch.unique(domain).tolist():  # one forward per teacher present, over its rows only
            index = (domain == d).nonzero().squeeze(-1)
            part = fillers[d](select_rows(batch, index))
            if out is None:
                out = part.new_zeros((batch.batch_size, *part.shape[1:]))
            out[index] = part
        assert out is not None  # a batch has rows
        return out

    return fill
