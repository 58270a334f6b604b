r"""Self-Routing: route each prompt to GRPO / OPSD / REG / SKIP from its rollouts' behaviour state.

Per prompt (G prompts, K rollouts each): accuracy memberships $\omega(a_x)=[l,m,h]$
(Gaussian kernels at 0, 0.5, 1, normalised), batch-calibrated entropy confidences and the
features $(\tilde c,\tilde c^+,\tilde c^-,\widetilde{\Delta c})$, four scores, a plain
normalisation $p = s/\sum s$ and one categorical draw per prompt from an explicit
``torch.Generator``. The route of every prompt is one of `RECIPES`; the four queues are a
partition of the batch (`route_masks`). `routed_loss` combines per-queue mean losses
weighted by queue size, SKIP counted nowhere. The matched-marginal random router is the baseline.

*Reconstructed* (docs: methods/self_routing.md): the confidence features ($\tilde c^\pm$ = mean confidence
of the correct / incorrect rollouts, 0 if none; $\widetilde{\Delta c}$ = batch min-max
rescaled deviation) and the min-max entropy normalisation.

Reference: Li, Zhang, Huang, Ma, Liu, Liu 2026, From Rollouts to Recipes (arXiv:2609.01422).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators.aggregation import masked_mean
from posttrain.registry import Registry, registry
from posttrain.shapes import Bool, Float, Int
from posttrain.validate import check_choice, check_finite, check_float, check_mask, check_tensor

__all__ = [
    "RECIPES",
    "ROUTERS",
    "DeltaMode",
    "Recipe",
    "accuracy_memberships",
    "confidence_features",
    "random_routes",
    "rollout_confidence",
    "route_masks",
    "router_probabilities",
    "router_scores",
    "sample_routes",
    "self_routing_probabilities",
]


_PAPER = "Li et al. 2026, From Rollouts to Recipes, arXiv:2609.01422"

ROUTERS: Registry[Any] = registry("router")


class Recipe(int, Enum):
    """Route labels (the integer is the column of the score / probability tensors)."""

    GRPO = 0
    OPSD = 1
    REG = 2
    SKIP = 3


RECIPES: tuple[Recipe, ...] = tuple(Recipe)


class DeltaMode(str, Enum):
    """How the confidence deviation $\\Delta c_x$ is mapped to [0, 1]."""

    MINMAX = "minmax"
    """Batch min-max rescaling (default)."""
    CLIP = "clip"
    """$\\mathrm{clip}(0.5 + \\Delta c_x, 0, 1)$."""


def _minmax(x: Tensor, eps: float, dims: tuple[int, ...]) -> Tensor:
    lo, hi = x.amin(dim=dims, keepdim=True), x.amax(dim=dims, keepdim=True)
    return (x - lo) / (hi - lo + eps)


def accuracy_memberships(
    accuracy: Float[Tensor, "*R G"], *, sigma_l: float = 0.18, sigma_m: float = 0.16, sigma_h: float = 0.18
) -> Float[Tensor, "*R G 3"]:
    r"""Normalised Gaussian memberships $\omega(a) = [l, m, h]/(l+m+h)$.

    $$
    l = e^{-a^2/2\sigma_l^2},\quad m = e^{-(a-0.5)^2/2\sigma_m^2},\quad h = e^{-(a-1)^2/2\sigma_h^2}
    $$

    Examples:
        >>> [round(x, 3) for x in accuracy_memberships(torch.tensor([0.5]))[0].tolist()]
        [0.02, 0.959, 0.02]
    """
    check_float("accuracy", accuracy)
    check_finite("accuracy", accuracy)
    centres = torch.tensor([0.0, 0.5, 1.0], dtype=accuracy.dtype, device=accuracy.device)
    sig = torch.tensor([sigma_l, sigma_m, sigma_h], dtype=accuracy.dtype, device=accuracy.device)
    if bool((sig <= 0).any()):
        raise DomainError(f"sigma_l, sigma_m, sigma_h: expected positive widths, got {sig.tolist()}")
    log_k = -((accuracy.unsqueeze(-1) - centres) ** 2) / (2 * sig**2)
    return torch.softmax(log_k, dim=-1)  # = kernel / sum(kernel), without underflow to 0/0


def rollout_confidence(mean_entropy: Float[Tensor, "*R G K"], *, eps: float = 1e-6) -> Float[Tensor, "*R G K"]:
    r"""Per-rollout confidence $\kappa_i = 1 - \mathrm{Norm}_{\mathcal B}(\bar H_i)$ (batch min-max, in [0, 1]).

    The routing batch is the last two axes ``[G, K]``; leading axes ``*R`` are independent batches.

    Examples:
        >>> [[round(x, 4) for x in row] for row in rollout_confidence(torch.tensor([[0.0, 2.0], [1.0, 1.0]])).tolist()]
        [[1.0, 0.0], [0.5, 0.5]]
    """
    check_float("mean_entropy", mean_entropy)
    if mean_entropy.ndim < 2:
        raise ShapeError(f"mean_entropy: expected shape [*R, G, K], got {list(mean_entropy.shape)}")
    check_finite("mean_entropy", mean_entropy)
    return (1.0 - _minmax(mean_entropy, eps, (-2, -1))).clamp(0.0, 1.0)


def confidence_features(
    kappa: Float[Tensor, "*R G K"],
    correct: Bool[Tensor, "*R G K"],
    *,
    delta_mode: DeltaMode | str = DeltaMode.MINMAX,
    eps: float = 1e-6,
) -> Float[Tensor, "*R G 4"]:
    r"""The (*reconstructed*) features $(\tilde c, \tilde c^+, \tilde c^-, \widetilde{\Delta c})$ per prompt.

    $\tilde c = c_x$ the mean confidence of the prompt's rollouts; $\tilde c^{+}$
    ($\tilde c^{-}$) the mean over its correct (incorrect) rollouts, 0 if there are none;
    $\widetilde{\Delta c}$ the deviation $c_x - \bar c_{\mathcal B}$ mapped to [0, 1].

    Examples:
        >>> correct = torch.tensor([[True, False], [False, False]])
        >>> f = confidence_features(torch.tensor([[1.0, 0.5], [0.0, 0.0]]), correct)
        >>> [round(x, 3) for x in f[0].tolist()]
        [0.75, 1.0, 0.5, 1.0]
    """
    check_float("kappa", kappa)
    check_mask("correct", correct, kappa.shape)
    mode = check_choice("delta_mode", delta_mode, DeltaMode)
    c = kappa.mean(-1)
    c_pos = masked_mean(kappa, correct, dim=-1)
    c_neg = masked_mean(kappa, ~correct, dim=-1)
    dev = c - c.mean(-1, keepdim=True)
    dev01 = _minmax(dev, eps, (-1,)) if mode is DeltaMode.MINMAX else (0.5 + dev).clamp(0.0, 1.0)
    return torch.stack([c, c_pos, c_neg, dev01], dim=-1)


def router_scores(memberships: Float[Tensor, "*R G 3"], features: Float[Tensor, "*R G 4"]) -> Float[Tensor, "*R G 4"]:
    r"""Router scores (columns GRPO, OPSD, REG, SKIP).

    $$
    s_{GRPO} = m + h(1-\widetilde{\Delta c}) + l(1-\tilde c^-)\tilde c,\quad
                  s_{OPSD} = l(1-\tilde c^-),\quad s_{REG} = h\,\widetilde{\Delta c}\,\tilde c^+,\quad
                  s_{SKIP} = l\,\tilde c^-\tilde c
    $$

    Examples:
        >>> router_scores(torch.tensor([[1., 0., 0.]]), torch.tensor([[1., 0., 1., 0.]])).tolist()
        [[0.0, 0.0, 0.0, 1.0]]
    """
    check_float("memberships", memberships)
    check_float("features", features)
    if memberships.shape[-1] != 3 or features.shape[-1] != 4 or memberships.shape[:-1] != features.shape[:-1]:
        raise ShapeError(
            "memberships, features: expected [G, 3] and [G, 4], "
            f"got {list(memberships.shape)} and {list(features.shape)}"
        )
    low, mid, high = memberships.unbind(-1)
    c, c_pos, c_neg, dev = features.unbind(-1)
    s_grpo = mid + high * (1 - dev) + low * (1 - c_neg) * c
    return torch.stack([s_grpo, low * (1 - c_neg), high * dev * c_pos, low * c_neg * c], dim=-1)


def router_probabilities(scores: Float[Tensor, "*R G 4"], *, eps: float = 1e-8) -> Float[Tensor, "*R G 4"]:
    r"""Plain normalisation $p = s/(\sum s + \epsilon)$ renormalised to sum 1; all-zero rows go to GRPO.

    Examples:
        >>> router_probabilities(torch.tensor([[1., 1., 0., 2.], [0., 0., 0., 0.]])).tolist()
        [[0.25, 0.25, 0.0, 0.5], [1.0, 0.0, 0.0, 0.0]]
    """
    check_float("scores", scores)
    check_finite("scores", scores)
    s = scores.clamp(min=0.0)
    total = s.sum(-1, keepdim=True)
    fallback = torch.zeros_like(s)
    fallback[..., Recipe.GRPO] = 1.0
    p = s / (total + eps)
    p = p / p.sum(-1, keepdim=True).clamp(min=eps)
    return torch.where(total > 0, p, fallback)


@ROUTERS.register("self_routing", paper=_PAPER)
def self_routing_probabilities(
    rewards: Float[Tensor, "*R G K"],
    mean_entropy: Float[Tensor, "*R G K"],
    *,
    delta_mode: DeltaMode | str = DeltaMode.MINMAX,
    sigma_l: float = 0.18,
    sigma_m: float = 0.16,
    sigma_h: float = 0.18,
) -> Float[Tensor, "*R G 4"]:
    r"""Self-Routing's recipe probabilities from binary rewards and per-rollout mean token entropies.

    $a_x$ = mean reward of the prompt; memberships, batch-calibrated confidences, features,
    scores and the plain normalisation as in `accuracy_memberships` ... `router_probabilities`.

    Args:
        rewards: ``[*R, G, K]`` binary verifier outcomes (1 = correct).
        mean_entropy: ``[*R, G, K]`` mean token entropy of each rollout; each ``[G, K]`` slice is
            one routing batch (leading axes, e.g. seeds, are independent batches).

    Returns:
        ``[G, 4]`` probabilities over (GRPO, OPSD, REG, SKIP).

    Examples:
        >>> p = self_routing_probabilities(torch.tensor([[1., 0.], [0., 0.]]), torch.tensor([[1., 1.], [2., 2.]]))
        >>> int(p[0].argmax()), int(p[1].argmax())  # mixed -> GRPO; all wrong, unsure -> OPSD
        (0, 1)
    """
    check_float("rewards", rewards)
    check_float("mean_entropy", mean_entropy)
    if mean_entropy.shape != rewards.shape:
        raise ShapeError(
            f"mean_entropy: expected shape {list(rewards.shape)} (the shape of rewards), got {list(mean_entropy.shape)}"
        )
    omega = accuracy_memberships(rewards.mean(-1), sigma_l=sigma_l, sigma_m=sigma_m, sigma_h=sigma_h)
    feats = confidence_features(rollout_confidence(mean_entropy), rewards > 0.5, delta_mode=delta_mode)
    return router_probabilities(router_scores(omega, feats))


def sample_routes(probabilities: Float[Tensor, "*R G 4"], uniforms: Float[Tensor, "*R G"]) -> Int[Tensor, "*R G"]:
    """One categorical recipe draw per prompt by inverse CDF from explicit uniforms in [0, 1).

    Pure: the randomness is the ``uniforms`` argument (draw them from a seeded generator), so a
    route is deterministic given the seed.

    Examples:
        >>> sample_routes(torch.tensor([[0.5, 0., 0.5, 0.], [0.25, 0.25, 0.25, 0.25]]), torch.tensor([0.7, 0.3])).tolist()
        [2, 1]
    """
    check_float("probabilities", probabilities)
    check_float("uniforms", uniforms)
    if probabilities.shape[-1] != len(RECIPES) or uniforms.shape != probabilities.shape[:-1]:
        raise ShapeError(
            f"uniforms: expected shape {list(probabilities.shape[:-1])} for probabilities [*R, G, 4], "
            f"got {list(uniforms.shape)}"
        )
    cdf = probabilities.cumsum(-1)
    cdf = cdf / cdf[..., -1:].clamp(min=1e-12)
    idx = (cdf <= uniforms.unsqueeze(-1)).sum(-1)
    last = (probabilities > 0).to(torch.long).cumsum(-1).argmax(-1)  # never pick a zero-probability tail
    return torch.minimum(idx, last)


@ROUTERS.register("random_marginal", paper=_PAPER)
def random_routes(marginal: Float[Tensor, "*R 4"], uniforms: Float[Tensor, "*R G"]) -> Int[Tensor, "*R G"]:
    """Matched-marginal random routing baseline: every prompt draws from the same fixed ``marginal``.

    Examples:
        >>> random_routes(torch.tensor([0., 1., 0., 0.]), torch.tensor([0.1, 0.5, 0.9])).tolist()
        [1, 1, 1]
    """
    check_float("marginal", marginal)
    if marginal.shape[-1] != len(RECIPES) or bool((marginal < 0).any()) or not bool((marginal.sum(-1) > 0).all()):
        raise DomainError(f"marginal: expected 4 non-negative weights with a positive sum, got {marginal.tolist()}")
    return sample_routes(marginal.unsqueeze(-2).expand(*uniforms.shape, len(RECIPES)), uniforms)


def route_masks(routes: Int[Tensor, "*R G"]) -> Bool[Tensor, "4 *R G"]:
    """One boolean slice per recipe; every prompt is True in exactly one slice (a partition).

    Examples:
        >>> route_masks(torch.tensor([3, 0])).int().tolist()
        [[0, 1], [0, 0], [0, 0], [1, 0]]
    """
    check_tensor("routes", routes)
    if routes.is_floating_point() or bool(((routes < 0) | (routes >= len(RECIPES))).any()):
        raise DomainError(f"routes: expected integer recipe ids in [0, {len(RECIPES)}), got {routes.tolist()}")
    ids = torch.arange(len(RECIPES), device=routes.device).reshape(-1, *([1] * routes.ndim))
    return routes.unsqueeze(0) == ids
