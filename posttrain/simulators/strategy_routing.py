r"""Strategy-routing chain policy: abstract strategies over an arithmetic chain with exact likelihoods.

docs: methods/select_improve.md (our design, encoding the mechanisms of Krishnamurthy et al. 2026, arXiv:2606.13125).
Types $\tau\in\{\text{eval}=0, \text{inv}=1\}$, strategies $s\in\{F=0, B=1\}$,
$\mathrm{nat}(\tau)=\tau$. Parameters (leading run axis ``R``, so many seeds/configs train
in one batched computation): routing logits ``psi [R, 2, 2]`` ($\pi_\psi(s\mid\tau)$),
per-step reliability ``a [R, 2]``, long-chain skill ``e [R, 2]``. Step ``t`` of strategy ``s``
succeeds with probability $p_t(s)=\sigma(a_s)\,q_s(t)$, $q_s(t)=1$ for $t\le T_0$
and $\sigma(e_s-\kappa(t-T_0))$ after. Exact success
$R(s,\tau,L)=\prod_{t\le L}p_t(s)\cdot(1 \text{ if } s=\mathrm{nat}(\tau) \text{ else } 1/p)$
and accuracy $\mathrm{Acc}(\tau,L)=\sum_s\pi_\psi(s\mid\tau)R(s,\tau,L)$ sit next to the
rollout sampler. SFT maximises demonstration log-likelihood with Adam; RL is GRPO (population-std
group advantages, plain SGD ascent on the trajectory log-likelihood's score function).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.simulators._base import SeedRNG

__all__ = [
    "ChainSpec",
    "RoutingParams",
    "exact_accuracy",
    "grpo_advantages_population_std",
    "init_routing_params",
    "routing",
    "sample_rollouts",
    "step_success",
    "strategy_success",
    "train_grpo_routing",
    "train_sft",
    "trajectory_loglik",
]

RoutingParams = dict[str, Tensor]  # {"psi": [R, 2, 2], "a": [R, 2], "e": [R, 2]}


@dataclass(frozen=True)
class ChainSpec:
    """Field size ``p``, skill horizon ``t0``, decay ``kappa`` and maximum chain length."""

    p: int = 11
    t0: int = 5
    kappa: float = 0.5
    max_len: int = 15


def init_routing_params(runs: int, *, e_init: tuple[float, float] = (6.0, 1.5)) -> RoutingParams:
    """psi = 0, a = 0, e = e_init for ``runs`` independent runs (float64)."""
    return {
        "psi": torch.zeros(runs, 2, 2, dtype=torch.float64),
        "a": torch.zeros(runs, 2, dtype=torch.float64),
        "e": torch.tensor(e_init, dtype=torch.float64).expand(runs, 2).clone(),
    }


def routing(params: RoutingParams) -> Tensor:
    r"""Routing $\pi_\psi(s\mid\tau)$, ``[R, types, strategies]``."""
    return torch.softmax(params["psi"], dim=-1)


def step_success(params: RoutingParams, spec: ChainSpec) -> Tensor:
    r"""Per-step success $p_t(s)$, ``[R, 2, max_len]`` for $t = 1..\text{max\_len}$."""
    t = torch.arange(1, spec.max_len + 1, dtype=params["a"].dtype)
    late = (t > spec.t0).to(t.dtype)
    q = torch.sigmoid(params["e"][..., None] - spec.kappa * (t - spec.t0)) * late + (1 - late)
    return torch.sigmoid(params["a"])[..., None] * q


def strategy_success(params: RoutingParams, spec: ChainSpec, lengths: Tensor) -> Tensor:
    r"""Exact $R(s,\tau,L)$, ``[R, types, strategies, len(lengths)]``."""
    if int(lengths.max()) > spec.max_len or int(lengths.min()) < 1:
        raise DomainError(f"lengths: expected values in [1, {spec.max_len}]")
    cum = torch.cumprod(step_success(params, spec), dim=-1)[..., lengths - 1]  # [R, S, nL]
    lottery = torch.where(torch.eye(2, dtype=torch.bool), 1.0, 1.0 / spec.p).to(cum.dtype)  # [tau, s]
    return cum[:, None, :, :] * lottery[None, :, :, None]


def exact_accuracy(params: RoutingParams, spec: ChainSpec, lengths: Tensor) -> Tensor:
    r"""$\mathrm{Acc}(\tau, L)=\sum_s\pi(s\mid\tau)R(s,\tau,L)$, ``[R, types, len(lengths)]``."""
    return (routing(params)[..., None] * strategy_success(params, spec, lengths)).sum(-2)


def sample_rollouts(
    params: RoutingParams, spec: ChainSpec, types: Tensor, lengths: Tensor, gens: list[torch.Generator]
) -> tuple[Tensor, Tensor, Tensor]:
    """Roll out ``types, lengths [R, M]``; return ``strategies``, ``fail_step`` (0: none), ``correct``, all ``[R, M]``.

    Steps are simulated in order and stop at the first failure ``t_f``; a successful unnatural
    chain then wins a lottery with probability ``1/p``.
    """
    r, m = types.shape
    u = SeedRNG(tuple(gens)).rand(m, spec.max_len + 2)  # [R, M, L+2], row r from gens[r]
    pi = routing(params).detach()[torch.arange(r)[:, None], types]  # [R, M, 2]
    strategies = (u[..., 0] >= pi[..., 0]).long()  # F with probability pi(F | tau)
    ps = step_success({k: v.detach() for k, v in params.items()}, spec)  # [R, 2, Lmax]
    pt = ps[torch.arange(r)[:, None], strategies]  # [R, M, Lmax]
    t = torch.arange(1, spec.max_len + 1)
    fails = (u[..., 1 : spec.max_len + 1] >= pt) & (t <= lengths[..., None])
    first = torch.where(fails.any(-1), fails.int().argmax(-1) + 1, torch.zeros_like(lengths))
    lottery = (strategies == types) | (u[..., -1] < 1.0 / spec.p)
    return strategies, first, (first == 0) & lottery


def trajectory_loglik(
    params: RoutingParams, spec: ChainSpec, types: Tensor, lengths: Tensor, strategies: Tensor, fail_step: Tensor
) -> Tensor:
    r"""Differentiable trajectory log-likelihood ``[R, M]`` (lottery term omitted: it is constant).

    $$
    \log\pi_\psi(s\mid\tau)+\sum_{t<t_f}\log p_t(s)+1[\text{failed}]\log(1-p_{t_f}(s))
    $$

    """
    r = types.shape[0]
    logpi = torch.log_softmax(params["psi"], dim=-1)[torch.arange(r)[:, None], types]  # [R, M, 2]
    lp = logpi.gather(-1, strategies[..., None]).squeeze(-1)
    pt = step_success(params, spec)[torch.arange(r)[:, None], strategies]  # [R, M, Lmax]
    t = torch.arange(1, spec.max_len + 1)
    stop = torch.where(fail_step > 0, fail_step, lengths)[..., None]
    ok = torch.where(t < stop, torch.log(pt), 0.0).sum(-1)
    ok = ok + torch.where(fail_step == 0, torch.log(pt.gather(-1, (lengths - 1)[..., None]).squeeze(-1)), 0.0)
    failed = torch.log1p(-pt.gather(-1, (fail_step - 1).clamp_min(0)[..., None]).squeeze(-1))
    return lp + ok + torch.where(fail_step > 0, failed, 0.0)


def grpo_advantages_population_std(rewards: Tensor, *, eps: float = 1e-6) -> Tensor:
    r"""Group advantages $A=(R-\bar R_G)/(\mathrm{std}_G+\epsilon)$, population std (ddof 0), last axis.

    The library's `group_normalized_advantages` uses the Bessel std
    (verl); the calibrated toy uses ddof 0, which matters under plain SGD.
    """
    centred = rewards - rewards.mean(-1, keepdim=True)
    return centred / (centred.square().mean(-1, keepdim=True).sqrt() + eps)


def train_sft(
    params: RoutingParams,
    allowed: Tensor,
    gens: list[torch.Generator],
    *,
    steps: int = 200,
    batch: int = 256,
    lr: float = 0.1,
    lengths: tuple[int, int] = (2, 5),
) -> RoutingParams:
    r"""Adam on the mean demonstration log-likelihood $\log\pi_\psi(s\mid\tau)+L\log\sigma(a_s)$.

    ``allowed [R, 2]`` marks the strategies of each run's SFT data (F-only, B-only, FB); ``e`` is
    untouched (demonstrations are no longer than $T_0$).
    """
    psi, a = params["psi"].clone().requires_grad_(True), params["a"].clone().requires_grad_(True)
    opt = torch.optim.Adam([psi, a], lr=lr, betas=(0.9, 0.999), eps=1e-8)
    r = psi.shape[0]
    probs = allowed.double() / allowed.double().sum(-1, keepdim=True)
    for _ in range(steps):
        draws = [
            (
                torch.randint(0, 2, (batch,), generator=g),
                torch.randint(lengths[0], lengths[1] + 1, (batch,), generator=g),
                torch.multinomial(probs[i], batch, replacement=True, generator=g),
            )
            for i, g in enumerate(gens)
        ]
        tau, length, s = (torch.stack(x) for x in zip(*draws, strict=True))
        logpi = torch.log_softmax(psi, -1)[torch.arange(r)[:, None], tau].gather(-1, s[..., None]).squeeze(-1)
        ll = logpi + length * torch.nn.functional.logsigmoid(a.gather(-1, s))
        opt.zero_grad()
        (-ll.mean(-1).sum()).backward()  # runs are independent: Adam is elementwise
        opt.step()
    return {"psi": psi.detach(), "a": a.detach(), "e": params["e"].clone()}


def train_grpo_routing(
    params: RoutingParams,
    spec: ChainSpec,
    gens: list[torch.Generator],
    *,
    w_eval: Tensor,
    lengths: tuple[int, int] | Tensor,
    steps: int = 200,
    batch: int = 64,
    group: int = 8,
    lr: float = 2.0,
    advantage: Callable[[Tensor], Tensor] = grpo_advantages_population_std,
) -> tuple[RoutingParams, Tensor]:
    r"""GRPO by plain SGD ascent: $\theta \leftarrow \theta + \frac{lr}{BG}\sum A\,\nabla\log p(\text{traj})$.

    ``w_eval [R]`` is each run's share of evaluation problems; ``lengths`` is one inclusive range
    ``(low, high)`` or per-run ranges ``[R, 2]``; ``advantage`` maps the rewards ``[R, B, G]`` to
    advantages of the same shape (default GRPO's, `grpo_advantages_population_std`). Returns the final
    parameters and the sampled forward share per update, ``[R, steps]``.
    """
    p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    r = w_eval.shape[0]
    rng = torch.as_tensor(lengths, dtype=torch.long).expand(r, 2)
    low, width = rng[:, :1], rng[:, 1:] - rng[:, :1] + 1
    shares = []
    for _ in range(steps):
        u = SeedRNG(tuple(gens)).rand(2, batch)  # [R, 2, B]
        types = (u[:, 0] >= w_eval[:, None].double()).long().repeat_interleave(group, dim=1)  # [R, B*G]
        length = (low + (u[:, 1] * width).long()).repeat_interleave(group, dim=1)
        strategies, fail, correct = sample_rollouts(p, spec, types, length, gens)
        adv = advantage(correct.double().reshape(r, batch, group)).reshape(r, -1)
        ll = trajectory_loglik(p, spec, types, length, strategies, fail)
        grads = torch.autograd.grad((adv * ll).mean(-1).sum(), list(p.values()))
        with torch.no_grad():
            for t, g in zip(p.values(), grads, strict=True):
                t.add_(lr * g)
        shares.append((strategies == 0).double().mean(-1))
    return {k: v.detach() for k, v in p.items()}, torch.stack(shares, dim=-1)
