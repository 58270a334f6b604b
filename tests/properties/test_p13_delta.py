"""Spec 13 section 8: OPD² delta signal, gate, centering, top-K support, reductions, gradients."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posttrain.errors import DomainError
from posttrain.estimators import clipped_ratio_loss, exopd_advantages, opd2_advantages
from posttrain.estimators.advantages import (
    centered_advantage,
    sampled_on_support,
    tempered_log_softmax,
    topk_support,
)
from posttrain.testing import response_masks, token_tensors

F64 = torch.float64
V = 6


@st.composite
def triplets(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    """Full-vocabulary (K = V) student / teacher / base log-probs and a sampled token per position."""
    b, t = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    ls = draw(token_tensors((b, t, V), low=-3.0, high=3.0)).log_softmax(-1)
    lt = draw(token_tensors((b, t, V), low=-3.0, high=3.0)).log_softmax(-1)
    lb = draw(token_tensors((b, t, V), low=-3.0, high=3.0)).log_softmax(-1)
    y = torch.tensor(draw(st.lists(st.integers(0, V - 1), min_size=b * t, max_size=b * t))).reshape(b, t)
    mask = draw(response_masks((b, t)))
    return {"ls": ls, "lt": lt, "lb": lb, "y": y, "mask": mask}


def _opd2(x: dict[str, torch.Tensor], **kw: object) -> torch.Tensor:
    g = x["y"].unsqueeze(-1)
    return opd2_advantages(
        x["ls"].gather(-1, g)[..., 0],
        x["lt"].gather(-1, g)[..., 0],
        x["lb"].gather(-1, g)[..., 0],
        x["ls"],
        x["lt"],
        x["lb"],
        x["mask"],
        **kw,  # type: ignore[arg-type]
    )


def _centered_opd(x: dict[str, torch.Tensor]) -> torch.Tensor:
    g = x["y"].unsqueeze(-1)
    r = (x["lt"] - x["ls"]).gather(-1, g)[..., 0]
    return centered_advantage(r, x["ls"], x["lt"] - x["ls"])


@given(triplets())
def test_delta_vanishes_when_teacher_equals_base_and_at_the_teacher(x: dict[str, torch.Tensor]) -> None:
    same_base = dict(x, lb=x["lt"])
    assert torch.equal(_opd2(same_base), torch.zeros_like(x["ls"][..., 0]))
    at_teacher = dict(x, ls=x["lt"])
    assert torch.allclose(_opd2(at_teacher), torch.zeros_like(x["ls"][..., 0]), atol=1e-12)


@given(triplets())
def test_gate(x: dict[str, torch.Tensor]) -> None:
    gated = _opd2(x, scale=1.0)
    ungated = _opd2(x, scale=1.0, condition=False)
    a_opd = _centered_opd(x)
    assert bool(((gated == 0) | (gated == ungated)).all())
    assert bool((gated * a_opd >= 0).all())
    assert bool(((torch.sign(gated) == 0) | (torch.sign(gated) == torch.sign(a_opd))).all())


@given(triplets(), token_tensors((1, 1, 1), low=-5.0, high=5.0))
def test_centering_is_zero_mean_and_shift_invariant(x: dict[str, torch.Tensor], shift: torch.Tensor) -> None:
    ls, lt, lb = x["ls"], x["lt"], x["lb"]
    a_every = (lt - lb) - (ls.exp() * (lt - lb)).sum(-1, keepdim=True)  # A^Delta evaluated at every token v
    assert torch.allclose((ls.exp() * a_every).sum(-1), torch.zeros_like(ls[..., 0]), atol=1e-9)
    base = _opd2(x, scale=1.0, condition=False)
    assert torch.allclose(_opd2(dict(x, lt=lt + shift), scale=1.0, condition=False), base, atol=1e-9)
    assert torch.allclose(_opd2(dict(x, lb=lb + shift), scale=1.0, condition=False), base, atol=1e-9)
    assert torch.allclose(_centered_opd(dict(x, lt=lt + shift)), _centered_opd(x), atol=1e-9)


@given(triplets(), st.integers(1, V))
def test_topk_support_and_column_order(x: dict[str, torch.Tensor], k: int) -> None:
    ids = topk_support(x["ls"], x["y"], k=k)
    assert bool((ids == x["y"].unsqueeze(-1)).any(-1).all())
    assert ids.shape[-1] == k
    full = topk_support(x["ls"], x["y"], k=V)
    assert torch.equal(full.sort(-1).values, torch.arange(V).expand_as(full))
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(k))
    permuted = {n: (t[..., perm] if t.ndim == 3 else t) for n, t in x.items()}
    permuted["y"] = torch.argsort(perm)[x["y"]]  # the sampled token's new column
    assert torch.allclose(_opd2(permuted), _opd2(x), atol=1e-12)


@given(triplets(), st.integers(1, V))
def test_sampled_column_of_the_support_is_the_sampled_log_prob(x: dict[str, torch.Tensor], k: int) -> None:
    """The LLM lift reads the sampled-token log-probs off the top-K columns: exactly the full-vocab gather."""
    ids = topk_support(x["ls"], x["y"], k=k)
    for name in ("ls", "lt", "lb"):
        got = sampled_on_support(x[name].gather(-1, ids), ids, x["y"], x["mask"])
        assert torch.equal(got, x[name].gather(-1, x["y"].unsqueeze(-1))[..., 0])
    if bool(x["mask"].any()) and k < V:
        plain = x["ls"].topk(k, dim=-1).indices  # without forcing, the sampled id may be missing
        missing = ~(plain == x["y"].unsqueeze(-1)).any(-1) & x["mask"]
        if bool(missing.any()):
            with pytest.raises(DomainError, match="sampled id"):
                sampled_on_support(x["ls"].gather(-1, plain), plain, x["y"], x["mask"])


@given(token_tensors((2, 3, V), low=-3.0, high=3.0))
def test_temperature_one_is_plain_log_softmax(logits: torch.Tensor) -> None:
    assert torch.allclose(tempered_log_softmax(logits, tau=1.0), logits.log_softmax(-1))
    assert torch.allclose(tempered_log_softmax(logits, tau=0.5), (2 * logits).log_softmax(-1))


@given(triplets(), st.floats(0.01, 2.0))
def test_reductions(x: dict[str, torch.Tensor], scale: float) -> None:
    g = x["y"].unsqueeze(-1)
    ls_y, lt_y, lb_y = (x[n].gather(-1, g)[..., 0] for n in ("ls", "lt", "lb"))
    opd = torch.where(x["mask"], lt_y - ls_y, 0.0)
    assert torch.allclose(exopd_advantages(ls_y, lt_y, lb_y, x["mask"], lam=1.0, scale=1.0), opd, atol=1e-12)
    assert torch.allclose(_opd2(x, use_delta=False, scale=1.0), torch.where(x["mask"], _centered_opd(x), 0.0))
    assert torch.allclose(_opd2(x, scale=scale), scale * _opd2(x, scale=1.0), atol=1e-12)
    no_center = _opd2(x, scale=1.0, center=False)
    r_delta = torch.where(x["mask"], lt_y - lb_y, 0.0)
    assert bool(((no_center == 0) | (no_center == r_delta)).all())
    assert torch.equal(_opd2(x)[~x["mask"]], torch.zeros(int((~x["mask"]).sum()), dtype=F64))


def test_no_gradient_into_rewards_and_policy_gradient_form() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, V, generator=gen, dtype=F64, requires_grad=True)
    ls = logits.log_softmax(-1)
    lt = torch.randn(2, 3, V, generator=gen, dtype=F64).log_softmax(-1)
    lb = torch.randn(2, 3, V, generator=gen, dtype=F64).log_softmax(-1)
    y = torch.randint(0, V, (2, 3), generator=gen)
    mask = torch.ones(2, 3, dtype=torch.bool)
    adv = _opd2({"ls": ls, "lt": lt, "lb": lb, "y": y, "mask": mask})
    assert not adv.requires_grad
    logp = ls.gather(-1, y.unsqueeze(-1))[..., 0]
    loss, _ = clipped_ratio_loss(logp, logp.detach(), adv, mask)
    (g1,) = torch.autograd.grad(loss.sum(), logits, retain_graph=True)
    (g2,) = torch.autograd.grad(-(adv * logp).sum(), logits)
    assert torch.allclose(g1, g2, atol=1e-12)
