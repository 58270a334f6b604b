"""Inputs of each estimator form for hypothesis: canonical argument names, strategies, one-line descriptions.

`ARGS` names each form's arguments in call order; `valid_inputs` draws valid calls for the contract
search (continuous and binary rewards, constant groups, masks with holes and fully masked rows,
log-ratios within +-1, all float64); the others feed `posttrain.arena.properties` and `posttrain.arena.conventions`.
`describe` prints a drawn input in one line; `SEARCH` are the hypothesis settings every search uses
(derandomised, no example database: a report is reproducible).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from torch import Tensor

from posttrain.arena.kinds import Form
from posttrain.testing import grouped_rewards, log_probs, response_masks, token_tensors

__all__ = [
    "ARGS",
    "GRID",
    "SEARCH",
    "Example",
    "describe",
    "grid_rewards",
    "kl_inputs",
    "masked_inputs",
    "policy_inputs",
    "token_inputs",
    "valid_inputs",
]

Example = dict[str, Any]
ARGS: dict[Form, tuple[str, ...]] = {
    Form.GROUPED: ("rewards",),
    Form.GROUPED_MASKED: ("rewards", "mask"),
    Form.TOKEN: ("token_rewards", "mask"),
    Form.LOSS: ("logp", "logp_old", "advantages", "mask"),
    Form.KL: ("logp", "logp_ref"),
}
"""Canonical argument names of each form, in call order."""
GRID = (0.0, 0.25, 0.5, 0.75, 1.0)
"""Reward values of the property strategies (non-constant groups have a std of at least 0.14)."""


@st.composite
def grid_rewards(draw: st.DrawFn, *, spread: bool = False) -> Tensor:
    g, k = draw(st.integers(1, 3)), draw(st.integers(2, 6))
    arr = draw(arrays(np.float64, (g, k), elements=st.sampled_from(GRID)))
    if spread:  # every group non-constant
        arr[:, 0], arr[:, 1] = 0.0, 1.0
    return torch.from_numpy(arr)


@st.composite
def masked_inputs(draw: st.DrawFn, rewards: st.SearchStrategy[Tensor], *, empty_rows: bool = True) -> Example:
    r = draw(rewards)
    t = draw(st.integers(1, 4))
    return {"rewards": r, "mask": draw(response_masks((r.numel(), t), empty_rows=empty_rows))}


@st.composite
def token_inputs(draw: st.DrawFn) -> Example:
    b, t = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    return {
        "token_rewards": draw(token_tensors((b, t), low=-2, high=2)),
        "mask": draw(response_masks((b, t), empty_rows=True)),
    }


@st.composite
def policy_inputs(draw: st.DrawFn, *, t: tuple[int, int] = (1, 4), max_log_ratio: float = 1.0) -> Example:
    b, tt = draw(st.integers(1, 4)), draw(st.integers(*t))
    logp = draw(log_probs((b, tt), low=-10.0))
    delta = draw(token_tensors((b, tt), low=-max_log_ratio, high=max_log_ratio))
    adv_shape = (b, tt) if draw(st.booleans()) else (b,)
    adv = draw(token_tensors(adv_shape, low=-3.0, high=3.0))
    return {
        "logp": logp,
        "logp_old": logp - delta,
        "advantages": adv,
        "mask": draw(response_masks((b, tt), empty_rows=True)),
    }


@st.composite
def kl_inputs(draw: st.DrawFn) -> Example:
    b, t = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    return {"logp": draw(log_probs((b, t), low=-10.0)), "logp_ref": draw(log_probs((b, t), low=-10.0))}


def valid_inputs(form: Form) -> st.SearchStrategy[Example]:
    """Valid inputs of ``form`` for the contract search: continuous and binary rewards, constant
    groups, masks with holes and fully masked rows, log-ratios within +-1 (canonical names, float64)."""
    rewards = st.one_of(grouped_rewards(groups=(1, 3), k=(2, 6)), grouped_rewards(groups=(1, 3), k=(2, 6), binary=True))
    if form is Form.GROUPED:
        return rewards.map(lambda r: {"rewards": r})
    if form is Form.GROUPED_MASKED:
        return masked_inputs(rewards)
    if form is Form.TOKEN:
        return token_inputs()
    return policy_inputs() if form is Form.LOSS else kl_inputs()


def describe(ex: Example, width: int = 200) -> str:
    """One line: ``name=values`` for every entry (masks as 0/1, floats to 4 significant digits)."""
    parts = []
    for k, v in ex.items():
        if isinstance(v, Tensor):
            if v.dtype == torch.bool:
                text = str(v.to(torch.int64).tolist()).replace(" ", "")
            else:
                text = str(np.vectorize(lambda x: float(f"{x:.4g}"))(v.detach().double().numpy()).tolist())
        else:
            text = repr(v)
        parts.append(f"{k}={text}")
    line = ", ".join(parts)
    return line if len(line) <= width else line[: width - 1] + "…"


SEARCH = settings(
    max_examples=120, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck)
)
