"""MuonWithAdamW on a tiny causal LM: routing, agreement with the pure functions, state round trip."""

from __future__ import annotations

import copy

import pytest
import torch

from posttrain.estimators.optim import adamw_init, adamw_update, muon_init, muon_update, route_muon_parameters

transformers = pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")

from posttrain.llm.tools.tiny import ONE_LAYER, tiny_model  # noqa: E402


def _model() -> torch.nn.Module:
    return tiny_model(ONE_LAYER, 32)  # type: ignore[no-any-return]


def _loss(model: torch.nn.Module) -> torch.Tensor:
    ids = torch.arange(12).reshape(2, 6) % 32
    return model(input_ids=ids, labels=ids).loss


def test_one_step_equals_pure_functions_and_routes_correctly() -> None:
    from posttrain.llm.train.muon import MuonWithAdamW

    model = _model()
    ref = copy.deepcopy(model)
    opt = MuonWithAdamW(model, lr=0.02, adamw_lr=1e-3, compute_dtype=None)
    muon_names = opt.param_groups[0]["names"]
    assert all(n.endswith("_proj.weight") for n in muon_names)
    assert not any("embed" in n or "norm" in n or "bias" in n for n in muon_names)
    _loss(model).backward()
    opt.step()

    _loss(ref).backward()
    named = dict(ref.named_parameters())
    m_names, a_names = route_muon_parameters(named.items())
    assert m_names == muon_names
    ps = [named[n] for n in m_names]
    ups, _ = muon_update([p.grad for p in ps], muon_init(ps), ps, lr=0.02, compute_dtype=None)
    qs = [named[n] for n in a_names]
    aups, _ = adamw_update([q.grad for q in qs], adamw_init(qs), qs, lr=1e-3)
    got = dict(model.named_parameters())
    for n, p, u in zip(m_names + a_names, ps + qs, ups + aups, strict=True):
        torch.testing.assert_close(got[n].detach(), (p + u).detach(), atol=1e-6, rtol=1e-6)
    assert opt.last_hidden_rms is not None and float(opt.last_hidden_rms) > 0


def test_state_dict_round_trip_continues_identically() -> None:
    from posttrain.llm.train.muon import MuonWithAdamW

    a, b = _model(), _model()
    oa = MuonWithAdamW(a, lr=0.02, compute_dtype=None)
    for _ in range(2):
        oa.zero_grad()
        _loss(a).backward()
        oa.step()
    b.load_state_dict(a.state_dict())
    ob = MuonWithAdamW(b, lr=0.02, compute_dtype=None)
    ob.load_state_dict(copy.deepcopy(oa.state_dict()))
    for model, opt in ((a, oa), (b, ob)):
        opt.zero_grad()
        _loss(model).backward()
        opt.step()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), n


def test_trainer_runs_and_resumes_with_muon(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`optim.name: MuonWithAdamW` is selectable in a run config; a resumed run matches an uninterrupted one."""
    import json

    from posttrain.llm.run import build_trainer
    from posttrain.llm.train.muon import MuonWithAdamW
    from tests.llm._lift import small_config

    optim = {"lr": 0.01, "name": "MuonWithAdamW", "options": {"adamw_lr": 1e-3}, "scheduler": "constant"}
    checkpoint = {"every": 1, "keep": 3}
    cfg = small_config(checkpoint=checkpoint, steps=3, **optim)
    full = build_trainer(cfg, tmp_path / "full")
    assert isinstance(full.optimizer, MuonWithAdamW)
    full.fit()
    part = build_trainer(small_config(checkpoint=checkpoint, steps=2, **optim), tmp_path / "part")
    part.fit()
    resumed = build_trainer(cfg, tmp_path / "part", resume=True)
    resumed.fit()

    def rows(p):  # type: ignore[no-untyped-def]
        out = [json.loads(x) for x in (p / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.endswith("time_s") and k != "resumed_with"} for r in out]

    assert rows(tmp_path / "full")[-1] == rows(tmp_path / "part")[-1]


def test_config_reads_the_one_optimizer_table() -> None:
    """``optim.name`` is checked against `optimizer_names` (torch's and the model-built ones) and the options
    against the class's annotated signature: the config keeps no list of its own."""
    from posttrain.errors import DomainError
    from posttrain.llm.config import config_from_dict
    from posttrain.llm.train.optim import MODEL_OPTIMIZERS, optimizer_names

    assert set(MODEL_OPTIMIZERS) <= set(optimizer_names()) and "AdamW" in optimizer_names()
    for name in MODEL_OPTIMIZERS:
        assert config_from_dict({"optim": {"name": name}}).optim.name == name
    with pytest.raises(DomainError, match=r"^optim\.options\.ns_steps: expected an integer in \[1, 100\], got 0$"):
        config_from_dict({"optim": {"name": "MuonWithAdamW", "options": {"ns_steps": 0}}})
    with pytest.raises(DomainError, match=r"^optim\.options\.compute_dtype: not settable"):
        config_from_dict({"optim": {"name": "MuonWithAdamW", "options": {"compute_dtype": "float32"}}})


@pytest.mark.parametrize("scale", ["original", "match_rms_adamw"])
def test_bf16_step_runs_torch_muon_and_fused_adamw_and_equals_the_pure_functions(scale: str) -> None:
    """The default (bfloat16 Newton-Schulz) is torch.optim.Muon + fused AdamW, and is still our formula."""
    from posttrain.estimators.optim import group_update_rms
    from posttrain.llm.train.muon import MuonWithAdamW

    model = _model()
    ref = copy.deepcopy(model)
    opt = MuonWithAdamW(model, lr=0.02, adamw_lr=1e-3, scale=scale)
    assert [type(o) for o in opt._inner] == [torch.optim.Muon, torch.optim.AdamW]
    assert opt._inner[1].param_groups[0]["fused"] is True
    _loss(model).backward()
    opt.step()

    _loss(ref).backward()
    named = dict(ref.named_parameters())
    m_names, a_names = route_muon_parameters(named.items())
    ps, qs = [named[n] for n in m_names], [named[n] for n in a_names]
    ups, _ = muon_update([p.grad for p in ps], muon_init(ps), ps, lr=0.02, scale=scale, compute_dtype=torch.bfloat16)
    aups, _ = adamw_update([q.grad for q in qs], adamw_init(qs), qs, lr=1e-3)
    got = dict(model.named_parameters())
    with torch.no_grad():
        for n, p, u in zip(m_names, ps, ups, strict=True):  # bf16 iterations in both: equal to bf16 rounding
            torch.testing.assert_close(got[n] - p, u, atol=1e-5 * float(u.abs().max()), rtol=0)
        for n, q, u in zip(a_names, qs, aups, strict=True):
            torch.testing.assert_close(got[n], q + u, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(opt.last_hidden_rms, group_update_rms(ups), rtol=1e-4, atol=0)
        flat = torch.cat([u.reshape(-1) for u in aups])
        torch.testing.assert_close(opt.last_update_rms["adamw"], flat.square().mean().sqrt(), rtol=1e-4, atol=0)


def test_lr_schedule_and_loaded_state_reach_the_inner_optimizers() -> None:
    """One optimizer to the trainer: a scheduler's rate and a loaded state drive torch's Muon and AdamW."""
    from posttrain.llm.train.muon import MuonWithAdamW

    a, b = _model(), _model()
    oa = MuonWithAdamW(a, lr=0.02, adamw_lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(oa, lambda step: 0.5**step)
    for _ in range(2):
        oa.zero_grad()
        _loss(a).backward()
        oa.step()
        sched.step()
    assert [o.param_groups[0]["lr"] for o in oa._inner] == pytest.approx([0.02 / 4, 1e-3 / 4])
    b.load_state_dict(a.state_dict())
    ob = MuonWithAdamW(b, lr=0.02, adamw_lr=1e-3)
    ob.load_state_dict(copy.deepcopy(oa.state_dict()))
    assert [o.param_groups[0]["lr"] for o in ob._inner] == pytest.approx([0.02 / 4, 1e-3 / 4])
    for model, opt in ((a, oa), (b, ob)):
        opt.zero_grad()
        _loss(model).backward()
        opt.step()
    for (n, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), n
