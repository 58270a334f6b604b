"""Muon for real models: ``torch.optim.Muon`` on hidden matrices and fused ``torch.optim.AdamW`` on the rest.

`MuonWithAdamW` routes hidden 2-D projection matrices to Muon and every other trainable tensor
(embeddings, LM head, norms, biases) to AdamW with its own rate, by
`route_muon_parameters` (Muon for agentic RL, section 3.1 of the
paper's set-up). The steps are torch's own: ``torch.optim.Muon`` (torch >= 2.9; Newton-Schulz in bfloat16,
the paper's setting) and ``torch.optim.AdamW(fused=True)`` where the device supports it. Where torch's
Muon has no equivalent (``compute_dtype`` other than bfloat16, ``scale="none"``) the Muon group runs
`muon_update`, the pure function the toys use. Both give the update
$\\Delta W = -\\eta\\lambda W - \\eta\\, s(m, n)\\, \\mathrm{NS}_5(U)$ (see ``muon_update``).

After each step ``last_update_rms`` holds the update RMS of each group (``{"muon": ..., "adamw": ...}``,
`group_update_rms`'s parameter-weighted quadratic mean), and
``last_hidden_rms`` the Muon one, the key Muon-vs-AdamW diagnostic. Measuring it keeps one copy of the
parameters (``log_update_rms=False`` skips it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import torch
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators.optim import (
    DEFAULT_MUON_EXCLUDE,
    DEFAULT_MUON_INCLUDE,
    NS_COEFFICIENTS,
    MuonScale,
    MuonState,
    muon_update,
    route_muon_parameters,
)
from posttrain.llm.typed import OneOf, Range

__all__ = ["MuonWithAdamW"]

_POSITIVE = Range(0.0, None, low_open=True)
_UNIT = Range(0.0, 1.0, high_open=True)
_TORCH_SCALES = {MuonScale.ORIGINAL: "original", MuonScale.MATCH_RMS_ADAMW: "match_rms_adamw"}


class _PureMuon(torch.optim.Optimizer):
    """Muon by `muon_update`, for settings ``torch.optim.Muon`` lacks."""

    def __init__(self, params: Sequence[Tensor], *, compute_dtype: torch.dtype | None, **hyper: Any) -> None:
        super().__init__(params, hyper)
        self.compute_dtype = compute_dtype

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            buffers = tuple(self.state[p].get("momentum_buffer", torch.zeros_like(p)) for p in params)
            deltas, new = muon_update(
                [p.grad for p in params],
                MuonState(buffers),
                params,
                lr=group["lr"],
                momentum=group["momentum"],
                nesterov=group["nesterov"],
                weight_decay=group["weight_decay"],
                ns_steps=group["ns_steps"],
                coefficients=group["ns_coefficients"],
                eps=group["eps"],
                scale=group["scale"],
                compute_dtype=self.compute_dtype,
            )
            for p, delta, buf in zip(params, deltas, new.momentum, strict=True):
                self.state[p]["momentum_buffer"] = buf
                p.add_(delta)
        return loss


def _fused_supported(params: Sequence[Tensor]) -> bool:
    """Fused AdamW runs on CPU and CUDA-like devices for floating parameters."""
    return all(p.is_floating_point() and p.device.type in ("cpu", "cuda", "xpu", "mps") for p in params)


def _update_rms(deltas: Sequence[Tensor]) -> Tensor:
    r"""$\sqrt{\sum_\ell \|\Delta_\ell\|^2 / \sum_\ell |\Delta_\ell|}$ over tensors of any shape."""
    norms = torch.stack([torch.linalg.vector_norm(d.float()) for d in deltas])
    return torch.linalg.vector_norm(norms) / math.sqrt(sum(d.numel() for d in deltas))


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon on hidden matrices + AdamW on the rest, as one optimizer (one ``state_dict``, one LR schedule).

    Args:
        model: the module whose trainable parameters are optimised.
        lr: Muon's rate for hidden matrices (spectral units; does not transfer from AdamW).
        adamw_lr: AdamW's rate for the fallback group (default: ``lr``).
        momentum, nesterov, ns_steps, scale, weight_decay, compute_dtype: of ``muon_update`` (torch's Muon
            when ``compute_dtype`` is bfloat16 and ``scale`` is ``original`` or ``match_rms_adamw``).
        betas, eps, adamw_weight_decay: of ``torch.optim.AdamW``.
        include, exclude: name regexes of ``route_muon_parameters``.
        fused: fused AdamW (default: where the parameters' device supports it).
        log_update_rms: measure ``last_update_rms`` after each step.

    Raises:
        ShapeError: no parameter matched the Muon patterns.
        DomainError: an unknown ``scale``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        lr: Annotated[float, _POSITIVE] = 0.02,
        adamw_lr: Annotated[float, _POSITIVE] | None = None,
        momentum: Annotated[float, _UNIT] = 0.95,
        nesterov: bool = True,
        ns_steps: Annotated[int, Range(1, 100)] = 5,
        scale: Annotated[str, OneOf(tuple(m.value for m in MuonScale))] = "original",
        weight_decay: Annotated[float, Range(0.0)] = 0.01,
        compute_dtype: torch.dtype | None = torch.bfloat16,
        betas: tuple[Annotated[float, _UNIT], Annotated[float, _UNIT]] = (0.9, 0.999),
        eps: Annotated[float, Range(0.0)] = 1e-8,
        adamw_weight_decay: Annotated[float, Range(0.0)] = 0.01,
        include: Sequence[str] = DEFAULT_MUON_INCLUDE,
        exclude: Sequence[str] = DEFAULT_MUON_EXCLUDE,
        fused: bool | None = None,
        log_update_rms: bool = True,
    ) -> None:
        named = dict(model.named_parameters())
        muon_names, adamw_names = route_muon_parameters(named.items(), include=include, exclude=exclude)
        if not muon_names:
            raise ShapeError("model: no parameter matched the Muon include patterns; pass include=...")
        try:
            mode = MuonScale(scale)
        except ValueError:
            raise DomainError(f"scale: unknown Muon scale {scale!r}; valid: {[s.value for s in MuonScale]}") from None
        muon_params, adamw_params = [named[n] for n in muon_names], [named[n] for n in adamw_names]
        muon_hyper: dict[str, Any] = dict(
            lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps, weight_decay=weight_decay,
            ns_coefficients=NS_COEFFICIENTS, eps=1e-7,
        )  # fmt: skip
        inner: list[torch.optim.Optimizer] = []
        if compute_dtype == torch.bfloat16 and mode in _TORCH_SCALES:
            inner.append(torch.optim.Muon(muon_params, adjust_lr_fn=_TORCH_SCALES[mode], **muon_hyper))
        else:
            inner.append(_PureMuon(muon_params, compute_dtype=compute_dtype, scale=mode.value, **muon_hyper))
        if adamw_params:
            use_fused = _fused_supported(adamw_params) if fused is None else fused
            inner.append(
                torch.optim.AdamW(
                    adamw_params,
                    lr=lr if adamw_lr is None else adamw_lr,
                    betas=betas,
                    eps=eps,
                    weight_decay=adamw_weight_decay,
                    fused=use_fused or None,
                )
            )
        for opt, names, use_muon in zip(inner, (muon_names, adamw_names), (True, False), strict=False):
            opt.param_groups[0].update(names=names, use_muon=use_muon)
        # one optimizer to the trainer: the inner optimizers' group dicts are ours, their state is ours
        super().__init__([opt.param_groups[0] for opt in inner], defaults={})
        self._inner = inner
        self._bind()
        self.compute_dtype = compute_dtype
        self.log_update_rms = log_update_rms
        self.last_update_rms: dict[str, Tensor] = {}
        self.last_hidden_rms: Tensor | None = None

    def _bind(self) -> None:
        """Point each inner optimizer at its group dict and at the shared state (again after loading)."""
        for opt, group in zip(self._inner, self.param_groups, strict=True):
            opt.param_groups = [group]
            opt.state = self.state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._bind()

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        before: list[list[Tensor]] = []
        if self.log_update_rms:
            before = [[p.detach().clone() for p in g["params"] if p.grad is not None] for g in self.param_groups]
        for opt in self._inner:
            opt.step()
        if self.log_update_rms:
            rms = {}
            for group, old in zip(self.param_groups, before, strict=True):
                if old:
                    new = [p for p in group["params"] if p.grad is not None]
                    rms["muon" if group["use_muon"] else "adamw"] = _update_rms(
                        [p - o for p, o in zip(new, old, strict=True)]
                    )
            self.last_update_rms = rms
            self.last_hidden_rms = rms.get("muon")
        return loss
