r"""GFlowRL as an `Algorithm` bundle for the LLM trainer (docs: methods/gflowrl.md).

The trainer fills ``logp_ref`` (a reference forward) before the advantages, then calls the
bundle's ``advantage`` on the **whole** rollout batch: that is where the per-prompt statistics
are computed (the in-batch log-partition and the clipped flow gaps of
`posttrain.estimators.losses.flow.flow_gap`), once, before any micro-batching. The clipped gap
is stored in the batch's advantage slot (constant over a response, so advantage logs show flow
gaps). The per-token loss reads it back per row and applies
`posttrain.estimators.losses.flow.gflowrl_loss` with the precomputed gap (IS weight and
residual only depend on the row), so any split into micro-batches gives the same gradient.
Aggregation is ``seq-mean-token-sum`` (the mean over sequences of the per-sequence loss, Eq. 8).
No KL term (the reference enters through the gap) and no entropy bonus, as in the paper.

Selected in YAML as ``algorithm.method: gflowrl`` (registered as a `MethodBundle`; ``algorithm.options``:
`GFlowRLOptions`); the trainer then builds the reference filler because the bundle declares ``logp_ref``.

FlowRL, the baseline with a **learned** log-partition (``algorithm.method: flowrl``,
`flowrl_algorithm`): $\log Z_\phi(x)$ is a small MLP (`LogPartitionMLP`) over the mean
of the prompt's last hidden states, owned by the bundle (``Algorithm.modules``: the trainer optimises it
as a second parameter group, averages its gradients over ranks and checkpoints it). The features are a
no-grad batch field ``prompt_features [B, H]`` filled once per rollout by
`posttrain.llm.methods.needs.prompt_feature_filler` (one forward over the prompts with the behaviour
policy); the z-scored rewards are computed over whole groups in ``advantage`` and stored in the advantage slot; the loss is
`posttrain.estimators.losses.flow.flowrl_loss` per row. Before every update the bundle's hook logs
``flowrl/log_z`` (mean learned log Z over the prompts), ``flowrl/log_z_target`` (mean of the log Z that
minimises the loss at the rollout policy, `flowrl_optimal_log_z`) and
``flowrl/log_z_gap`` (mean absolute difference per prompt): a log Z that learns closes the gap. Simplifications vs FlowRL (arXiv:2509.15207):
the log Z gradient does not flow into the LM through the features (they are detached), the MLP has no
dropout, its width is an option (FlowRL: the model's hidden size) and it runs on the CPU in float32
unless moved (``build_trainer`` moves it to the policy's device; ``log Z`` is cast to the loss's device and dtype).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, NamedTuple

import torch
from torch import Tensor, nn

from posttrain.errors import DomainError
from posttrain.estimators import (
    AggregationMode,
    broadcast_sequence_advantages,
    flow_gap,
    flowrl_loss,
    flowrl_optimal_log_z,
    gflowrl_loss,
    group_normalized_advantages,
    masked_mean,
)
from posttrain.estimators.losses import FlowGap, LengthNorm
from posttrain.estimators.losses.flow import _check_flowrl_options
from posttrain.llm.methods.algorithm import Algorithm, UpdateContext
from posttrain.llm.methods.needs import Need
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.typed import Checked, Range

__all__ = [
    "FlowRLOptions",
    "FlowRLStats",
    "GFlowRLOptions",
    "GFlowRLStats",
    "LogPartitionMLP",
    "flowrl_algorithm",
    "gflowrl_algorithm",
]

_POSITIVE = Range(0.0, None, low_open=True)


class GFlowRLStats(NamedTuple):
    """0-d diagnostics logged by the trainer as ``pg/<name>``."""

    gap_saturation: Tensor
    """Fraction of responses whose clipped gap sits at a clip bound (the clip is active)."""
    abs_gap: Tensor
    """Mean absolute clipped flow gap."""
    is_weight_mean: Tensor
    """Mean sequence IS weight (1 on the first update of a batch)."""


@dataclass(frozen=True)
class GFlowRLOptions(Checked):
    """``algorithm.options`` of ``gflowrl`` (the paper's beta = 8, Eq. 7 clip bounds, IS cap 2, ``paper`` variant)."""

    beta: Annotated[float, _POSITIVE] = 8.0
    variant: LengthNorm = LengthNorm.PAPER
    max_up: Annotated[float, Range(0.0)] = 0.2
    max_down: Annotated[float, Range(0.0)] = 0.28
    is_cap: Annotated[float, _POSITIVE] = 2.0


def gflowrl_algorithm(horizon: int, options: GFlowRLOptions | None = None) -> Algorithm:
    """The GFlowRL bundle (options: `GFlowRLOptions`)."""
    o = options or GFlowRLOptions()
    beta, v, max_up, max_down, is_cap = o.beta, LengthNorm.parse(o.variant), o.max_up, o.max_down, o.is_cap

    def advantage(batch: RolloutBatch) -> Tensor:
        assert batch.logp_old is not None and batch.logp_ref is not None  # declared in `needs`
        gap = flow_gap(
            batch.grouped_rewards(), batch.logp_old, batch.logp_ref, batch.mask,
            beta=beta, variant=v, max_up=max_up, max_down=max_down,
        )  # fmt: skip
        return broadcast_sequence_advantages(gap.clipped_gap, batch.mask)

    def policy_loss(logp: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor) -> tuple[Tensor, GFlowRLStats]:
        rows = logp.shape[0]
        g = masked_mean(advantages, mask, dim=-1).reshape(rows, 1)  # the row's clipped gap
        lengths = mask.sum(-1).to(logp.dtype).reshape(rows, 1)
        zeros = torch.zeros(rows, 1, dtype=logp.dtype, device=logp.device)
        gap = FlowGap(g, g, zeros[:, 0], lengths, lengths > 0)
        loss, diag = gflowrl_loss(logp, logp_old, logp_old, zeros, mask, variant=v, is_cap=is_cap, gap=gap)
        with torch.no_grad():
            at_bound = ((g <= -max_up) | (g >= max_down)) & (lengths > 0)
            stats = GFlowRLStats(masked_mean(at_bound.to(logp.dtype), lengths > 0), g.abs().mean(), diag.is_weight_mean)
        return loss, stats

    return Algorithm(
        advantage=advantage,
        policy_loss=policy_loss,
        aggregation=AggregationMode.SEQ_MEAN_TOKEN_SUM,
        horizon=int(horizon),
        needs=frozenset({Need.LOGP_OLD, Need.LOGP_REF}),
    )


# ---------------------------------------------------------------- FlowRL: learned log-partition


class _SeededLazyLinear(nn.LazyLinear):
    """``LazyLinear`` whose weights, once the input width is known, are drawn from its own seeded generator."""

    cls_to_become = nn.Linear  # type: ignore[assignment]

    def __init__(self, out_features: int, seed: int) -> None:
        self.seed = seed
        super().__init__(out_features)

    def reset_parameters(self) -> None:
        if self.has_uninitialized_params() or self.in_features == 0:
            return
        _init_linear(self, torch.Generator().manual_seed(self.seed))


def _init_linear(layer: nn.Linear, gen: torch.Generator) -> None:
    """PyTorch's default ``Linear`` initialisation (U(+-1/sqrt(fan_in))) from an explicit CPU generator.

    Drawn on the CPU and copied, so a module moved to another device before its lazy layer materialises
    gets the same weights (a CPU generator cannot fill a CUDA tensor).
    """
    bound = layer.in_features**-0.5
    with torch.no_grad():
        for param in (layer.weight, layer.bias):
            if param is not None:
                param.copy_(torch.empty(param.shape, dtype=param.dtype).uniform_(-bound, bound, generator=gen))


class LogPartitionMLP(nn.Module):
    r"""FlowRL's $\log Z_\phi(x)$: three linear layers (GELU + LayerNorm between) from ``[N, H]`` features to ``[N]``.

    The input width ``H`` is inferred at the first call (the model's hidden size is not known when the
    bundle is built); every weight is drawn from generators seeded by ``seed`` (same seed, same module).

    Examples:
        >>> mlp = LogPartitionMLP(width=8, seed=0)
        >>> mlp(torch.zeros(3, 5)).shape, mlp.net[0].weight.shape
        (torch.Size([3]), torch.Size([8, 5]))
    """

    def __init__(self, *, width: int = 64, seed: int = 0) -> None:
        super().__init__()
        if int(width) < 1:
            raise DomainError(f"width: expected an integer >= 1, got {width!r}")
        w = int(width)
        self.net = nn.Sequential(
            _SeededLazyLinear(w, seed), nn.GELU(), nn.LayerNorm(w),
            nn.Linear(w, w), nn.GELU(), nn.LayerNorm(w), nn.Linear(w, 1),
        )  # fmt: skip
        gen = torch.Generator().manual_seed(seed + 1)
        for layer in (self.net[3], self.net[6]):
            _init_linear(layer, gen)  # type: ignore[arg-type]

    def forward(self, features: Tensor) -> Tensor:
        """``[N, H]`` features -> ``[N]`` log-partitions."""
        return self.net(features).squeeze(-1)  # type: ignore[no-any-return]


class FlowRLStats(NamedTuple):
    """0-d diagnostics of the loss (``pg/<name>`` in the trainer's update statistics)."""

    log_z: Tensor
    r"""Mean learned $\log Z_\phi(x)$ over the rows."""
    is_weight_mean: Tensor
    """Mean clipped sequence IS weight."""
    is_clip_frac: Tensor
    """Fraction of responses whose IS weight is clipped."""


@dataclass(frozen=True)
class FlowRLOptions(Checked):
    """``algorithm.options`` of ``flowrl``: FlowRL's beta = 15 on z-scored rewards, IS clip 0.2; the log-partition
    MLP's width and the seed of its initialisation."""

    beta: Annotated[float, _POSITIVE] = 15.0
    clip: Annotated[float, Range(0.0, 1.0, low_open=True, high_open=True)] = 0.2
    width: Annotated[int, Range(1, 1 << 16)] = 64
    seed: Annotated[int, Range(0, 2**63 - 1)] = 0


def flowrl_algorithm(horizon: int, options: FlowRLOptions | None = None) -> Algorithm:
    """The FlowRL bundle (options: `FlowRLOptions`) with its log-partition MLP."""
    o = options or FlowRLOptions()
    beta, clip = _check_flowrl_options(o.beta, o.clip)
    log_z_net = LogPartitionMLP(width=o.width, seed=o.seed)

    def _log_z(features: Tensor, like: Tensor) -> Tensor:  # the MLP where it lives, log Z where the loss is
        param = next(log_z_net.net[-1].parameters())
        out: Tensor = log_z_net(features.to(param.device, param.dtype))
        return out.to(like.device, like.dtype)

    def advantage(batch: RolloutBatch) -> Tensor:  # z-scored rewards over whole groups
        return broadcast_sequence_advantages(group_normalized_advantages(batch.grouped_rewards()), batch.mask)

    def policy_loss(
        logp: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor, *, logp_ref: Tensor, prompt_features: Tensor
    ) -> tuple[Tensor, FlowRLStats]:
        rows = logp.shape[0]
        r_hat = masked_mean(advantages, mask, dim=-1).reshape(rows, 1)  # the row's z-scored reward
        log_z = _log_z(prompt_features, logp)
        shape = torch.zeros(rows, 1, dtype=logp.dtype, device=logp.device)
        loss, diag = flowrl_loss(logp, logp_old, logp_ref, shape, mask, log_z, beta=beta, clip=clip, r_hat=r_hat)
        return loss, FlowRLStats(log_z.detach().mean(), diag.is_weight_mean, diag.clip_frac)

    def log_partition_metrics(
        batch: RolloutBatch, state: None, ctx: UpdateContext
    ) -> tuple[RolloutBatch, None, dict[str, Tensor]]:
        assert batch.prompt_features is not None and batch.logp_old is not None and batch.logp_ref is not None
        with torch.no_grad():
            log_z = _log_z(batch.prompt_features[:: batch.group_size], batch.logp_old)  # [G]
            target = flowrl_optimal_log_z(batch.logp_old, batch.logp_old, batch.logp_ref, batch.grouped_rewards(),
                                          batch.mask, beta=beta, clip=clip)  # fmt: skip
        gap = (log_z - target).abs().mean()
        return (
            batch,
            None,
            {"flowrl/log_z": log_z.mean(), "flowrl/log_z_target": target.mean(), "flowrl/log_z_gap": gap},
        )

    return Algorithm(
        advantage=advantage,
        policy_loss=policy_loss,
        aggregation=AggregationMode.SEQ_MEAN_TOKEN_SUM,
        horizon=int(horizon),
        needs=frozenset({Need.LOGP_OLD, Need.LOGP_REF, Need.PROMPT_FEATURES}),
        loss_needs=(Need.LOGP_REF, Need.PROMPT_FEATURES),
        before_update=log_partition_metrics,
        modules=(log_z_net,),
    )
