"""Muon for real models: ``torch.optim.Optimizer`` wrappers around :mod:`posttrain.estimators.optim`.

:class:`MuonWithAdamW` routes hidden 2-D projection matrices to Muon and every other trainable
tensor (embeddings, LM head, norms, biases) to AdamW with its own rate (spec 12, section 3.1),
calling the same pure ``muon_update`` / ``adamw_update`` functions the toys use, one tensor at a
time (Newton-Schulz needs each full matrix on one device). The per-step hidden-group update RMS
is kept in ``last_hidden_rms`` for logging (the key Muon-vs-AdamW diagnostic).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from posttrain.errors import ShapeError
from posttrain.estimators.optim import (
    DEFAULT_MUON_EXCLUDE,
    DEFAULT_MUON_INCLUDE,
    AdamWState,
    MuonState,
    adamw_update,
    group_update_rms,
    muon_update,
    route_muon_parameters,
)

__all__ = ["MuonWithAdamW"]


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon on hidden matrices + AdamW on the rest, as one optimizer.

    Args:
        model: the module whose trainable parameters are optimised.
        lr: Muon's rate for hidden matrices (spectral units; does not transfer from AdamW).
        adamw_lr: AdamW's rate for the fallback group (default: ``lr``).
        momentum, nesterov, ns_steps, scale, weight_decay, compute_dtype: of ``muon_update``.
        betas, eps, adamw_weight_decay: of ``adamw_update``.
        include, exclude: name regexes of ``route_muon_parameters``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        lr: float = 0.02,
        adamw_lr: float | None = None,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        scale: str = "original",
        weight_decay: float = 0.01,
        compute_dtype: torch.dtype | None = torch.bfloat16,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        adamw_weight_decay: float = 0.01,
        include: Sequence[str] = DEFAULT_MUON_INCLUDE,
        exclude: Sequence[str] = DEFAULT_MUON_EXCLUDE,
    ) -> None:
        named = dict(model.named_parameters())
        muon_names, adamw_names = route_muon_parameters(named.items(), include=include, exclude=exclude)
        if not muon_names:
            raise ShapeError("model: no parameter matched the Muon include patterns; pass include=...")
        groups: list[dict[str, Any]] = [
            dict(
                params=[named[n] for n in muon_names],
                names=muon_names,
                use_muon=True,
                lr=lr,
                momentum=momentum,
                nesterov=nesterov,
                ns_steps=ns_steps,
                scale=scale,
                weight_decay=weight_decay,
            ),
            dict(
                params=[named[n] for n in adamw_names],
                names=adamw_names,
                use_muon=False,
                lr=lr if adamw_lr is None else adamw_lr,
                betas=betas,
                eps=eps,
                weight_decay=adamw_weight_decay,
            ),
        ]
        super().__init__([g for g in groups if g["params"]], defaults={})
        self.compute_dtype = compute_dtype
        self.last_hidden_rms: Tensor | None = None

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        hidden_deltas: list[Tensor] = []
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if group["use_muon"]:
                    buf = state.get("momentum_buffer", torch.zeros_like(p))
                    (delta,), mstate = muon_update(
                        [p.grad],
                        MuonState((buf,)),
                        [p],
                        lr=group["lr"],
                        momentum=group["momentum"],
                        nesterov=group["nesterov"],
                        weight_decay=group["weight_decay"],
                        ns_steps=group["ns_steps"],
                        scale=group["scale"],
                        compute_dtype=self.compute_dtype,
                    )
                    state["momentum_buffer"] = mstate.momentum[0]
                    hidden_deltas.append(delta)
                else:
                    astate = AdamWState(
                        (state.get("exp_avg", torch.zeros_like(p)),),
                        (state.get("exp_avg_sq", torch.zeros_like(p)),),
                        int(state.get("step", 0)),
                    )
                    (delta,), astate = adamw_update(
                        [p.grad],
                        astate,
                        [p],
                        lr=group["lr"],
                        betas=group["betas"],
                        eps=group["eps"],
                        weight_decay=group["weight_decay"],
                    )
                    state["exp_avg"], state["exp_avg_sq"], state["step"] = astate.mu[0], astate.nu[0], astate.step
                p.add_(delta)
        if hidden_deltas:
            self.last_hidden_rms = group_update_rms(hidden_deltas)
        return loss
