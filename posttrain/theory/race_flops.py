r"""FLOP accounting of GRPO post-training split into search, learning and feedback (RACE, Wilhelm & Kao 2026).

$$
C_{total}=C_{search}+C_{learning}+C_{reward},\qquad p=\frac{C_{learning}}{C_{total}},\ s=\frac{C_{search}}{C_{total}},\
f=\frac{C_{reward}}{C_{total}}.
$$

Per-token costs (1 multiply-add = 2 FLOPs; *reconstructed* from standard transformer accounting, the
paper's exact constants are not available): forward $2N+2N_{LoRA}$; training token, full
fine-tuning $6N$; LoRA on a frozen base $4N+6N_{LoRA}$; gradient checkpointing adds a
recomputed forward $2N+2N_{LoRA}$. Optional attention terms: a token at context position
$\ell$ adds $4\,n_{layer}d_{model}\ell$ forward FLOPs (three times that when trained).

Per step (``G`` prompts, ``K`` rollouts each; token counts are the actual ones, after EOS):

- search: prompt prefill (once per prompt with a shared prefix cache, else ``K`` times) + every
  generated token, discarded rollouts included;
- learning: ``epochs`` training passes over the trained rollouts (prompt + response tokens) plus
  the optional old-log-prob and reference (KL) forward passes;
- reward: 0 for a rule verifier; one reward-model forward over prompt + response (ORM / PRM in
  one pass); one forward per step prefix (PRM queried per step); a generative judge.

Every function is pure and deterministic; totals of a run are sums of per-step `FlopSplit`.
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
    "FlopSplit",
    "PolicyCost",
    "RewardCost",
    "RewardKind",
    "attention_generate_flops",
    "attention_sequence_flops",
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

    ``n_params``: non-embedding parameters ``N`` (active parameters for MoE); ``n_lora``: trainable
    adapter parameters (``lora=True``: frozen base); ``n_layer``/``d_model`` only for attention terms.
    """

    n_params: float
    n_lora: float = 0.0
    lora: bool = False
    gradient_checkpointing: bool = False
    n_layer: int = 0
    d_model: int = 0

    def __post_init__(self) -> None:
        check_positive("n_params", self.n_params)
        check_positive("n_lora", self.n_lora, strict=False)
        if self.n_lora > 0 and not self.lora:
            raise DomainError(f"n_lora: got {self.n_lora} adapter parameters with lora=False (full fine-tuning)")
        if self.n_layer < 0 or self.d_model < 0:
            raise DomainError(f"n_layer, d_model: expected >= 0, got {self.n_layer}, {self.d_model}")


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


def attention_sequence_flops(policy: PolicyCost, tokens: ArrayLike) -> Array:
    r"""Attention FLOPs of a causal forward pass over ``T`` tokens: $4n_{layer}d_{model}\,T(T+1)/2$."""
    t = np.asarray(tokens, dtype=np.float64)
    return 4.0 * policy.n_layer * policy.d_model * t * (t + 1.0) / 2.0


def attention_generate_flops(policy: PolicyCost, prompt_tokens: ArrayLike, response_tokens: ArrayLike) -> Array:
    r"""Attention FLOPs of generating ``T_r`` tokens after a ``T_p``-token prompt with a KV cache.

    $4n_{layer}d_{model}\,(T_pT_r+T_r(T_r+1)/2)$ (prefill not included).
    """
    tp = np.asarray(prompt_tokens, dtype=np.float64)
    tr = np.asarray(response_tokens, dtype=np.float64)
    return 4.0 * policy.n_layer * policy.d_model * (tp * tr + tr * (tr + 1.0) / 2.0)


def _tokens(prompt_tokens: ArrayLike, response_tokens: ArrayLike) -> tuple[Array, Array]:
    tp = np.asarray(prompt_tokens, dtype=np.float64)
    tr = np.asarray(response_tokens, dtype=np.float64)
    if tp.ndim != 1 or tr.ndim != 2 or tr.shape[0] != tp.shape[0]:
        raise ShapeError(f"prompt_tokens [G], response_tokens [G, K]: got {list(tp.shape)}, {list(tr.shape)}")
    if np.any(tp < 0) or np.any(tr < 0) or not (np.all(np.isfinite(tp)) and np.all(np.isfinite(tr))):
        raise DomainError("prompt_tokens, response_tokens: expected finite non-negative token counts")
    return tp, tr


def search_flops(
    prompt_tokens: ArrayLike,
    response_tokens: ArrayLike,
    *,
    policy: PolicyCost,
    prefix_sharing: bool = True,
    count_attention: bool = False,
) -> float:
    r"""$C_{search}=\sum_i[2N\,T_{p,i}\kappa+\sum_j 2N\,T_{r,ij}]$, $\kappa=1$ (shared prefix) or ``K``.

    Args:
        prompt_tokens: ``[G]`` prompt lengths. response_tokens: ``[G, K]`` generated lengths.
        policy: the policy's size. prefix_sharing: prompt prefilled once per prompt.
        count_attention: add the attention terms (needs ``n_layer``, ``d_model``).

    Examples:
        >>> search_flops([100, 100], [[50] * 4] * 2, policy=PolicyCost(1e9))
        1200000000000.0
    """
    tp, tr = _tokens(prompt_tokens, response_tokens)
    k = tr.shape[1]
    fwd = forward_flops_per_token(policy)
    prefills = 1.0 if prefix_sharing else float(k)
    total = fwd * (prefills * tp.sum() + tr.sum())
    if count_attention:
        total += prefills * attention_sequence_flops(policy, tp).sum()
        total += attention_generate_flops(policy, tp[:, None], tr).sum()
    return float(total)


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
) -> float:
    r"""$C_{learning}=\sum_{(i,j)\in S}(T_{p,i}+T_{r,ij})\,[\mu\,c_{train}+2N\mathbb 1_{old}+2N\mathbb 1_{ref}]$.

    The old-policy and reference forwards run on the base weights (LoRA reference = adapters off);
    the old-policy forward uses the adapted model. ``trained``: ``[G, K]`` bool, which rollouts enter
    the loss (default all). ``epochs`` = $\mu$.

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
    seq = np.where(mask, tp[:, None] + tr, 0.0)
    per_token = int(epochs) * train_flops_per_token(policy)
    per_token += forward_flops_per_token(policy) * float(old_logp) + 2.0 * policy.n_params * float(ref_forward)
    total = per_token * seq.sum()
    if count_attention:
        passes = 3.0 * int(epochs) + float(old_logp) + float(ref_forward)
        total += passes * attention_sequence_flops(policy, seq).sum()
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
) -> FlopSplit:
    """The `FlopSplit` of one GRPO step from its logged token counts (what a trainer calls).

    Args:
        prompt_tokens: ``[G]``. response_tokens: ``[G, K]`` (actual, after EOS; discarded rollouts too).
        trained: ``[G, K]`` bool, rollouts entering the loss (after filtering / down-sampling).
        policy, reward: size facts (reward default: rule verifier). Remaining flags as in
            `search_flops` and `learning_flops`.

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
        ),
        reward=reward_flops(prompt_tokens, response_tokens, reward=rc),
    )
