r"""The computations behind paper 20's checks (`posttrain.paper_checks.p20_tsallis`).

- 20a: relative errors of the escape-time formulas of `posttrain.theory.tsallis` against each
  other (closed forms vs quadrature, model M2 vs M1, discrete gradient ascent vs the flow time).
- 20b: the stochastic cold-start experiment: a K-armed softmax bandit with one rewarded arm
  ($p_0 = 1/K$) trained from uniform logits by the toy loop, with the methods the paper compares.

The paper file states the claims and turns these numbers into metrics and comparisons.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import garl_advantages, paft_advantages
from posttrain.simulators.bandits import SoftmaxBandit
from posttrain.simulators.loop import EstimatorBundle, bundle, train
from posttrain.theory import tsallis as th

__all__ = ["closed_form_error", "cold_start_methods", "discrete_error", "escape_steps", "flow_times", "m2_error"]


# ---------------------------------------------------------------- 20a: escape-time formulas


def closed_form_error(p0s: Iterable[float], *, p_esc: float) -> float:
    """Max relative error of the M1 closed forms (q in {0, 1}) against quadrature over ``p0s``."""
    return max(
        abs(th.escape_time_closed_form(p, q, p_esc=p_esc) / th._m1_quadrature(p, q, p_esc) - 1.0)
        for p in p0s
        for q in (0.0, 1.0)
    )


def m2_error(ks: Iterable[int], qs: Iterable[float], *, p_esc: float) -> float:
    """Max relative error of $T_{M2}(1/K) = (K-1)/K\\, T_{M1}(1/K)$ over ``ks`` x ``qs``."""
    qs = tuple(qs)
    return max(
        abs(
            th.escape_time(1.0 / k, q, model="softmax", K=k, p_esc=p_esc)
            / ((k - 1) / k * th.escape_time(1.0 / k, q, p_esc=p_esc))
            - 1.0
        )
        for k in ks
        for q in qs
    )


def discrete_error(p0s: Iterable[float], qs: Iterable[float], *, eta: float, p_esc: float) -> float:
    """Max relative error of (discrete ascent steps x ``eta``) against the flow escape time."""
    qs = tuple(qs)
    return max(
        abs(th.discrete_escape_steps(p, q, eta=eta, p_esc=p_esc) * eta / th.escape_time(p, q, p_esc=p_esc) - 1.0)
        for p in p0s
        for q in qs
    )


# ---------------------------------------------------------------- 20b: stochastic cold-start escape


def _garl(q: float) -> Callable[[Tensor, Tensor], Tensor]:
    def advantage(rewards: Tensor, uniforms: Tensor) -> Tensor:
        return garl_advantages(rewards, q=q)

    return advantage


def _paft(q: float) -> Callable[[Tensor, Tensor], Tensor]:
    def advantage(rewards: Tensor, uniforms: Tensor) -> Tensor:
        return paft_advantages(rewards, uniforms, q=q)

    return advantage


def cold_start_methods(
    garl_qs: Iterable[float], paft_q: float, *, substitute: Sequence[tuple[str, str]] = ()
) -> dict[str, EstimatorBundle]:
    """RLOO, GRPO, GARL at each of ``garl_qs`` and PAFT at ``paft_q``, all through the PPO-clip surrogate.

    ``substitute`` pairs (method, stand-in) train a method as another one (the checks' mutants).

    Raises:
        DomainError: ``substitute`` names a method that is not among them.
    """
    agg = "seq-mean-token-sum"  # (1/(G M)) sum over samples of the sequence's summed log-prob
    out = {"RLOO": bundle("rloo", "ppo_clip", agg), "GRPO": bundle("grpo", "ppo_clip", agg)}
    for q in garl_qs:
        out[f"GARL q={q:g}"] = bundle(_garl(q), "ppo_clip", agg)
    out[f"PAFT q={paft_q:g}"] = bundle(_paft(paft_q), "ppo_clip", agg)
    stand_in = dict(substitute)
    unknown = sorted((set(stand_in) | set(stand_in.values())) - set(out))
    if unknown:
        raise DomainError(f"substitute: unknown methods {unknown}; compared: {sorted(out)}")
    return {name: out[stand_in.get(name, name)] for name in out}


def flow_times(k_arms: int, qs: Iterable[float], *, p_esc: float) -> dict[float, float]:
    """Gradient-flow escape times of the K-armed softmax model (M2) from p0 = 1/K, per q."""
    return {q: th.escape_time(1.0 / k_arms, q, model="softmax", K=k_arms, p_esc=p_esc) for q in qs}


def escape_steps(
    k_arms: int,
    method: EstimatorBundle,
    *,
    seeds: Sequence[int] | int,
    samples: int,
    lr: float,
    max_steps: int,
    p_esc: float,
) -> np.ndarray:
    """Per-seed step at which the exact success probability first reaches ``p_esc`` (censored at ``max_steps``).

    SGD with learning rate ``lr`` on the logits of a ``k_arms``-armed bandit whose arm 0 alone is
    rewarded, from uniform logits, ``samples`` draws per step; ``seeds`` (a count: ``0 .. seeds - 1``)
    are paired across methods.
    """
    n_seeds = seeds if isinstance(seeds, int) else len(seeds)
    rewards = torch.zeros(1, k_arms, dtype=torch.float64)
    rewards[0, 0] = 1.0
    env = SoftmaxBandit(rewards, pass_ks=())
    log = train(
        env,
        torch.zeros(n_seeds, 1, k_arms, dtype=torch.float64),
        method,
        lambda ps: torch.optim.SGD(ps, lr=lr),
        steps=max_steps,
        k=samples,
        seeds=seeds,
        stop_when=lambda m: m["success"] >= p_esc,
    )
    hit = log.first_hit.numpy().astype(np.float64)
    return np.where(hit < 0, float(max_steps), hit)
