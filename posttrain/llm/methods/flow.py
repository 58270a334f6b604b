r"""GFlowRL as an `Algorithm` bundle for the LLM trainer (docs: methods/gflowrl.md).

The trainer fills ``logp_ref`` (a reference forward) before the advantages, then calls the
bundle's ``advantage`` on the **whole** rollout batch: that is where the per-prompt statistics
are computed (the in-batch log-partition and the clipped flow gaps of
`posttrain.estimators.gflowrl.flow_gap`), once, before any micro-batching. The clipped gap
is stored in the batch's advantage slot (constant over a response, so advantage logs show flow
gaps). The per-token loss reads it back per row and applies
`posttrain.estimators.gflowrl.gflowrl_loss` with the precomputed gap (IS weight and
residual only depend on the row), so any split into micro-batches gives the same gradient.
Aggregation is ``seq-mean-token-sum`` (the mean over sequences of the per-sequence loss, Eq. 8).
No KL term (the reference enters through the gap) and no entropy bonus, as in the paper.

Selected in YAML as ``algorithm.method: gflowrl`` (registered as a
`MethodBundle`; ``algorithm.options`` are this factory's keyword
options); the trainer then builds the reference filler because the bundle declares ``logp_ref``.

FlowRL, the baseline with a **learned** log-partition (``algorithm.method: flowrl``,
`flowrl_algorithm`): $\log Z_\phi(x)$ is a small MLP (`LogPartitionMLP`) over the mean
of the prompt's last hidden states, owned by the bundle (``Algorithm.modules``: the trainer optimises it
as a second parameter group, averages its gradients over ranks and checkpoints it). The features are a
no-grad batch field ``prompt_features [B, H]`` filled once per rollout by `prompt_feature_filler`
(one forward over the prompts with the behaviour policy); the z-scored rewards are computed over whole
groups in ``advantage`` and stored in the advantage slot; the loss is
`posttrain.estimators.gflowrl.flowrl_loss` per row. Before every update the bundle's hook logs
``flowrl/log_z`` (mean learned log Z over the prompts), ``flowrl/log_z_target`` (mean of the log Z that
minimises the loss at the rollout policy, `flowrl_optimal_log_z`) and
``flowrl/log_z_gap`` (mean absolute difference per prompt): a log Z that learns closes the gap. Simplifications vs FlowRL (arXiv:2509.15207):
the log Z gradient does not flow into the LM through the features (they are detached), the MLP has no
dropout, its width is an option (FlowRL: the model's hidden size) and it runs on the CPU in float32
unless moved (``build_trainer`` moves it to the policy's device; ``log Z`` is cast to the loss's device and dtype).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from posttrain.errors import DomainError
from posttrain.estimators import (
    AggregationMode,
    broadcast_sequence_advantages,
    group_normalized_advantages,
    masked_mean,
)
from posttrain.estimators.gflowrl import (
    FlowGap,
    LengthNorm,
    _check_flowrl_options,
    flow_gap,
    flowrl_loss,
    flowrl_optimal_log_z,
    gflowrl_loss,
)
from posttrain.llm.methods.algorithm import Algorithm, UpdateContext
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.logprobs import position_ids, widened

__all__ = [
    "FlowRLStats",
    "GFlowRLStats",
    "LogPartitionMLP",
    "flowrl_algorithm",
    "gflowrl_algorithm",
    "prompt_feature_filler",
]


class GFlowRLStats(NamedTuple):
    """0-d diagnostics logged by the trainer as ``pg/<name>``."""

    gap_saturation: Tensor
    """Fraction of responses whose clipped gap sits at a clip bound (the clip is active)."""
    abs_gap: Tensor
    """Mean absolute clipped flow gap."""
    is_weight_mean: Tensor
    """Mean sequence IS weight (1 on the first update of a batch)."""


def gflowrl_algorithm(
    horizon: int,
    *,
    beta: float = 8.0,
    variant: LengthNorm | str = LengthNorm.PAPER,
    max_up: float = 0.2,
    max_down: float = 0.28,
    is_cap: float = 2.0,
) -> Algorithm:
    """The GFlowRL bundle (defaults: the paper's beta = 8, Eq. 7 bounds, IS cap 2, ``paper`` length variant)."""
    v = LengthNorm.parse(variant)

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
        needs=frozenset({"logp_old", "logp_ref"}),
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


def prompt_feature_filler(model: Any) -> Callable[[RolloutBatch], Tensor]:
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


class FlowRLStats(NamedTuple):
    """0-d diagnostics of the loss (``pg/<name>`` in the trainer's update statistics)."""

    log_z: Tensor
    r"""Mean learned $\log Z_\phi(x)$ over the rows."""
    is_weight_mean: Tensor
    """Mean clipped sequence IS weight."""
    is_clip_frac: Tensor
    """Fraction of responses whose IS weight is clipped."""


def flowrl_algorithm(
    horizon: int, *, beta: float = 15.0, clip: float = 0.2, width: int = 64, seed: int = 0
) -> Algorithm:
    """The FlowRL bundle (FlowRL's beta = 15 on z-scored rewards, IS clip 0.2) with its log-partition MLP."""
    beta, clip = _check_flowrl_options(beta, clip)  # at the config edge, not at the first loss
    log_z_net = LogPartitionMLP(width=width, seed=seed)

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
        needs=frozenset({"logp_old", "logp_ref", "prompt_features"}),
        loss_needs=("logp_ref", "prompt_features"),
        before_update=log_partition_metrics,
        modules=(log_z_net,),
    )
