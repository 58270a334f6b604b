r"""Plain conversions between verl's / TRL's argument conventions and ours (no verl or TRL import).

- verl hands an advantage estimator flat rows: ``token_level_rewards [B, T]`` (the outcome score on the
  last generated token), ``response_mask [B, T]`` (0/1, any dtype) and ``index [B]`` (prompt uids, a numpy
  object array): `group_ids_from_index`, `outcome_scores` and `grouped_token_advantages`
  turn them into our ``[G, K]`` groups and the result back into ``[B, T]`` rows in verl's order.
- verl reduces a loss matrix with a ``loss_agg_mode`` string and the global batch facts of its
  data-parallel step (``dp_size``, ``batch_num_tokens``, ``global_batch_size``, ``loss_scale_factor``):
  `global_aggregate` is our `aggregate` with those global normalisers.
- Hyperparameters come from verl's config nodes (dataclasses or ``DictConfig``): `config_value`
  reads one key from either, `clip_options` the PPO clip settings.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from posttrain.errors import ShapeError
from posttrain.estimators import broadcast_sequence_advantages, group_rewards
from posttrain.estimators.aggregation import global_aggregate
from posttrain.validate import check_float, check_mask, check_tensor

__all__ = [
    "ClipOptions",
    "clip_options",
    "config_value",
    "global_aggregate",
    "group_ids_from_index",
    "grouped_token_advantages",
    "outcome_scores",
    "response_bool_mask",
]


def config_value(config: Any, key: str, default: Any) -> Any:
    """``config.key`` for a dataclass/attribute config, ``config[key]`` for a mapping; ``default`` if absent or None.

    Examples:
        >>> config_value({"gamma": 0.9}, "gamma", 1.0), config_value(None, "gamma", 1.0)
        (0.9, 1.0)
    """
    if config is None:
        return default
    if isinstance(config, dict):
        value = config.get(key)
    else:
        try:
            value = getattr(config, key)
        except (AttributeError, KeyError):  # omegaconf raises either for an unknown key
            getter = getattr(config, "get", None)
            value = getter(key) if callable(getter) else None
    return default if value is None else value


class ClipOptions(NamedTuple):
    """PPO clip settings in our keyword names (``clip_low``, ``clip_high``, ``dual_clip``)."""

    clip_low: float
    clip_high: float
    dual_clip: float | None

    def kwargs(self) -> dict[str, float]:
        """The keyword options of a loss; ``dual_clip`` only when set (GSPO takes none)."""
        out = {"clip_low": self.clip_low, "clip_high": self.clip_high}
        return out if self.dual_clip is None else out | {"dual_clip": self.dual_clip}


def clip_options(config: Any, *, dual_clip: bool = True) -> ClipOptions:
    """verl's actor clip keys as our options: ``clip_ratio_low``/``_high`` (default ``clip_ratio``, 0.2) and
    ``clip_ratio_c`` (default 3.0; verl's ``vanilla`` always applies the dual clip) when ``dual_clip``.

    Examples:
        >>> clip_options({"clip_ratio": 0.2, "clip_ratio_high": 0.28})
        ClipOptions(clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    """
    eps = float(config_value(config, "clip_ratio", 0.2))
    return ClipOptions(
        clip_low=float(config_value(config, "clip_ratio_low", eps)),
        clip_high=float(config_value(config, "clip_ratio_high", eps)),
        dual_clip=float(config_value(config, "clip_ratio_c", 3.0)) if dual_clip else None,
    )


def response_bool_mask(response_mask: Tensor) -> Bool[Tensor, "B T"]:
    """verl's 0/1 ``response_mask`` (int, float or bool) as our boolean mask (non-zero = valid).

    Examples:
        >>> response_bool_mask(torch.tensor([[1.0, 0.0]])).tolist()
        [[True, False]]
    """
    check_tensor("response_mask", response_mask, ndim=2)
    return response_mask if response_mask.dtype == torch.bool else response_mask != 0


def group_ids_from_index(
    index: Sequence[Hashable] | np.ndarray | Tensor, *, device: torch.device | None = None
) -> Int[Tensor, " B"]:
    """Integer group ids from verl's prompt uids (rows with equal uid form a group), numbered by first appearance.

    Args:
        index: ``[B]`` uids: a numpy (object) array, a list of hashables, or an integer tensor.
        device: device of the result.

    Returns:
        ``[B]`` int64 ids in ``0..G-1``.

    Raises:
        ShapeError: ``index`` is not one-dimensional or is empty.

    Examples:
        >>> group_ids_from_index(np.array(["b", "a", "b", "a"], dtype=object)).tolist()
        [0, 1, 0, 1]
    """
    if isinstance(index, Tensor):
        check_tensor("index", index, ndim=1)
        values: list[Hashable] = index.tolist()
    else:
        arr = np.asarray(index, dtype=object)
        if arr.ndim != 1:
            raise ShapeError(f"index: expected a one-dimensional array of uids, got shape {list(arr.shape)}")
        values = arr.tolist()
    if not values:
        raise ShapeError("index: expected at least one uid, got an empty array")
    first: dict[Hashable, int] = {}
    ids = [first.setdefault(u, len(first)) for u in values]  # uids are Python objects: one dict pass
    return torch.tensor(ids, dtype=torch.long, device=device)


def outcome_scores(token_level_rewards: Float[Tensor, "B T"]) -> Float[Tensor, " B"]:
    r"""Sequence scores $R_i = \sum_t r_{it}$ from verl's token-level rewards, over every position.

    As verl's built-in outcome estimators: the score is placed on the last generated token before verl's
    rollout correction may mask tokens or whole rows (``rollout_rs``), so the response mask is not applied
    here; a masked row keeps its score in its group's statistics and gets advantage 0 from the mask.

    Examples:
        >>> outcome_scores(torch.tensor([[0.0, 1.0], [0.5, 0.0]])).tolist()
        [1.0, 0.5]
    """
    check_float("token_level_rewards", token_level_rewards, ndim=2)
    return token_level_rewards.sum(dim=-1)


def grouped_token_advantages(
    advantage: Callable[[Tensor], Tensor],
    scores: Float[Tensor, " B"],
    group_ids: Int[Tensor, " B"],
    mask: Bool[Tensor, "B T"],
) -> Float[Tensor, "B T"]:
    r"""Apply a ``[G, K] -> [G, K]`` advantage to flat scores grouped by id, and spread it over the response tokens.

    $$
    A_{it} = m_{it}\, f\big(R_{\text{group}(i), \cdot}\big)_{\text{rank}(i)}
    $$

    Rows keep their order (the result is in the caller's row order, whatever the grouping).

    Args:
        advantage: a grouped advantage such as `group_normalized_advantages`.
        scores: ``[B]`` sequence rewards. group_ids: ``[B]`` integer ids, groups of equal size.
        mask: ``[B, T]`` boolean response mask.

    Returns:
        ``[B, T]`` advantages, 0 off the mask.

    Raises:
        ShapeError: mismatched lengths or groups of unequal size.

    Examples:
        >>> from posttrain.estimators import drgrpo_advantages
        >>> m = torch.ones(4, 2, dtype=torch.bool)
        >>> grouped_token_advantages(drgrpo_advantages, torch.tensor([1., 3., 0., 5.]), torch.tensor([0, 1, 0, 1]), m)[:, 0].tolist()
        [0.5, -1.0, -0.5, 1.0]
    """
    check_mask("mask", mask, (scores.shape[0], mask.shape[-1]))
    grouped, order = group_rewards(scores, group_ids)
    flat = torch.empty_like(scores)
    flat[order] = advantage(grouped).reshape(-1).to(scores.dtype)
    return broadcast_sequence_advantages(flat, mask)
