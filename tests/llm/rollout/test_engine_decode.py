"""HFEngine's decode loop: stop tests every few tokens and compaction of finished rows change nothing."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest
import torch

from posttrain.errors import DomainError
from posttrain.llm.rollout.engine import HFEngine, SamplingConfig

NEEDS_CXX = pytest.mark.skipif(
    not any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "c++", "clang++")),
    reason="torch.compile on CPU (inductor) needs a C++ compiler; none is on PATH",
)


def _engine(tiny: tuple[Any, Any], eos: int, **options: Any) -> HFEngine:
    model, tok = tiny
    return HFEngine(model, pad_id=tok.pad_token_id, eos_id=eos, sampling=SamplingConfig(12, 1.2), **options)


@pytest.mark.parametrize("every", [1, 3, 5, 20])
@pytest.mark.parametrize("compact_below", [0.0, 0.75, 1.01])
def test_stop_interval_and_compaction_leave_tokens_and_logp_unchanged(
    tiny: tuple[Any, Any], every: int, compact_below: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Against the plain loop (a stop test every token, no compaction); same seed, rows end at <eos>."""
    model, tok = tiny
    prompts = [tok(p)["input_ids"] for p in ["1+2=", "12+345=", "9="]]
    with torch.no_grad():  # <eos> := the greedy first token of a prompt, so rows end at different steps
        eos = int(model(input_ids=torch.tensor([prompts[2]])).logits[0, -1].argmax())
    monkeypatch.setattr(HFEngine, "COMPACT_BELOW", 0.0)  # 0: never compact
    plain = _engine(tiny, eos, stop_check_every=1).generate(prompts, n=4, seed=5)
    monkeypatch.setattr(HFEngine, "COMPACT_BELOW", compact_below)  # 1.01: compact at every finished row
    compacted: list[int] = []
    real = HFEngine._compact

    def spy(self: HFEngine, cache: Any, running: torch.Tensor, batch: Any, attn: Any, future: Any) -> Any:
        out = real(self, cache, running, batch, attn, future)
        compacted.append(attn.shape[0] - out[1].shape[0])
        return out

    monkeypatch.setattr(HFEngine, "_compact", spy)
    ours = _engine(tiny, eos, stop_check_every=every).generate(prompts, n=4, seed=5)
    assert bool((~plain.mask).any()) and bool(plain.mask.any(dim=1).all())  # some rows ended early
    assert torch.equal(ours.response_ids, plain.response_ids)
    assert torch.equal(ours.mask, plain.mask)
    torch.testing.assert_close(ours.logp, plain.logp, rtol=0, atol=1e-6)
    if compact_below > 1 and every < plain.response_ids.shape[1]:
        assert sum(compacted) > 0  # the compacted path did run


def test_stop_check_every_must_be_positive(tiny: tuple[Any, Any]) -> None:
    with pytest.raises(DomainError, match="stop_check_every"):
        _engine(tiny, 0, stop_check_every=0)


@NEEDS_CXX
@pytest.mark.slow  # two torch.compile runs of the tiny model's decode step: ~45 s on a 2-core CPU
def test_compiled_decode_draws_the_same_tokens(tiny: tuple[Any, Any]) -> None:
    """``compile_decode``: the static-cache compiled decode samples what the eager loop samples.

    Rows end at different steps (so the static path's no-compaction, full-mask decode is exercised), and a
    second prompt width reuses the engine (the recompile with dynamic shapes)."""
    model, tok = tiny
    with torch.no_grad():
        eos = int(model(input_ids=torch.tensor([tok("9=")["input_ids"]])).logits[0, -1].argmax())
    eager, compiled = _engine(tiny, eos), _engine(tiny, eos, compile_decode=True)
    ended = []
    for texts in (["1+2=", "12+345=", "9="], ["123+4=", "5=", "67+8="]):
        prompts = [tok(p)["input_ids"] for p in texts]
        for greedy in (False, True):
            want = eager.generate(prompts, n=4, seed=7, greedy=greedy)
            got = compiled.generate(prompts, n=4, seed=7, greedy=greedy)
            ended.append(bool((~want.mask).any()))
            assert torch.equal(got.response_ids, want.response_ids)
            assert torch.equal(got.mask, want.mask)
            torch.testing.assert_close(got.logp, want.logp, rtol=0, atol=1e-5)
    assert any(ended)  # some rows ended early somewhere


def test_compile_decode_refuses_synced_gpus(tiny: tuple[Any, Any]) -> None:
    with pytest.raises(DomainError, match="compile_decode"):
        _engine(tiny, 0, compile_decode=True, synced_gpus=True)


def test_compile_decode_reaches_the_engine_from_the_config(tiny: tuple[Any, Any], tiny_dir: Any) -> None:
    from posttrain.llm.config import config_from_dict
    from posttrain.llm.run import ENGINE_FACTORIES

    model, tok = tiny
    for value in (False, True):
        cfg = config_from_dict({"rollout": {"compile_decode": value}})
        engine = ENGINE_FACTORIES["hf"](cfg, cfg.rollout.sampling(), model, tok, tiny_dir)
        assert isinstance(engine, HFEngine) and engine.compile_decode is value
    assert config_from_dict({}).rollout.compile_decode is False
