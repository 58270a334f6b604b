"""Losses over per-prompt routes: one queue per recipe, weighted by queue size (Self-Routing).

The routes come from `posttrain.estimators.selection.routing`; `routed_loss` combines the
per-queue token means, `queue_token_weights` gives per-row weights that make a plain token mean
equal to it (so a trainer needs no queues). Reference: Li et al. 2026, From Rollouts to Recipes
(arXiv:2609.01422).
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.errors import ShapeError
from posttrain.estimators.aggregation import masked_mean
from posttrain.estimators.selection.routing import RECIPES, Recipe, route_masks
from posttrain.shapes import Bool, Float, Int
from posttrain.validate import check_float, check_mask, check_tensor

__all__ = ["queue_token_weights", "routed_loss"]


def routed_loss(
    recipe_losses: Float[Tensor, "4 *R B T"], routes: Int[Tensor, "*R G"], mask: Bool[Tensor, "*R B T"]
) -> Float[Tensor, "*R"]:
    r"""Queue-size-weighted sum of per-queue token-mean losses; SKIP counts nowhere.

    $$
    \mathcal L = \frac{n_g\mathcal L_{GRPO} + n_o\mathcal L_{OPSD} + n_r\mathcal L_{REG}}{n_g+n_o+n_r}
    $$

    $\mathcal L_\bullet$ is the token mean of recipe $\bullet$'s per-token loss over the
    rows of its queue; $n_\bullet$ counts prompts. Rows are grouped ``B = G x K`` row-major.
    An all-SKIP batch gives exactly 0 (with a graph, so ``backward`` is a no-op). Leading axes
    ``*R`` are independent routing batches (one loss each).

    Args:
        recipe_losses: ``[4, *R, B, T]`` per-token loss of each recipe on every row (only the rows
            routed to a recipe are read; the SKIP slice is ignored).
        routes: ``[*R, G]`` recipe ids. mask: ``[*R, B, T]`` boolean.

    Returns:
        ``[*R]`` losses (0-d without leading axes).

    Examples:
        >>> losses = torch.tensor([1.0, 3.0, 0.0, 0.0]).reshape(4, 1, 1).expand(4, 4, 1)
        >>> float(routed_loss(losses, torch.tensor([0, 1]), torch.ones(4, 1, dtype=torch.bool)))
        2.0
    """
    check_float("recipe_losses", recipe_losses)
    check_mask("mask", mask, recipe_losses.shape[1:])
    masks = route_masks(routes)  # [4, *R, G]
    b, g = mask.shape[-2], routes.shape[-1]
    if routes.shape[:-1] != mask.shape[:-2] or b % g != 0:
        raise ShapeError(f"routes: expected shape [*R, G] with G dividing B = {b}, got {list(routes.shape)}")
    row_route = masks.repeat_interleave(b // g, dim=-1)  # [4, *R, B]
    token_q = row_route.unsqueeze(-1) & mask  # [4, *R, B, T]
    per_queue = masked_mean(recipe_losses.flatten(-2), token_q.flatten(-2), dim=-1)  # [4, *R]
    counts = masks.sum(-1).to(recipe_losses.dtype)
    skip = (torch.arange(len(RECIPES), device=counts.device) == Recipe.SKIP).reshape(-1, *([1] * (counts.ndim - 1)))
    counts = torch.where(skip, 0.0, counts)
    weighted = torch.where(counts > 0, counts * per_queue, torch.zeros((), dtype=per_queue.dtype))
    return weighted.sum(0) / counts.sum(0).clamp(min=1.0)


def queue_token_weights(
    routes: Int[Tensor, "*R G"], mask: Bool[Tensor, "*R B T"], *, dtype: torch.dtype = torch.float64
) -> Float[Tensor, "*R B"]:
    r"""Per-row weights $w_i$ that turn one token mean over the non-SKIP rows into `routed_loss`.

    $$
    w_i = \frac{n_{q(i)}}{n_g+n_o+n_r}\cdot\frac{N_{tok}}{N_{tok,q(i)}}, \qquad
    \frac{\sum_{i,t} m_{it}\,w_i\,\ell^{q(i)}_{it}}{N_{tok}} = \mathcal L
    $$

    with $q(i)$ the recipe of row $i$'s prompt, $n_q$ prompts in queue $q$, $N_{tok,q}$
    the ``mask`` tokens of its rows and $N_{tok}$ those of all non-SKIP rows; SKIP rows (and the
    rows of a queue without tokens) get 0. So a trainer that averages per-token losses over the
    kept tokens (token-mean aggregation, split into micro-batches or not) computes the
    queue-size-weighted sum of per-queue token means without knowing the queues.

    Args:
        routes: ``[*R, G]`` recipe ids. mask: ``[*R, B, T]`` boolean, ``B = G x K`` row-major.

    Returns:
        ``[*R, B]`` non-negative weights in ``dtype``.

    Examples:
        >>> mask = torch.tensor([[True, True], [True, False], [True, True], [True, True]])
        >>> queue_token_weights(torch.tensor([0, 3]), mask).tolist()  # GRPO queue (3 tokens) and SKIP
        [1.0, 1.0, 0.0, 0.0]
        >>> queue_token_weights(torch.tensor([0, 1]), mask).tolist()  # N_tok = 7: 1/2 * 7/3, 1/2 * 7/4
        [1.1666666666666667, 1.1666666666666667, 0.875, 0.875]
    """
    masks = route_masks(routes)  # [4, *R, G]
    check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise ShapeError(f"mask: expected a boolean tensor, got {mask.dtype}")
    b, g = mask.shape[-2], routes.shape[-1]
    if mask.ndim < 2 or routes.shape[:-1] != mask.shape[:-2] or b % g != 0:
        raise ShapeError(f"routes: expected shape [*R, G] with G dividing B = {b}, got {list(routes.shape)}")
    row_route = masks.repeat_interleave(b // g, dim=-1)  # [4, *R, B]
    skip = (torch.arange(len(RECIPES), device=routes.device) == Recipe.SKIP).reshape(-1, *([1] * routes.ndim))
    row_route = row_route & ~skip
    row_tokens = mask.sum(-1).to(dtype)  # [*R, B]
    queue_tokens = (row_route * row_tokens).sum(-1, keepdim=True)  # [4, *R, 1]
    counts = (masks & ~skip).sum(-1, keepdim=True).to(dtype)  # [4, *R, 1]
    total_tokens, total_counts = queue_tokens.sum(0), counts.sum(0)  # [*R, 1]
    share = counts / total_counts.clamp(min=1.0) * total_tokens / queue_tokens.clamp(min=1.0)
    share = torch.where(queue_tokens > 0, share, torch.zeros((), dtype=dtype))
    return (row_route * share).sum(0)
