r"""What a method reads from a rollout batch: one typed table, `NEEDS`, from each `Need` to who provides it.

A method declares the batch inputs it reads as `Need` members: ``Algorithm.needs`` (present before its
advantage runs), ``Algorithm.loss_needs`` (passed to its loss by name), and for an advantage estimator used
in a preset, its positional inputs (`posttrain.llm.methods.algorithm.ADVANTAGE_INPUTS`). The row of a need
says, once, for every part of the run:

- ``source``: who provides it: the rollout itself (``logp_old`` from the engine), a *view* computed from the
  batch (grouped rewards, outcome rewards on the last token), a *filler* (one no-grad forward of the
  reference, the teacher(s) or the policy, built by ``fill`` from the run's `FillContext`), a rollout
  *stage* (``rollout.oracle`` marks the oracle rows) or the method's own ``before_update`` *hook*;
- ``requires``: config keys one of which must be set for it (teacher log-probs: ``model.teacher`` or
  ``model.teachers``), checked when the config loads (`posttrain.llm.config.checks`);
- ``only_when_read``: its stage's key may only be set when the method reads it (the appended answer
  tokens would otherwise be trained on as sampled tokens);
- ``behaviour``: a forward of the policy that must be the *behaviour* policy, the one that generated the
  batch: trained at a lag (``rollout.staleness``), the trainer fills it when the batch is generated, not
  when it is trained on;
- ``shape`` and ``kind``: its shape in the batch's letters (``"B T"``, ``"B T K"``, ``"B"``, ``"B H"``) and
  element kind (``float``, ``bool``, ``int``).

A need whose name is a `RolloutBatch` field is stored there; any other (a new need) in
``RolloutBatch.extras`` under its name, so adding a batch input is a row here plus the code that reads it.
The trainer fills the needs of a step in the order of this table (``topk_ids`` before the log-probs on
that support).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from posttrain.estimators import masked_mean
from posttrain.llm.methods.teachers import routed_filler
from posttrain.llm.methods.topk import StudentTopK, topk_logp_filler
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.logprobs import position_ids, token_logprobs, widened

__all__ = [
    "NEEDS",
    "FillContext",
    "Filler",
    "Need",
    "NeedRow",
    "Source",
    "example_batch",
    "logp_filler",
    "policy_logp_filler",
    "prompt_feature_filler",
    "read",
    "write",
]

Filler = Callable[[RolloutBatch], Tensor]


class Need(str, enum.Enum):
    """A batch input a method or stage reads (the value is its name in the batch and as a loss keyword)."""

    REWARDS = "rewards"
    MASK = "mask"
    TOKEN_REWARDS = "token_rewards"
    LOGP_OLD = "logp_old"
    LOGP_REF = "logp_ref"
    LOGP_TEACHER = "logp_teacher"
    PROMPT_FEATURES = "prompt_features"
    TOPK_IDS = "topk_ids"
    TOPK_LOGP_OLD = "topk_logp_old"
    TOPK_LOGP_REF = "topk_logp_ref"
    TOPK_LOGP_TEACHER = "topk_logp_teacher"
    SYNTHETIC = "synthetic"
    ANSWER_MASK = "answer_mask"
    ROUTE = "route"
    ROUTE_WEIGHT = "route_weight"
    CONTEXT = "context_ids"
    TOPK_ADVANTAGES = "topk_advantages"
    SIS_ACCEPTED = "sis_accepted"
    SIS_TOPK_IDS = "sis_topk_ids"
    SIS_TOPK_LOGP = "sis_topk_logp"
    LOGP_PROX = "logp_prox"

    def __str__(self) -> str:
        return self.value

    __hash__ = str.__hash__  # equal to its name as a string, so it hashes like one


class Source(enum.Enum):
    """Who puts a need into the batch."""

    ROLLOUT = "the rollout"
    VIEW = "a view of the batch"
    FILLER = "a filler (a no-grad forward)"
    STAGE = "a rollout stage"
    HOOK = "the method's before_update hook"


@dataclass
class FillContext:
    """What the fillers of a run are built from (`posttrain.llm.run.build_trainer` makes one).

    Attributes:
        policy: the policy being trained (its forwards at fill time: the behaviour policy).
        temperature: the sampling temperature (of the run's one `SamplingConfig`).
        topk: K of the student's top-K support (``algorithm.topk``, clamped to the vocabulary).
        reference: loads the frozen reference model (``model.reference``, else the initial policy) on first use.
        teachers: loads the frozen teacher(s) on first use: one (``model.teacher``) or one per domain in the
            task's domain order (``model.teachers``, routed by ``RolloutBatch.domain``); empty without a teacher.
        routed: whether the teachers are routed by domain.
    """

    policy: Any
    temperature: float
    topk: int
    reference: Callable[[], Any]
    teachers: Callable[[], Sequence[Any]] = tuple
    routed: bool = False

    @functools.cached_property
    def student(self) -> StudentTopK:
        """The policy's top-K fillers (``topk_ids`` and ``topk_logp_old`` share one forward)."""
        return StudentTopK(self.policy, k=self.topk, temperature=self.temperature)

    @functools.cached_property
    def sis_envelope(self) -> Any:
        """The policy's top-``topk`` envelope fillers (``sis_topk_ids`` and ``sis_topk_logp`` share one forward;
        the SIS bundle brings its own, of its ``top_k``)."""
        from posttrain.llm.methods.sis import SisEnvelope  # sis.py reads this table

        return SisEnvelope(self.policy, top_k=self.topk, temperature=self.temperature)

    def per_teacher(self, make: Callable[[Any], Filler], need: Need) -> Filler:
        """The filler of ``need``: ``make(teacher)``, routed by domain over several teachers."""
        fillers = [make(t) for t in self.teachers()]
        return routed_filler(fillers, need.value) if self.routed else fillers[0]


def logp_filler(model: Any, temperature: float) -> Filler:
    """A frozen model's ``[B, T]`` log-probs of the response tokens (filler of ``logp_ref`` / ``logp_teacher``)."""
    model.eval().requires_grad_(False)

    def fill(batch: RolloutBatch) -> Tensor:
        logp, _ = token_logprobs(
            model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask, temperature=temperature,
            group_size=batch.group_size,
        )  # fmt: skip
        return logp

    return fill


def policy_logp_filler(model: Any, temperature: float) -> Filler:
    """The policy's ``[B, T]`` log-probs of the response tokens before the step's updates, one no-grad forward
    (filler of ``logp_prox``; the policy is not frozen)."""

    def fill(batch: RolloutBatch) -> Tensor:
        with torch.no_grad():
            logp, _ = token_logprobs(
                model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask, temperature=temperature,
                group_size=batch.group_size,
            )  # fmt: skip
        return logp

    return fill


def prompt_feature_filler(model: Any) -> Filler:
    """The ``prompt_features`` filler: mean of the policy's last hidden states over each prompt's real tokens.

    ``[B, H]`` (float32 at least), computed without gradient by one forward over the left-padded prompts.
    """

    def fill(batch: RolloutBatch) -> Tensor:
        attn = batch.prompt_mask.long()
        with torch.no_grad():  # logits_to_keep=1: no [B, P, V] logits, only the hidden states are used
            out = model(input_ids=batch.prompt_ids, attention_mask=attn, position_ids=position_ids(attn),
                        output_hidden_states=True, use_cache=False, logits_to_keep=1)  # fmt: skip
            hidden = widened(out.hidden_states[-1])
            return masked_mean(hidden, batch.prompt_mask.unsqueeze(-1), dim=1)

    return fill


def _last_token_rewards(batch: RolloutBatch) -> Tensor:
    """``[B, T]``: each row's reward on its last valid token, 0 elsewhere (outcome reward as a token reward)."""
    last = batch.mask.long().cumsum(-1).argmax(-1)
    out = torch.zeros(batch.mask.shape, dtype=batch.rewards.dtype, device=batch.rewards.device)
    out[torch.arange(batch.batch_size, device=out.device), last] = batch.rewards
    return out


@dataclass(frozen=True)
class NeedRow:
    """One row of `NEEDS` (see the module docstring)."""

    source: Source
    shape: str
    kind: str = "float"
    fill: Callable[[FillContext], Filler] | None = None
    view: Callable[[RolloutBatch], Tensor] | None = None
    requires: tuple[str, ...] = ()
    only_when_read: bool = False
    behaviour: bool = False
    doc: str = ""


_TEACHER = ("model.teacher", "model.teachers")

NEEDS: dict[Need, NeedRow] = {
    Need.REWARDS: NeedRow(Source.VIEW, "G K", view=RolloutBatch.grouped_rewards, doc="rewards as [G, K]"),
    Need.MASK: NeedRow(Source.VIEW, "B T", view=lambda b: b.mask, doc="the response mask"),
    Need.TOKEN_REWARDS: NeedRow(Source.VIEW, "B T", view=_last_token_rewards, doc="reward on the last token"),
    Need.LOGP_OLD: NeedRow(Source.ROLLOUT, "B T", doc="behaviour log-probs (the engine's)"),
    Need.LOGP_REF: NeedRow(
        Source.FILLER, "B T", fill=lambda c: logp_filler(c.reference(), c.temperature), doc="reference log-probs"
    ),
    Need.LOGP_TEACHER: NeedRow(
        Source.FILLER,
        "B T",
        requires=_TEACHER,
        doc="teacher log-probs",
        fill=lambda c: c.per_teacher(lambda t: logp_filler(t, c.temperature), Need.LOGP_TEACHER),
    ),
    Need.PROMPT_FEATURES: NeedRow(
        Source.FILLER, "B H", fill=lambda c: prompt_feature_filler(c.policy), doc="the policy's mean prompt state"
    ),
    Need.TOPK_IDS: NeedRow(
        Source.FILLER,
        "B T K",
        kind="int",
        fill=lambda c: c.student.ids,
        behaviour=True,
        doc="the student's top-K ids",
    ),
    Need.TOPK_LOGP_OLD: NeedRow(
        Source.FILLER,
        "B T K",
        fill=lambda c: c.student.logp,
        behaviour=True,
        doc="the student's log-probs on its top-K",
    ),
    Need.TOPK_LOGP_REF: NeedRow(
        Source.FILLER,
        "B T K",
        doc="the reference's log-probs on the student's top-K",
        fill=lambda c: topk_logp_filler(c.reference(), temperature=c.temperature, field="topk_logp_ref"),
    ),
    Need.TOPK_LOGP_TEACHER: NeedRow(
        Source.FILLER,
        "B T K",
        requires=_TEACHER,
        doc="the teacher's log-probs on the student's top-K",
        fill=lambda c: c.per_teacher(
            lambda t: topk_logp_filler(t, temperature=c.temperature, field="topk_logp_teacher"),
            Need.TOPK_LOGP_TEACHER,
        ),
    ),
    Need.SYNTHETIC: NeedRow(Source.STAGE, "B", "bool", requires=("rollout.oracle",), doc="the oracle rows"),
    Need.ANSWER_MASK: NeedRow(
        Source.STAGE,
        "B T",
        "bool",
        requires=("rollout.answer_suffix",),
        only_when_read=True,
        doc="the appended answer tokens",
    ),
    Need.ROUTE: NeedRow(Source.STAGE, "B", "int", doc="the router's recipe of each row"),
    Need.ROUTE_WEIGHT: NeedRow(Source.STAGE, "B", doc="the router's row weights"),
    Need.CONTEXT: NeedRow(Source.STAGE, "B Q", "int", doc="the self-teacher's prompt of each row"),
    Need.TOPK_ADVANTAGES: NeedRow(Source.HOOK, "B T K", doc="per-candidate advantages on the top-K"),
    Need.SIS_ACCEPTED: NeedRow(Source.HOOK, "B T", "bool", doc="SIS's accepted tokens"),
    Need.SIS_TOPK_IDS: NeedRow(
        Source.FILLER,
        "B T K",
        "int",
        fill=lambda c: c.sis_envelope.ids,
        behaviour=True,
        doc="the behaviour's top-K ids (SIS's envelope)",
    ),
    Need.SIS_TOPK_LOGP: NeedRow(
        Source.FILLER,
        "B T K",
        fill=lambda c: c.sis_envelope.logp,
        behaviour=True,
        doc="the behaviour's log-probs on its top-K (SIS's envelope)",
    ),
    Need.LOGP_PROX: NeedRow(
        Source.FILLER,
        "B T",
        fill=lambda c: policy_logp_filler(c.policy, c.temperature),
        requires=("algorithm.rollout_correction",),
        doc="the pre-update policy's log-probs, recomputed by the trainer (rollout correction)",
    ),
}
"""Every need's row; a new batch input is a member of `Need` and a row here."""

_FIELDS = frozenset(f.name for f in dataclasses.fields(RolloutBatch))


def read(batch: RolloutBatch, need: Need) -> Tensor | None:
    """The value of ``need`` in ``batch`` (None when not there yet)."""
    view = NEEDS[need].view
    if view is not None:
        return view(batch)
    if need.value in _FIELDS:
        return getattr(batch, need.value)  # type: ignore[no-any-return]
    return batch.extras.get(need.value)


def write(batch: RolloutBatch, need: Need, value: Tensor) -> RolloutBatch:
    """``batch`` with ``need`` set to ``value`` (validated again)."""
    if need.value in _FIELDS:
        return batch.replace(**{need.value: value})
    return batch.replace(extras={**batch.extras, need.value: value})


_KINDS = {"float": torch.float32, "bool": torch.bool, "int": torch.long}
_SIZES = {"T": 3, "K": 1, "H": 2, "Q": 1}
"""The example batch's sizes of the letters other than B."""


def example_batch(needs: frozenset[Need] | set[Need], *, group_size: int, rewards: Sequence[float]) -> RolloutBatch:
    """A small batch (``len(rewards)`` rows, groups of ``group_size``, 3 response tokens) with every need of
    ``needs`` that a batch carries set to zeros of its row's shape and kind: what a method's estimators are
    tried on when the config loads (`posttrain.llm.methods.catalog.build_algorithm`)."""
    b = len(rewards)
    ones = torch.ones(b, _SIZES["T"], dtype=torch.long)
    batch = RolloutBatch(
        prompt_ids=ones[:, :1], prompt_mask=ones[:, :1].bool(), response_ids=ones, mask=ones.bool(),
        rewards=torch.tensor(list(rewards), dtype=torch.float32), group_size=group_size,
    )  # fmt: skip
    for need in sorted(needs, key=list(Need).index):
        row = NEEDS[need]
        if row.source is Source.VIEW:
            continue
        shape = [b if d == "B" else _SIZES[d] for d in row.shape.split()]
        value = torch.zeros(shape, dtype=_KINDS[row.kind])
        if need is Need.CONTEXT:  # the ids come with their mask
            batch = batch.replace(context_ids=value, context_mask=torch.ones(shape, dtype=torch.bool))
        else:
            batch = write(batch, need, value)
    return batch
