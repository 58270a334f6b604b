r"""GARL and PAFT, the Tsallis loss continuum $J_Q$, as `Algorithm` bundles (docs: methods/tsallis.md).

The M = K traces of a prompt carry detached weights $w_m = p(y^\star\mid x, z_m)$ in log space,
``log_w [G, K]``, computed by `log_weights` on the **whole** rollout batch in ``advantage(batch)`` (no
grad, before any micro-batching, like GRPO's advantages):

- **verifier** (``variant: verifier``): $w_m = r_m$, the task's reward ($\log 0 = -\infty$: weight 0); no
  pathwise term;
- **likelihood** (``variant: likelihood``, the paper's setting): $\log w_m = \sum_u \log\pi(y^\star_u\mid
  x, z_m, y^\star_{<u})$, the summed behaviour log-probs of the gold answer appended after the trace by
  ``rollout.answer_suffix`` (`posttrain.llm.rollout.answer`: same delimiter as the verifier reads at
  evaluation). The answer tokens are response positions of the same rows, so the training forward scores
  them with gradient: the pathwise term $w_m\nabla\log p_\theta(y^\star\mid x, z_m)$ comes from the same
  forward as the trace term.

From ``log_w`` the estimators give per-trace weights in normalised units (never exponentiating a tiny
$w$ alone): GARL (`garl_weights`) $\bar w^{-q}(w_m - b_m)$ on the trace tokens (RLOO baseline, or
``baseline: none``) and $\bar w^{-q}w_m$ on the answer tokens; PAFT (`paft_weights`)
$M\bar w^{1-q}c_m/S$ on both, $c_m$ the count of trace m among ``samples`` = S posterior resamples drawn
before the batch's first update from the update's own seed (`UpdateContext.seed`; the ``advantage`` slot
holds their expectation, GARL's b = 0 weights, until then). `tsallis_token_weights` puts them on the
tokens (stored in the advantage slot), the loss is `weighted_logp_loss` $-W\log\pi$ with
``seq-mean-token-sum`` aggregation: $\frac1{GM}\sum_{g,m}\sum_t$, the surrogate whose gradient is the
estimator (sequence log-probs are sums: no length normalisation). A prompt with $\bar w = 0$ has weight 0
exactly (no $0^{-q}$).

Options (``algorithm.options``, checked at load): ``q`` in [0, 1] (default 0.75, the paper's cold-start
GARL choice and its best warm-start PAFT); ``variant``; ``baseline`` (GARL) or ``samples`` (PAFT);
``log_w_min`` (clamp of $\log\bar w$ from below, counted when it binds); ``q_after`` with ``switch_step``:
q from step ``switch_step + 1`` on (the stepwise SFT-then-RLVR schedule, ``q: 1, q_after: 0``).
Logged before every update: ``tsallis/q``, ``tsallis/log_amplification`` (mean over prompts with
$\bar w > 0$ of $\log\bar w^{-q}$; the amplification itself can exceed float range), ``tsallis/log_w_bar``,
``tsallis/dead_prompts`` (fraction with $\bar w = 0$: no signal), ``tsallis/clamped``.

Limits: q = 0 GARL is REINFORCE-RLOO on $w$; q = 1 GARL with b = 0 is the self-normalised (IWAE)
gradient; q = 1 PAFT is SFT on a posterior resample. Simplifications: the estimators are on-policy; with
``optim.updates_per_batch > 1`` later updates reuse the weights with no importance correction. PAFT
computes the forward and backward of all M rows (the rows not resampled have weight 0), so it costs
GARL's, not S/M of it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NamedTuple

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import AggregationMode, TsallisWeights, garl_weights, masked_mean, paft_weights
from posttrain.estimators.advantages import tsallis_token_weights
from posttrain.estimators.losses import weighted_logp_loss
from posttrain.llm.methods.algorithm import Algorithm, UpdateContext
from posttrain.llm.methods.needs import Need
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.typed import Checked, Range

__all__ = [
    "GarlOptions",
    "PaftOptions",
    "TsallisLossStats",
    "garl_algorithm",
    "log_weights",
    "paft_algorithm",
    "tsallis_metrics",
]

Variant = Literal["verifier", "likelihood"]
_UNIT = Range(0.0, 1.0)


class TsallisLossStats(NamedTuple):
    """0-d diagnostics of the loss (``pg/<name>``)."""

    weighted_frac: Tensor
    """Fraction of response tokens with a non-zero weight (PAFT: the resampled traces; 0 for dead prompts)."""


def log_weights(batch: RolloutBatch, variant: Variant) -> Tensor:
    r"""``[G, K]`` float64 log-weights $\log w$ of the batch's traces (see the module docstring), no grad.

    Raises:
        DomainError: a negative reward (verifier), or no ``answer_mask`` / ``logp_old`` (likelihood).
    """
    if variant == "verifier":
        r = batch.grouped_rewards().detach().double()
        if bool((r < 0).any()):
            raise DomainError("rewards: GARL / PAFT verifier weights w = r must be >= 0")
        return torch.log(r)
    if batch.answer_mask is None or batch.logp_old is None:
        raise DomainError(
            "batch: answer_mask and logp_old must be filled (rollout.answer_suffix) for the likelihood variant"
        )
    lp = torch.where(batch.answer_mask, batch.logp_old.detach().double(), 0.0).sum(-1)
    return lp.reshape(batch.num_groups, batch.group_size)


def _token_weights(batch: RolloutBatch, w: TsallisWeights, variant: Variant) -> Tensor:
    """Per-token weights ``[B, T]`` (the dtype of ``logp_old``, else of the rewards): trace weight on sampled
    tokens, answer weight on appended ones."""
    answer = batch.answer_mask if variant == "likelihood" else None
    trace = batch.mask if answer is None else batch.mask & ~answer
    like = batch.logp_old if batch.logp_old is not None else batch.rewards
    return tsallis_token_weights(w, trace, answer).to(like.device, like.dtype)


def tsallis_metrics(w: TsallisWeights, q: float, log_power: float) -> dict[str, Tensor]:
    r"""The logged statistics of a batch's weights: ``log_power`` $\cdot\log\bar w$ is the log-amplification."""
    alive = w.log_w_bar > -math.inf
    zero = torch.zeros((), dtype=w.log_w_bar.dtype)
    lwb = torch.where(alive, w.log_w_bar, zero)
    n = alive.sum().clamp(min=1)
    return {
        "tsallis/q": torch.tensor(float(q)),
        "tsallis/log_amplification": (log_power * lwb).sum() / n,
        "tsallis/log_w_bar": lwb.sum() / n,
        "tsallis/dead_prompts": (~alive).double().mean(),
        "tsallis/clamped": w.clamped.double().mean(),
    }


def _loss(
    logp: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor, answer_mask: Tensor | None = None
) -> tuple[Tensor, TsallisLossStats]:
    """`weighted_logp_loss` with the advantage slot as token weights (``answer_mask`` is already in them)."""
    loss = weighted_logp_loss(logp, advantages, mask)
    frac = masked_mean((advantages != 0).to(logp.dtype), mask) if bool(mask.any()) else logp.new_zeros(())
    return loss, TsallisLossStats(frac.detach())


@dataclass(frozen=True)
class _TsallisOptions(Checked):
    """The options GARL and PAFT share (see the module docstring)."""

    q: Annotated[float, _UNIT] = 0.75
    variant: Variant = "verifier"
    log_w_min: Annotated[float, Range(None, 0.0)] | None = None
    q_after: Annotated[float, _UNIT] | None = None
    switch_step: Annotated[int, Range(0, 10**8)] = 0

    def check(self) -> None:
        if (self.q_after is None) != (self.switch_step == 0):
            raise DomainError(
                f"switch_step: set q_after and switch_step >= 1 together (q from step switch_step + 1 on), got "
                f"q_after={self.q_after!r}, switch_step={self.switch_step!r}"
            )


@dataclass(frozen=True)
class GarlOptions(_TsallisOptions):
    """``algorithm.options`` of ``garl``: the shared ones and the trace baseline (``rloo`` or ``none``)."""

    baseline: Literal["rloo", "none"] = "rloo"


@dataclass(frozen=True)
class PaftOptions(_TsallisOptions):
    """``algorithm.options`` of ``paft``: the shared ones and the posterior resamples per prompt."""

    samples: Annotated[int, Range(1, 1 << 16)] = 1


def _scheduled(build: Callable[[float], Algorithm], q: float, q_after: float | None, switch_step: int) -> Algorithm:
    """``build(q)``, switching to ``build(q_after)`` after ``switch_step`` steps when ``q_after`` is set."""
    first = build(q)
    if q_after is None:
        return first
    second = build(q_after)
    return dataclasses.replace(first, schedule=lambda step, scores: first if step <= switch_step else second)


def _bundle(horizon: int, variant: Variant, advantage: Callable[[RolloutBatch], Tensor], hook: Any) -> Algorithm:
    return Algorithm(
        advantage=advantage,
        policy_loss=_loss,
        aggregation=AggregationMode.SEQ_MEAN_TOKEN_SUM,
        horizon=int(horizon),
        needs=frozenset({Need.LOGP_OLD, *((Need.ANSWER_MASK,) if variant == "likelihood" else ())}),
        loss_needs=(Need.ANSWER_MASK,) if variant == "likelihood" else (),
        before_update=hook,
    )


def garl_algorithm(horizon: int, options: GarlOptions | None = None) -> Algorithm:
    """The GARL bundle (``algorithm.method: garl``; options: `GarlOptions`)."""
    o = options or GarlOptions()
    v, baseline, log_w_min = o.variant, o.baseline, o.log_w_min

    def build(qv: float) -> Algorithm:
        def weights(batch: RolloutBatch) -> TsallisWeights:
            return garl_weights(log_weights(batch, v), q=qv, baseline=baseline, log_w_min=log_w_min)  # type: ignore[arg-type]

        def advantage(batch: RolloutBatch) -> Tensor:
            return _token_weights(batch, weights(batch), v)

        def hook(batch: RolloutBatch, state: None, ctx: UpdateContext) -> tuple[RolloutBatch, None, dict[str, Tensor]]:
            return batch, None, tsallis_metrics(weights(batch), qv, -qv)

        return _bundle(horizon, v, advantage, hook)

    return _scheduled(build, o.q, o.q_after, o.switch_step)


def paft_algorithm(horizon: int, options: PaftOptions | None = None) -> Algorithm:
    """The PAFT bundle (``algorithm.method: paft``; options: `PaftOptions`): ``samples`` posterior resamples per
    prompt, drawn before the batch's first update."""
    o = options or PaftOptions()
    v, samples, log_w_min = o.variant, o.samples, o.log_w_min

    def build(qv: float) -> Algorithm:
        def advantage(batch: RolloutBatch) -> Tensor:  # the expectation of the resampled weights (GARL, b = 0)
            w = garl_weights(log_weights(batch, v), q=qv, baseline="none", log_w_min=log_w_min)
            return _token_weights(batch, w, v)

        def hook(
            batch: RolloutBatch, state: Tensor | None, ctx: UpdateContext
        ) -> tuple[RolloutBatch, Tensor, dict[str, Tensor]]:
            gen = torch.Generator().manual_seed(ctx.seed)
            uniforms = torch.rand(batch.num_groups, samples, generator=gen, dtype=torch.float64)
            w = paft_weights(log_weights(batch, v), uniforms, q=qv, log_w_min=log_w_min)
            if state is None:  # first update of the batch: these resamples, kept for its other updates
                state = _token_weights(batch, w, v)
            return batch.replace(advantages=state), state, tsallis_metrics(w, qv, 1.0 - qv)

        return _bundle(horizon, v, advantage, hook)

    return _scheduled(build, o.q, o.q_after, o.switch_step)
