"""The rollout batch: every tensor the trainer needs about B = G*K sampled responses, validated once.

Layout: prompts are left-padded ``[B, P]`` (so every response starts at column ``P``), responses
right-padded ``[B, T]``; ``mask [B, T]`` marks real response tokens (including the final
``<eos>``). Rows are grouped row-major: the K samples of prompt 0 come first, so grouped rewards
are ``rewards.reshape(G, K)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.validate import check_finite, check_float, check_mask, check_tensor

__all__ = ["LOGP_FIELDS", "TOPK_LOGP_FIELDS", "RolloutBatch"]

LOGP_FIELDS = ("logp_old", "logp", "logp_ref", "logp_teacher")
"""Optional ``[B, T]`` log-prob fields: behaviour, current, reference model, teacher model."""

TOPK_LOGP_FIELDS = ("topk_logp_old", "topk_logp_ref", "topk_logp_teacher")
"""Optional ``[B, T, K]`` log-prob fields on the ``topk_ids`` support: behaviour, reference, teacher."""


def _check_ids(name: str, x: object, shape: tuple[int, ...] | None = None, *, ndim: int = 2) -> Tensor:
    t = check_tensor(name, x, ndim=ndim)
    if t.is_floating_point() or t.dtype == torch.bool:
        raise ShapeError(f"{name}: expected an integer dtype, got {t.dtype}")
    if shape is not None and tuple(t.shape) != shape:
        raise ShapeError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
    return t


@dataclass(frozen=True)
class RolloutBatch:
    """B = G*K responses to G prompts, K samples each, with everything the loss may need.

    Attributes:
        prompt_ids: ``[B, P]`` left-padded prompt token ids.
        prompt_mask: ``[B, P]`` boolean, True on real prompt tokens.
        response_ids: ``[B, T]`` right-padded response token ids.
        mask: ``[B, T]`` boolean response mask.
        rewards: ``[B]`` float sequence rewards (row-major over groups).
        group_size: K, samples per prompt; ``B % K == 0``.
        logp_old: ``[B, T]`` behaviour log-probs (from the rollout engine), or None.
        logp: ``[B, T]`` current-policy log-probs (no gradient), or None.
        logp_ref: ``[B, T]`` reference-model log-probs, or None.
        logp_teacher: ``[B, T]`` teacher-model log-probs, or None.
        advantages: ``[B, T]`` per-token advantages once computed, or None.
        topk_ids: ``[B, T, K]`` integer ids of the student's top-K support per position (the sampled id
            among them, `topk_support`), or None.
        topk_logp_old, topk_logp_ref, topk_logp_teacher: ``[B, T, K]`` full-vocabulary log-probs of the
            ``topk_ids`` under the behaviour policy, the reference (teacher-base) and the teacher, or None.
        prompt_features: ``[B, H]`` float features of each row's prompt (FlowRL's log-partition input: the
            mean of the prompt's last hidden states), or None.
        judged: ``[B]`` boolean, False where the reward could not be computed (a verifier's verdict not
            reached; ``rewards`` holds a finite placeholder there), or None (all judged). A group with an
            unjudged sample is left out of the loss (`loss_mask`): its advantages depend on every
            reward of the group.
        sis_accepted: ``[B, T]`` boolean, SIS's accepted tokens of the current update, or None.
        kept: ``[B]`` boolean, False for rows a method leaves out of the loss after its advantages were
            computed (e.g. a selection of rows per group, or rows routed to no loss), or None (all kept).
            `loss_mask` drops them; the rewards and advantages of every row stay as computed.
        domain: ``[B]`` integer domain index of each row's prompt (the task's `Problem.domain`; one value per
            group), or None (unlabelled).
        topk_advantages: ``[B, T, K]`` float per-candidate advantages on the ``topk_ids`` support (Open-MOPD's
            weighted top-K reward of the current update), or None.
        answer_mask: ``[B, T]`` boolean, True on tokens appended after each sampled trace and scored by
            teacher forcing (a gold answer: `posttrain.llm.rollout.answer`), a subset of ``mask``; the
            sampled tokens are ``mask & ~answer_mask``. None: every ``mask`` token was sampled.
        route: ``[B]`` integer recipe id of each row chosen by a per-prompt router (Self-Routing: 0 GRPO,
            1 OPSD, 2 REG, 3 SKIP; `posttrain.llm.methods.routing`), or None.
        route_weight: ``[B]`` float, non-negative weight of each row's token loss that makes the token mean
            over the kept rows equal the router's queue-size-weighted mean of per-queue token means, or None.
        context_ids, context_mask: ``[B, Q]`` left-padded prompt ids and mask under which a teacher scores
            each row's response instead of its own prompt (Self-Routing's privileged self-teacher
            context, one per group: `posttrain.llm.methods.routing`), or None (both set or neither).
        synthetic: ``[B]`` boolean, True for rows not sampled from the policy (e.g. a task's reference
            solution appended to its group: `posttrain.llm.rollout.oracle`), or None (all sampled). They
            are trained on like any row but left out of the logged reward statistics.
        extras: tensors of batch inputs with no field of their own (a need added to
            `posttrain.llm.methods.needs.NEEDS`), by name; each has ``B`` rows.

    Raises:
        ShapeError: wrong ranks, dtypes or shapes; ``B`` not a multiple of ``group_size``.
        DomainError: non-finite rewards or log-probs on valid tokens, a row with no prompt token.

    Examples:
        >>> b = RolloutBatch(
        ...     prompt_ids=torch.ones(4, 3, dtype=torch.long), prompt_mask=torch.ones(4, 3, dtype=torch.bool),
        ...     response_ids=torch.ones(4, 2, dtype=torch.long), mask=torch.ones(4, 2, dtype=torch.bool),
        ...     rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=2)
        >>> b.num_groups, b.grouped_rewards().tolist()
        (2, [[1.0, 0.0], [0.0, 1.0]])
    """

    prompt_ids: Int[Tensor, "B P"]
    prompt_mask: Bool[Tensor, "B P"]
    response_ids: Int[Tensor, "B T"]
    mask: Bool[Tensor, "B T"]
    rewards: Float[Tensor, " B"]
    group_size: int
    logp_old: Float[Tensor, "B T"] | None = None
    logp: Float[Tensor, "B T"] | None = None
    logp_ref: Float[Tensor, "B T"] | None = None
    logp_teacher: Float[Tensor, "B T"] | None = None
    advantages: Float[Tensor, "B T"] | None = None
    topk_ids: Int[Tensor, "B T K"] | None = None
    topk_logp_old: Float[Tensor, "B T K"] | None = None
    topk_logp_ref: Float[Tensor, "B T K"] | None = None
    topk_logp_teacher: Float[Tensor, "B T K"] | None = None
    prompt_features: Float[Tensor, "B H"] | None = None
    judged: Bool[Tensor, " B"] | None = None
    sis_accepted: Bool[Tensor, "B T"] | None = None
    kept: Bool[Tensor, " B"] | None = None
    domain: Int[Tensor, " B"] | None = None
    topk_advantages: Float[Tensor, "B T K"] | None = None
    answer_mask: Bool[Tensor, "B T"] | None = None
    route: Int[Tensor, " B"] | None = None
    route_weight: Float[Tensor, " B"] | None = None
    synthetic: Bool[Tensor, " B"] | None = None
    context_ids: Int[Tensor, "B Q"] | None = None
    context_mask: Bool[Tensor, "B Q"] | None = None
    extras: Mapping[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        prompt = _check_ids("prompt_ids", self.prompt_ids)
        b = prompt.shape[0]
        check_mask("prompt_mask", self.prompt_mask, prompt.shape)
        resp = _check_ids("response_ids", self.response_ids)
        if resp.shape[0] != b:
            raise ShapeError(f"response_ids: expected {b} rows (the rows of prompt_ids), got {resp.shape[0]}")
        check_mask("mask", self.mask, resp.shape)
        check_float("rewards", self.rewards, ndim=1)
        if self.rewards.shape[0] != b:
            raise ShapeError(f"rewards: expected shape [{b}], got {list(self.rewards.shape)}")
        check_finite("rewards", self.rewards)
        k = self.group_size
        if not isinstance(k, int) or k < 1 or b % k != 0:
            raise ShapeError(f"group_size: expected a positive divisor of B={b}, got {k!r}")
        if b and not bool(self.prompt_mask.any(dim=-1).all()):
            raise DomainError("prompt_mask: every row needs at least one prompt token")
        for name in (*LOGP_FIELDS, "advantages"):
            value = getattr(self, name)
            if value is None:
                continue
            check_float(name, value, ndim=2)
            if tuple(value.shape) != tuple(resp.shape):
                raise ShapeError(
                    f"{name}: expected shape {list(resp.shape)} (the shape of mask), got {list(value.shape)}"
                )
            check_finite(name, value, self.mask)
        self._check_topk(tuple(resp.shape))
        if self.prompt_features is not None:
            check_float("prompt_features", self.prompt_features, ndim=2)
            if self.prompt_features.shape[0] != b:
                raise ShapeError(f"prompt_features: expected {b} rows, got {list(self.prompt_features.shape)}")
            check_finite("prompt_features", self.prompt_features)
        if self.judged is not None:
            check_mask("judged", self.judged, (b,))
        if self.sis_accepted is not None:
            check_mask("sis_accepted", self.sis_accepted, tuple(resp.shape))
        if self.kept is not None:
            check_mask("kept", self.kept, (b,))
        self._check_domain_fields()
        self._check_answer_mask(tuple(resp.shape))
        self._check_route(b)
        if self.synthetic is not None:
            check_mask("synthetic", self.synthetic, (b,))
        self._check_context(b)
        for name, value in self.extras.items():
            t = check_tensor(f"extras.{name}", value)
            if t.ndim < 1 or t.shape[0] != b:
                raise ShapeError(f"extras.{name}: expected {b} rows, got shape {list(t.shape)}")
            if t.is_floating_point():
                check_finite(f"extras.{name}", t)

    def _check_context(self, b: int) -> None:
        """``context_ids``/``context_mask``: both or neither, ``[B, Q]``, a context token in every row."""
        if (self.context_ids is None) != (self.context_mask is None):
            raise DomainError("context_ids, context_mask: set both or neither")
        if self.context_ids is None or self.context_mask is None:
            return
        ids = _check_ids("context_ids", self.context_ids)
        if ids.shape[0] != b:
            raise ShapeError(f"context_ids: expected {b} rows, got {list(ids.shape)}")
        check_mask("context_mask", self.context_mask, tuple(ids.shape))
        if b and not bool(self.context_mask.any(dim=-1).all()):
            raise DomainError("context_mask: every row needs at least one context token")

    def _check_answer_mask(self, bt: tuple[int, ...]) -> None:
        """``answer_mask``: boolean ``[B, T]``, only on ``mask`` tokens."""
        if self.answer_mask is None:
            return
        check_mask("answer_mask", self.answer_mask, bt)
        if bool((self.answer_mask & ~self.mask).any()):
            raise DomainError("answer_mask: expected a subset of mask (appended tokens are response tokens)")

    def _check_route(self, b: int) -> None:
        """``route``: integer ``[B]``, non-negative; ``route_weight``: float ``[B]``, finite, non-negative."""
        if self.route is not None:
            _check_ids("route", self.route, (b,), ndim=1)
            if bool((self.route < 0).any()):
                raise DomainError(f"route: expected non-negative recipe ids, got {self.route.tolist()}")
        if self.route_weight is not None:
            check_float("route_weight", self.route_weight, ndim=1)
            if tuple(self.route_weight.shape) != (b,):
                raise ShapeError(f"route_weight: expected shape [{b}], got {list(self.route_weight.shape)}")
            check_finite("route_weight", self.route_weight)
            if bool((self.route_weight < 0).any()):
                raise DomainError("route_weight: expected non-negative weights")

    def _check_domain_fields(self) -> None:
        """``domain``: integer ``[B]``, non-negative, one value per group; ``topk_advantages``: the shape of
        ``topk_ids`` (required with it), finite on the mask."""
        b = self.batch_size
        if self.domain is not None:
            d = _check_ids("domain", self.domain, (b,), ndim=1)
            if b and bool((d < 0).any()):
                raise DomainError(f"domain: expected non-negative domain indices, got {sorted(set(d.tolist()))}")
            if b and not bool((d.reshape(-1, self.group_size) == d.reshape(-1, self.group_size)[:, :1]).all()):
                raise DomainError("domain: the samples of one prompt (a group) must share its domain")
        if self.topk_advantages is not None:
            adv = check_float("topk_advantages", self.topk_advantages, ndim=3)
            if self.topk_ids is None or adv.shape != self.topk_ids.shape:
                want = "None" if self.topk_ids is None else list(self.topk_ids.shape)
                raise ShapeError(f"topk_advantages: expected the shape of topk_ids ({want}), got {list(adv.shape)}")
            check_finite("topk_advantages", adv, self.mask.unsqueeze(-1))

    def _check_topk(self, bt: tuple[int, ...]) -> None:
        """``topk_ids`` and the ``[B, T, K]`` log-prob fields: ranks, dtypes, one shared ``[B, T, K]``, finite on the mask."""
        present: dict[str, Tensor] = {}
        if self.topk_ids is not None:
            present["topk_ids"] = _check_ids("topk_ids", self.topk_ids, ndim=3)
        for name in TOPK_LOGP_FIELDS:
            value = getattr(self, name)
            if value is not None:
                present[name] = check_float(name, value, ndim=3)
        if not present:
            return
        first, shape = next((n, tuple(v.shape)) for n, v in present.items())
        if shape[:2] != bt or shape[2] < 1:
            raise ShapeError(
                f"{first}: expected shape [{bt[0]}, {bt[1]}, K] (the shape of mask, K >= 1), got {list(shape)}"
            )
        for name, value in present.items():
            if tuple(value.shape) != shape:
                raise ShapeError(
                    f"{name}: expected shape {list(shape)} (the shape of {first}), got {list(value.shape)}"
                )
            if name != "topk_ids":
                check_finite(name, value, self.mask.unsqueeze(-1))

    @property
    def batch_size(self) -> int:
        """B, the number of responses."""
        return int(self.response_ids.shape[0])

    @property
    def num_groups(self) -> int:
        """G, the number of prompts."""
        return self.batch_size // self.group_size

    def judged_groups(self) -> Bool[Tensor, " G"]:
        """True for the groups whose K rewards were all computed (all groups when ``judged`` is None)."""
        if self.judged is None:
            return torch.ones(self.num_groups, dtype=torch.bool, device=self.mask.device)
        return self.judged.reshape(self.num_groups, self.group_size).all(dim=1)

    def loss_mask(self) -> Bool[Tensor, "B T"]:
        """``mask`` without the rows of groups that have an unjudged sample and without rows not ``kept``
        (the positions the loss averages)."""
        mask = self.mask
        if self.judged is not None:
            mask = mask & self.judged_groups().repeat_interleave(self.group_size).unsqueeze(-1)
        if self.kept is not None:
            mask = mask & self.kept.unsqueeze(-1)
        return mask

    def grouped_rewards(self) -> Float[Tensor, "G K"]:
        """Rewards as ``[G, K]``."""
        return self.rewards.reshape(self.num_groups, self.group_size)

    def input_ids(self) -> Int[Tensor, "B L"]:
        """Prompt and response concatenated, ``[B, P + T]``."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    def attention_mask(self) -> Bool[Tensor, "B L"]:
        """Boolean mask over ``input_ids()``: real prompt and response tokens."""
        return torch.cat([self.prompt_mask, self.mask], dim=1)

    def replace(self, **fields: Any) -> RolloutBatch:
        """A copy with some fields replaced (validated again)."""
        return dataclasses.replace(self, **fields)

    def rows(self, start: int, stop: int) -> RolloutBatch:
        """Rows ``[start, stop)`` as a batch; the bounds must fall on group boundaries."""
        k = self.group_size
        if start % k or stop % k or not 0 <= start < stop <= self.batch_size:
            raise DomainError(
                f"rows: [{start}, {stop}) must be a non-empty range of whole groups of {k} in [0, {self.batch_size}]"
            )
        return self._map(lambda t: t[start:stop])

    def to(self, device: torch.device | str) -> RolloutBatch:
        """The batch with every tensor moved to ``device``."""
        return self._map(lambda t: t.to(device))

    def _map(self, fn: Callable[[Tensor], Tensor]) -> RolloutBatch:
        """A batch (validated again) with ``fn`` applied to every tensor field; ``group_size`` and ``None`` kept."""
        tensors: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if isinstance(value := getattr(self, f.name), Tensor):
                tensors[f.name] = fn(value)
        return dataclasses.replace(self, **tensors, extras={k: fn(v) for k, v in self.extras.items()})
