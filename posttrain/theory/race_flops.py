r"""FLOP accounting of GRPO post-training split into search, learning and feedback (RACE, Wilhelm & Kao 2026).

$$
C_{total}=C_{search}+C_{learning}+C_{reward},\qquad p=\frac{C_{learning}}{C_{total}},\ s=\frac{C_{search}}{C_{total}},\
f=\frac{C_{reward}}{C_{total}}.
$$

What is counted: the multiply-adds of the weight matrices (1 multiply-add = 2 FLOPs; biases,
norms, activations, softmax, RoPE and every other elementwise op are not counted) and, with
``count_attention``, the attention scores and their weighted sum ($QK^\top$ and $AV$: $4d_{model}$
per causal query-key pair and layer, the pairs a causal kernel must compute; a dense kernel computes the
full square, $2T/(T+1)$ times the causal count for a ``T``-token sequence). Per-token costs
(*reconstructed* from standard transformer accounting, the paper's exact constants are not available):
a forward is $2N+2N_{LoRA}$; a trained token, full fine-tuning $6N$; LoRA on a frozen base
$4N+6N_{LoRA}$; gradient checkpointing adds a recomputed forward of the body.

Where the tokens are processed is an `Accounting`:

- ``PER_TOKEN`` (the paper's convention, default): every prompt (prefill) and response token of
  each row costs one forward of all ``N`` parameters, the LM head included;
- ``UNSHARED`` (what a KV-cached sampler and one forward over prompt + response per row execute):
  generation prefills the prompt (LM head at its last position) and feeds the first $T_r-1$
  sampled tokens (the last one is never fed); a learning pass feeds $T_p+T_r$ tokens per row and
  applies the LM head ($N_{head}=Vd$, `PolicyCost.n_head`) at the $T_r+1$ last positions;
- ``SHARED_PROMPT`` (learning passes with each group's prompt computed once, whose KV cache the
  ``K`` rows share): one prompt pass per group (LM head at its last position), then each row's first
  $T_r-1$ response tokens with the LM head at each; generation as ``UNSHARED``.

With ``n_head = 0`` the head is counted in the body (at every processed token).

Per step (``G`` prompts, ``K`` rollouts each; token counts are the actual ones, after EOS):

- search: prompt prefill (once per prompt with a shared prefix cache, else ``K`` times) + every
  generated token, discarded rollouts included;
- learning: ``epochs`` training passes over the trained rollouts plus the optional old-log-prob and
  reference (KL) forward passes;
- reward: 0 for a rule verifier; one reward-model forward over prompt + response (ORM / PRM in
  one pass); one forward per step prefix (PRM queried per step); a generative judge.

Every function is pure and deterministic; totals of a run are sums of per-step `FlopSplit`. Tests
compare ``UNSHARED`` and ``SHARED_PROMPT`` with ``torch.utils.flop_counter`` counts of the tiny model and
of SmolLM2-135M (equal to float rounding).
Reference: Wilhelm, Kao (2026), "Where Should RL Post-Training Compute Go?", arXiv:2607.13389.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

import numpy as np
from numpy.typing import ArrayLike, NDArray

from posttrain.errors import DomainError, ShapeError
from posttrain.validate import check_positive

__all__ = [
    "Accounting",
    "FlopSplit",
    "PolicyCost",
    "RewardCost",
    "RewardKind",
    "flops_per_step",
    "forward_flops_per_token",
    "learning_flops",
    "reward_flops",
    "search_flops",
    "train_flops_per_token",
]

Array = NDArray[np.float64]


@dataclass(frozen=True)
class PolicyCost:
    """The policy's size facts.

    ``n_params``: parameters ``N`` of the weight matrices other than the input embedding, the LM head
    included (active parameters for MoE); ``n_head``: the LM head's share of them (``V d``, counted
    once when tied to the input embedding), applied only where logits are computed under the
    ``UNSHARED`` and ``SHARED_PROMPT`` accountings (0: part of the body); ``n_lora``: trainable adapter
    parameters (``lora=True``: frozen base); ``n_layer``/``d_model`` only for attention terms.
    """

    n_params: float
    n_lora: float = 0.0
    lora: bool = False
    gradient_checkpointing: bool = False
    n_layer: int = 0
    d_model: int = 0
    n_head: float = 0.0

    def __post_init__(self) -> None:
        check_positive("n_params", self.n_params)
        check_positive("n_lora", self.n_lora, strict=False)
        if self.n_lora > 0 and not self.lora:
            raise DomainError(f"n_lora: got {self.n_lora} adapter parameters with lora=False (full fine-tuning)")
        if self.n_layer < 0 or self.d_model < 0:
            raise DomainError(f"n_layer, d_model: expected >= 0, got {self.n_layer}, {self.d_model}")
        if not 0.0 <= self.n_head <= self.n_params:
            raise DomainError(
                f"n_head: expected the LM head's share of n_params, in [0, {self.n_params}], got {self.n_head}"
            )


class Accounting(str, Enum):
    """Where the tokens of a step are processed (see the module docstring)."""

    PER_TOKEN = "per_token"
    """The paper's convention: one forward of all N per prompt and response token of each row."""
    UNSHARED = "unshared"
    """KV-cached generation; each learning pass one forward over prompt + response per row."""
    SHARED_PROMPT = "shared_prompt"
    """KV-cached generation; each learning pass computes a group's prompt once for its K rows."""


class RewardKind(str, Enum):
    """How rewards are computed."""

    RULE = "rule"
    """CPU verifier: no model FLOPs."""
    MODEL = "model"
    """ORM or PRM scoring prompt + response in one forward pass."""
    PRM_STEPS = "prm_steps"
    """PRM queried once per step prefix (``steps`` evenly spaced prefixes of the response)."""
    JUDGE = "judge"
    """Generative judge reading prompt + response and writing ``judge_output_tokens``."""


@dataclass(frozen=True)
class RewardCost:
    """The feedback model's facts (``n_params`` is ignored for ``RULE``)."""

    kind: RewardKind = RewardKind.RULE
    n_params: float = 0.0
    steps: int = 1
    judge_output_tokens: int = 0

    def __post_init__(self) -> None:
        kind = RewardKind(self.kind)
        if kind is not RewardKind.RULE:
            check_positive("n_params", self.n_params)
        if self.steps < 1 or self.judge_output_tokens < 0:
            raise DomainError(
                f"steps, judge_output_tokens: expected >= 1, >= 0, got {self.steps}, {self.judge_output_tokens}"
            )


@dataclass(frozen=True)
class FlopSplit:
    """FLOPs of one step (or a run): search, learning, reward; ``+`` adds componentwise."""

    search: float
    learning: float
    reward: float

    @property
    def total(self) -> float:
        return self.search + self.learning + self.reward

    @property
    def p(self) -> float:
        """Update (learning) fraction; 0 for an empty split."""
        return self.learning / self.total if self.total > 0 else 0.0

    @property
    def s(self) -> float:
        """Search fraction."""
        return self.search / self.total if self.total > 0 else 0.0

    @property
    def f(self) -> float:
        """Feedback (reward-model) fraction."""
        return self.reward / self.total if self.total > 0 else 0.0

    def __add__(self, other: FlopSplit) -> FlopSplit:
        return FlopSplit(self.search + other.search, self.learning + other.learning, self.reward + other.reward)

    def scaled(self, steps: float) -> FlopSplit:
        """The split of ``steps`` identical steps."""
        return FlopSplit(self.search * steps, self.learning * steps, self.reward * steps)

    def as_dict(self) -> dict[str, float]:
        """Logging columns ``flops/search``, ``flops/learning``, ``flops/reward``, ``flops/total``, ``flops/p``."""
        return {
            "flops/search": self.search,
            "flops/learning": self.learning,
            "flops/reward": self.reward,
            "flops/total": self.total,
            "flops/p": self.p,
        }

    @staticmethod
    def sum(steps: Iterable[FlopSplit]) -> FlopSplit:
        """Accumulate per-step splits into a run total."""
        out = FlopSplit(0.0, 0.0, 0.0)
        for step in steps:
            out = out + step
        return out


def forward_flops_per_token(policy: PolicyCost) -> float:
    """Forward FLOPs per processed token, ``2N + 2N_LoRA``.

    Examples:
        >>> forward_flops_per_token(PolicyCost(1e9, n_lora=1e7, lora=True))
        2020000000.0
    """
    return 2.0 * policy.n_params + 2.0 * policy.n_lora


def train_flops_per_token(policy: PolicyCost) -> float:
    """FLOPs of one trained token (forward + backward): ``6N`` full FT, ``4N + 6N_LoRA`` LoRA, + recompute.

    Examples:
        >>> train_flops_per_token(PolicyCost(1e9))
        6000000000.0
        >>> train_flops_per_token(PolicyCost(1e9, n_lora=1e7, lora=True))
        4060000000.0
    """
    n, nl = policy.n_params, policy.n_lora
    cost = 4.0 * n + 6.0 * nl if policy.lora else 6.0 * n
    if policy.gradient_checkpointing:
        cost += 2.0 * n + 2.0 * nl
    return cost


def _tokens(prompt_tokens: ArrayLike, response_tokens: ArrayLike) -> tuple[Array, Array]:
    tp = np.asarray(prompt_tokens, dtype=np.float64)
    tr = np.asarray(response_tokens, dtype=np.float64)
    if tp.ndim != 1 or tr.ndim != 2 or tr.shape[0] != tp.shape[0]:
        raise ShapeError(f"prompt_tokens [G], response_tokens [G, K]: got {list(tp.shape)}, {list(tr.shape)}")
    if np.any(tp < 0) or np.any(tr < 0) or not (np.all(np.isfinite(tp)) and np.all(np.isfinite(tr))):
        raise DomainError("prompt_tokens, response_tokens: expected finite non-negative token counts")
    return tp, tr


@dataclass(frozen=True)
class _Work:
    """Token work of one kind of pass over a step: body tokens fed, LM-head positions, causal attention pairs."""

    fed: float
    logits: float
    pairs: float


def _causal_pairs(t: Array) -> Array:
    """Query-key pairs of a causal pass over ``t`` tokens: ``t (t + 1) / 2``."""
    return t * (t + 1.0) / 2.0


def _appended_pairs(context: Array, t: Array) -> Array:
    """Pairs of ``t`` tokens appended after ``context`` cached ones: ``t context + t (t + 1) / 2``."""
    return t * context + _causal_pairs(t)


def _generation_work(tp: Array, tr: Array, *, prefix_sharing: bool, accounting: Accounting) -> _Work:
    prefills = 1.0 if prefix_sharing else float(tr.shape[1])
    prefill_pairs = prefills * _causal_pairs(tp).sum()
    if Accounting(accounting) is Accounting.PER_TOKEN:
        fed = prefills * tp.sum() + tr.sum()
        return _Work(fed, fed, prefill_pairs + _appended_pairs(tp[:, None], tr).sum())
    decoded = np.maximum(tr - 1.0, 0.0)  # the last sampled token is never fed
    return _Work(
        prefills * tp.sum() + decoded.sum(),
        prefills * tp.size + decoded.sum(),  # the prefill's logits at its last position
        prefill_pairs + _appended_pairs(tp[:, None], decoded).sum(),
    )


def _learning_work(tp: Array, tr: Array, mask: NDArray[np.bool_], *, accounting: Accounting) -> _Work:
    acc = Accounting(accounting)
    seq = np.where(mask, tp[:, None] + tr, 0.0)
    if acc is Accounting.PER_TOKEN:
        return _Work(seq.sum(), seq.sum(), _causal_pairs(seq).sum())
    if acc is Accounting.UNSHARED:
        return _Work(seq.sum(), np.where(mask, tr + 1.0, 0.0).sum(), _causal_pairs(seq).sum())
    groups = mask.any(axis=1)  # each group's prompt once, if any of its rows is trained
    fed = np.where(mask, np.maximum(tr - 1.0, 0.0), 0.0)  # the last response token predicts nothing
    return _Work(
        (tp * groups).sum() + fed.sum(),
        groups.sum() + fed.sum(),
        (_causal_pairs(tp) * groups).sum() + _appended_pairs(tp[:, None], fed).sum(),
    )


def _pass_flops(policy: PolicyCost, work: _Work, *, kind: str, count_attention: bool) -> float:
    """FLOPs of ``work`` as a ``"forward"`` (policy, adapters on), ``"reference"`` (base weights) or ``"train"`` pass."""
    body, head, lora = policy.n_params - policy.n_head, policy.n_head, policy.n_lora
    attention = 4.0 * policy.n_layer * policy.d_model * work.pairs if count_attention else 0.0
    if kind == "reference":
        return float(2.0 * body * work.fed + 2.0 * head * work.logits + attention)
    if kind == "forward":
        return float(2.0 * (body + lora) * work.fed + 2.0 * head * work.logits + attention)
    c = 4.0 if policy.lora else 6.0  # a frozen base back-propagates to its inputs only
    total = c * (body * work.fed + head * work.logits) + (6.0 * lora * work.fed if policy.lora else 0.0)
    total += 3.0 * attention
    if policy.gradient_checkpointing:  # the body's forward again (the LM head is not checkpointed)
        total += 2.0 * (body + lora) * work.fed + attention
    return float(total)


def search_flops(
    prompt_tokens: ArrayLike,
    response_tokens: ArrayLike,
    *,
    policy: PolicyCost,
    prefix_sharing: bool = True,
    count_attention: bool = False,
    accounting: Accounting = Accounting.PER_TOKEN,
) -> float:
    r"""$C_{search}=\sum_i[2N\,T_{p,i}\kappa+\sum_j 2N\,T_{r,ij}]$ (``PER_TOKEN``), $\kappa=1$ (shared prefix) or ``K``.

    ``UNSHARED`` / ``SHARED_PROMPT``: $\sum_i\kappa[2N_{body}T_{p,i}+2N_{head}]+\sum_{ij}2N(T_{r,ij}-1)$.

    Args:
        prompt_tokens: ``[G]`` prompt lengths. response_tokens: ``[G, K]`` generated lengths.
        policy: the policy's size. prefix_sharing: prompt prefilled once per prompt.
        count_attention: add the attention terms (needs ``n_layer``, ``d_model``).
        accounting: where tokens are processed (`Accounting`).

    Examples:
        >>> search_flops([100, 100], [[50] * 4] * 2, policy=PolicyCost(1e9))
        1200000000000.0
    """
    tp, tr = _tokens(prompt_tokens, response_tokens)
    work = _generation_work(tp, tr, prefix_sharing=prefix_sharing, accounting=accounting)
    return _pass_flops(policy, work, kind="forward", count_attention=count_attention)


def learning_flops(
    prompt_tokens: ArrayLike,
    response_tokens: ArrayLike,
    trained: ArrayLike | None = None,
    *,
    policy: PolicyCost,
    epochs: int = 1,
    old_logp: bool = False,
    ref_forward: bool = False,
    count_attention: bool = False,
    accounting: Accounting = Accounting.PER_TOKEN,
) -> float:
    r"""$C_{learning}=\sum_{(i,j)\in S}(T_{p,i}+T_{r,ij})\,[\mu\,c_{train}+2N\mathbb 1_{old}+2N\mathbb 1_{ref}]$ (``PER_TOKEN``).

    The old-policy and reference forwards run on the base weights (LoRA reference = adapters off);
    the old-policy forward uses the adapted model. ``trained``: ``[G, K]`` bool, which rollouts enter
    the loss (default all). ``epochs`` = $\mu$. Under ``UNSHARED`` and ``SHARED_PROMPT`` each pass
    processes the tokens and LM-head positions listed in the module docstring.

    Examples:
        >>> learning_flops([100, 100], [[50] * 4] * 2, policy=PolicyCost(1e9))
        7200000000000.0
    """
    tp, tr = _tokens(prompt_tokens, response_tokens)
    mask = np.ones(tr.shape, dtype=bool) if trained is None else np.asarray(trained)
    if mask.shape != tr.shape or mask.dtype != np.bool_:
        raise ShapeError(
            f"trained: expected a bool array of shape {list(tr.shape)}, got {mask.dtype} {list(mask.shape)}"
        )
    if int(epochs) < 1:
        raise DomainError(f"epochs: expected >= 1, got {epochs}")
    work = _learning_work(tp, tr, mask, accounting=accounting)
    total = int(epochs) * _pass_flops(policy, work, kind="train", count_attention=count_attention)
    if old_logp:
        total += _pass_flops(policy, work, kind="forward", count_attention=count_attention)
    if ref_forward:
        total += _pass_flops(policy, work, kind="reference", count_attention=count_attention)
    return float(total)


def reward_flops(prompt_tokens: ArrayLike, response_tokens: ArrayLike, *, reward: RewardCost) -> float:
    r"""$C_{reward}$: 0 (rule), $2N_{RM}(T_p+T_r)$ (one pass), $\sum_s 2N_{RM}\ell_s$ (per step
    prefix, $\ell_s=T_p+\lceil sT_r/S\rceil$), $2N_J(T_p+T_r+T_{out})$ (judge) per rollout.

    Examples:
        >>> reward_flops([100, 100], [[50] * 4] * 2, reward=RewardCost(RewardKind.MODEL, n_params=7e9))
        16800000000000.0
    """
    tp, tr = _tokens(prompt_tokens, response_tokens)
    kind = RewardKind(reward.kind)
    if kind is RewardKind.RULE:
        return 0.0
    seq = tp[:, None] + tr
    if kind is RewardKind.MODEL:
        tokens = seq.sum()
    elif kind is RewardKind.PRM_STEPS:
        steps = np.arange(1, reward.steps + 1, dtype=np.float64)
        prefixes = tp[:, None, None] + np.ceil(steps * tr[..., None] / reward.steps)
        tokens = prefixes.sum()
    else:
        tokens = (seq + reward.judge_output_tokens).sum()
    return float(2.0 * reward.n_params * tokens)


def flops_per_step(
    prompt_tokens: ArrayLike,
    response_tokens: ArrayLike,
    trained: ArrayLike | None = None,
    *,
    policy: PolicyCost,
    reward: RewardCost | None = None,
    epochs: int = 1,
    old_logp: bool = False,
    ref_forward: bool = False,
    prefix_sharing: bool = True,
    count_attention: bool = False,
    accounting: Accounting = Accounting.PER_TOKEN,
) -> FlopSplit:
    """The `FlopSplit` of one GRPO step from its logged token counts (what a trainer calls).

    Args:
        prompt_tokens: ``[G]``. response_tokens: ``[G, K]`` (actual, after EOS; discarded rollouts too).
        trained: ``[G, K]`` bool, rollouts entering the loss (after filtering / down-sampling).
        policy, reward: size facts (reward default: rule verifier). Remaining flags as in
            `search_flops` and `learning_flops`; ``accounting`` applies to both.

    Examples:
        >>> split = flops_per_step([100, 100], [[50] * 4] * 2, policy=PolicyCost(1e9))
        >>> split.total, round(split.p, 6)
        (8400000000000.0, 0.857143)
    """
    rc = RewardCost() if reward is None else reward
    return FlopSplit(
        search=search_flops(
            prompt_tokens,
            response_tokens,
            policy=policy,
            prefix_sharing=prefix_sharing,
            count_attention=count_attention,
            accounting=accounting,
        ),
        learning=learning_flops(
            prompt_tokens,
            response_tokens,
            trained,
            policy=policy,
            epochs=epochs,
            old_logp=old_logp,
            ref_forward=ref_forward,
            count_attention=count_attention,
            accounting=accounting,
        ),
        reward=reward_flops(prompt_tokens, response_tokens, reward=rc),
    )
