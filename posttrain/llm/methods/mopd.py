r"""Open-MOPD as an `Algorithm` bundle (``algorithm.method: open_mopd``; docs: methods/open_mopd.md).

Multi-teacher on-policy distillation on the student's top-K support, with the paper's three fixes of the
optimisation budget. Per token and candidate $k$ of the support (``topk_ids``, K = ``algorithm.topk``):

$$
r_{t,k}=\mathrm{sg}\big[(\ell^T_{t,k}-\ell^S_{t,k})\,\mathrm{softmax}_k(\ell^S_t)\big],\qquad
A_{b,t,k} = w_{d(b)}\,r_{b,t,k},\qquad
L = \frac{\sum_{b,t} m_{bt}\sum_k \mathrm{PPO}_{dual}(\rho_{btk}, A_{btk})}{\sum_{b,t} m_{bt}}
$$

with $\ell^T$ the routed teacher's log-probs (``topk_logp_teacher``: ``model.teachers`` routed by
``RolloutBatch.domain``, `posttrain.llm.methods.teachers`; or the one ``model.teacher``), $\ell^S$ the
rollout-time student's (``topk_logp_old``), $\rho_{btk} = e^{\ell_{btk} - \ell^{S}_{btk}}$ with the current
student's top-K log-probs $\ell$ (this bundle's training forward `topk_forward`, passed to the loss
as ``topk_logp``), dual-clip PPO (0.2 / 0.28, c = 3) summed over K (`topk_distill_loss`), token mean.

- **Domain weights** $w_b$ (`mopd_domain_weights`): token-share balancing $g^\star_d/s_d$ times the
  gap-following factor $\mathrm{clip}((m_d/\bar m)^\alpha, 0.05, 20)$ ("multiply" only), normalised to a
  token-weighted mean of 1. Computed once per rollout batch, on the whole batch (before micro-batching),
  from the rollout-time reward, by the ``before_update`` hook at the batch's first update; they multiply the
  advantage, never the mask, so the clip and ratio diagnostics stay unweighted. Rows without a domain label
  form one domain (weights 1).
- **Reward refresh** (``refresh``): before every later update of the batch
  (``optim.updates_per_batch > 1``) the hook recomputes $r$ from the current student's top-K log-probs and
  the cached teacher ones (`refreshed_reward`, no teacher call); the ratio keeps the rollout-time
  $\ell^S$ as "old", as in the released code.

The hook stores $A$ in ``RolloutBatch.topk_advantages``; ``RolloutBatch.advantages`` is
$\sum_k A_{btk}$ at rollout time (minus the weighted top-K reverse KL per token; logged only).
Logged at each batch's first update: ``mopd/reverse_kl`` (top-K reverse KL estimate of the rollout-time
student to the routed teacher, token mean) and per present domain ``mopd/d{i}/token_share``,
``mopd/d{i}/gap`` ($m_d$), ``mopd/d{i}/weight`` ($w_d$), ``mopd/d{i}/reward`` (the task's mean reward);
at a refreshed update ``mopd/refresh_change`` (mean $|A_{new} - A_{rollout}|$ over the support).

Simplifications: the refresh runs one no-grad forward of the student in the hook (the paper reuses
the training forward, so it costs nothing there); each update of a step trains on the whole rollout
batch (the trainer's ``updates_per_batch``), not on a shuffled quarter of it; the training forward builds
the ``[B, T, V]`` log-softmax of a micro-batch at once. Reference: Gao et al. 2026, Open-MOPD
(arXiv:2608.19098).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import AggregationMode, masked_mean, token_entropy, topk_reverse_kl_reward, zero_off_mask
from posttrain.estimators.losses import topk_distill_loss
from posttrain.estimators.weights import (
    domain_gap_magnitudes,
    domain_token_counts,
    mopd_domain_weights,
    refreshed_reward,
)
from posttrain.llm.methods.algorithm import Algorithm, ClipOptions, UpdateContext
from posttrain.llm.methods.needs import Need
from posttrain.llm.methods.topk import StudentTopK, on_support, support_ids
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.logprobs import vocab_log_softmax
from posttrain.llm.typed import Range

__all__ = ["OPEN_MOPD_NEEDS", "OpenMopdOptions", "mopd_policy_loss", "open_mopd_algorithm", "topk_forward"]

OPEN_MOPD_NEEDS = frozenset({Need.LOGP_OLD, Need.TOPK_IDS, Need.TOPK_LOGP_OLD, Need.TOPK_LOGP_TEACHER})
"""The batch fields Open-MOPD declares (the routed teacher's top-K log-probs among them)."""


def topk_forward(
    model: Any, batch: RolloutBatch, temperature: float, entropy_grad: bool
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """The training forward: sampled-token log-probs, entropy and the top-K log-probs ``topk_logp`` ``[B, T, K]``.

    One forward; the ``[B, T, V]`` temperature-scaled log-softmax (float32 or wider) is gathered at the
    response ids and at ``batch.topk_ids``; all three are 0 off the mask; gradient flows into both
    log-probs, into the entropy only with ``entropy_grad``.
    """
    ids = support_ids(batch, "topk_logp")
    logp_v = vocab_log_softmax(model, batch, temperature=temperature)
    logp = zero_off_mask(logp_v.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1), batch.mask)
    topk = on_support(logp_v, ids, batch)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = zero_off_mask(token_entropy(logp_v), batch.mask)  # log-softmax in, the same entropy out
    return logp, entropy, {"topk_logp": topk}


def mopd_policy_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    topk_logp: Tensor,
    topk_logp_old: Tensor | None,
    topk_advantages: Tensor | None,
    **options: Any,
) -> tuple[Tensor, Any]:
    """`topk_distill_loss` on the live top-K log-probs, the rollout-time ones and the hook's ``topk_advantages``.

    ``logp``, ``logp_old`` and ``advantages`` (the sampled-token fields) are not used.
    """
    if topk_logp_old is None or topk_advantages is None:
        raise DomainError("batch: topk_logp_old and topk_advantages must be filled (Open-MOPD's hook) before the loss")
    return topk_distill_loss(topk_logp, topk_logp_old, topk_advantages, mask, **options)


MopdState = tuple[Tensor, Tensor]
"""``(w [B] float64 row weights, A [B, T, K] rollout-time weighted advantages)`` of the current rollout batch."""


@dataclass(frozen=True)
class OpenMopdOptions(ClipOptions):
    """``algorithm.options`` of ``open_mopd`` (the paper's defaults).

    Attributes:
        balance: token-share and gap-following weights; False is naive multi-teacher OPD (weights 1).
        targets: token-share target ratios in the task's domain order (null: equal, the paper's 1/3 each).
        gap_alpha: $\\alpha$ of the gap factor; null: token-share only.
        gap_reference: ``mean`` (the paper's plain mean over domains) or ``share_weighted`` (the released code).
        refresh: recompute the reward from the current student before every later update of a batch.
        clip_low, clip_high, dual_clip: the dual-clip PPO range.
    """

    clip_high: Annotated[float, Range(0.0, None, low_open=True)] = 0.28
    dual_clip: Annotated[float, Range(1.0, None, low_open=True)] | None = 3.0
    balance: bool = True
    targets: list[Annotated[float, Range(0.0)]] | None = None
    gap_alpha: Annotated[float, Range(0.0)] | None = 1.0
    gap_reference: Literal["mean", "share_weighted"] = "mean"
    refresh: bool = True

    def check(self) -> None:
        if self.targets is not None and not (len(self.targets) > 0 and sum(self.targets) > 0):
            raise DomainError(
                f"targets: expected non-negative token-share ratios in the task's domain order, not all 0, "
                f"got {self.targets!r}"
            )


def open_mopd_algorithm(horizon: int, options: OpenMopdOptions | None = None) -> Algorithm:
    """The Open-MOPD bundle (options: `OpenMopdOptions`); ``horizon`` is unused by the token-mean aggregation.

    Examples:
        >>> sorted(map(str, open_mopd_algorithm(8).needs))
        ['logp_old', 'topk_ids', 'topk_logp_old', 'topk_logp_teacher']
    """
    o = options or OpenMopdOptions()
    balance, gap_alpha, gap_reference, refresh = o.balance, o.gap_alpha, o.gap_reference, o.refresh
    target = None if o.targets is None else torch.tensor([float(x) for x in o.targets], dtype=torch.float64)
    loss = functools.partial(mopd_policy_loss, clip_low=o.clip_low, clip_high=o.clip_high, dual_clip=o.dual_clip)

    def domain_of(batch: RolloutBatch) -> Tensor:
        if batch.domain is not None:
            return batch.domain
        return torch.zeros(batch.batch_size, dtype=torch.long, device=batch.mask.device)

    def rollout_reward(batch: RolloutBatch) -> Tensor:
        """``[B, T, K]`` unweighted reward of the rollout-time student."""
        assert batch.topk_logp_old is not None and batch.topk_logp_teacher is not None  # declared in `needs`
        return topk_reverse_kl_reward(batch.topk_logp_old, batch.topk_logp_teacher, batch.mask)

    def weights(batch: RolloutBatch, reward: Tensor) -> Tensor:
        """``[B]`` float64 row weights over the whole batch's loss tokens."""
        if not balance:
            return torch.ones(batch.batch_size, dtype=torch.float64, device=batch.mask.device)
        domain = domain_of(batch)
        tgt = target if target is not None else torch.ones(int(domain.max()) + 1, dtype=torch.float64)
        return mopd_domain_weights(
            domain, batch.loss_mask(), reward, targets=tgt, gap_alpha=gap_alpha, gap_reference=gap_reference
        )

    def advantage(batch: RolloutBatch) -> Tensor:
        reward = rollout_reward(batch)
        return (reward * weights(batch, reward).to(reward.dtype).reshape(-1, 1, 1)).sum(-1)

    def domain_metrics(batch: RolloutBatch, reward: Tensor, w: Tensor) -> dict[str, Tensor]:
        lm, domain = batch.loss_mask(), domain_of(batch)
        n = int(domain.max()) + 1
        counts = domain_token_counts(domain, lm, n)
        gaps = domain_gap_magnitudes(reward, lm, domain, n)
        zeros = torch.zeros(n, dtype=torch.float64, device=w.device)
        rows = zeros.index_add(0, domain, torch.ones_like(w))
        rewards = zeros.index_add(0, domain, batch.rewards.to(torch.float64))
        row_w = zeros.index_add(0, domain, w)
        out = {"mopd/reverse_kl": -masked_mean(reward.sum(-1), lm)}
        for d in (counts > 0).nonzero().squeeze(-1).tolist():
            out |= {
                f"mopd/d{d}/token_share": counts[d] / counts.sum(),
                f"mopd/d{d}/gap": gaps[d],
                f"mopd/d{d}/weight": row_w[d] / rows[d],
                f"mopd/d{d}/reward": rewards[d] / rows[d],
            }
        return out

    def before_update(
        batch: RolloutBatch, state: MopdState | None, ctx: UpdateContext
    ) -> tuple[RolloutBatch, MopdState, dict[str, Tensor]]:
        assert batch.topk_logp_teacher is not None  # declared in `needs`
        if state is None:  # the batch's first update: weights from the rollout-time reward, once
            reward = rollout_reward(batch)
            w = weights(batch, reward)
            adv = reward * w.to(reward.dtype).reshape(-1, 1, 1)
            return batch.replace(topk_advantages=adv), (w, adv), domain_metrics(batch, reward, w)
        w, stale = state
        if not refresh:
            return batch.replace(topk_advantages=stale), state, {}
        with torch.no_grad():
            now = StudentTopK(ctx.model, k=1, temperature=ctx.temperature).logp(batch)  # a forward on topk_ids
        adv = refreshed_reward(now, batch.topk_logp_teacher, batch.mask, w)
        change = masked_mean((adv - stale).abs().mean(-1), batch.loss_mask())
        return batch.replace(topk_advantages=adv), state, {"mopd/refresh_change": change}

    hook: Callable[..., Any] = before_update
    return Algorithm(
        advantage=advantage,
        policy_loss=loss,
        aggregation=AggregationMode.TOKEN_MEAN,
        horizon=int(horizon),
        needs=OPEN_MOPD_NEEDS,
        loss_needs=(Need.TOPK_LOGP_OLD, Need.TOPK_ADVANTAGES),
        before_update=hook,
        forward=topk_forward,
    )
