"""The prompt-shared training forward equals one forward over prompt + response: log-probs, entropies, gradients.

Exactness is tested in float64 with the RMS norms kept in float64 (`exact_norms`: transformers computes them in
float32 whatever the model's dtype, which would bound any comparison at float32 rounding): there the shared
forward must agree to 1e-10 relative. Float32 and bfloat16 are tested against that float64 truth: the shared
forward may not be less accurate than the unshared one (factor 2). Fallbacks return the unshared forward's
values exactly and log their reason once.
"""

from __future__ import annotations

import logging
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from posttrain.errors import ShapeError
from posttrain.llm.rollout import shared_prefix
from posttrain.llm.rollout.engine import left_pad
from posttrain.llm.rollout.logprobs import response_logits, token_logprobs, vocab_log_softmax

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")

PROMPTS = ["1+2=", "12+345=", "9=", "(3*4)-5="]  # uneven lengths: left padding
EXACT = 1e-10


def exact_norms(model: Any) -> Any:
    """``model`` with every RMS norm computed in the input's dtype (float64 stays float64)."""

    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    for m in model.modules():
        if type(m).__name__.endswith("RMSNorm"):
            m.forward = types.MethodType(forward, m)
    return model


def rollout(
    tok: Any, prompts: list[str], k: int, t: int, *, seed: int = 0, vocab: int = 40
) -> tuple[torch.Tensor, ...]:
    """``(prompt_ids, prompt_mask, response_ids, mask)``: K samples per prompt, ragged responses, the last column
    off every row's mask (so it is trimmed)."""
    ids, pm = left_pad([tok(p)["input_ids"] for p in prompts], 0)
    ids, pm = ids.repeat_interleave(k, 0), pm.repeat_interleave(k, 0)
    g = torch.Generator().manual_seed(seed)
    resp = torch.randint(4, vocab, (ids.shape[0], t), generator=g)
    lengths = torch.randint(1, t, (ids.shape[0],), generator=g)
    lengths[0] = t - 1
    return ids, pm, resp, torch.arange(t) < lengths[:, None]


def forward_backward(
    model: Any, batch: tuple[torch.Tensor, ...], group_size: int | None, *, entropy_grad: bool = True
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """``(logp, entropy, gradients)`` of a fixed weighted sum of log-probs and entropies (float64 copies)."""
    ids, pm, resp, mask = batch
    w = torch.randn(resp.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    model.zero_grad(set_to_none=True)
    logp, ent = token_logprobs(
        model, ids, pm, resp, mask, temperature=0.8, with_entropy=True, entropy_grad=entropy_grad,
        group_size=group_size,
    )  # fmt: skip
    assert ent is not None
    ((logp * w.to(logp.dtype)).sum() + 0.1 * ent.sum()).backward()
    grads = [p.grad.double() for p in model.parameters() if p.requires_grad and p.grad is not None]
    return logp.detach().double(), ent.detach().double(), grads


def relative(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """Largest difference of two gradient lists, each tensor's relative to its largest entry in ``b``."""
    assert len(a) == len(b) > 0
    return max(float((x - y).abs().max() / y.abs().max().clamp(min=1e-30)) for x, y in zip(a, b, strict=True))


def assert_same(a: tuple[Any, ...], b: tuple[Any, ...], tol: float) -> None:
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=tol)
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=tol)
    assert relative(a[2], b[2]) <= tol


def f64(tiny_dir: Path, **kwargs: Any) -> Any:
    from transformers import AutoModelForCausalLM

    return exact_norms(AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float64, **kwargs)).train()


@pytest.fixture()
def tok(tiny: tuple[Any, Any]) -> Any:
    return tiny[1]


@pytest.fixture(autouse=True)
def share_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Share whatever the prompts cost: the tiny model's prompts are cheaper than the extra forward call."""
    monkeypatch.setattr(shared_prefix, "SHARE_MIN_FLOPS", 0.0)


@pytest.fixture()
def chunked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Response passes split at every row end (no cost per pass): the tiny model would never split them."""
    monkeypatch.setattr(shared_prefix, "CHUNK_OVERHEAD_FLOPS", 0.0)
    monkeypatch.setattr(shared_prefix, "CHUNK_OVERHEAD_SHARE", {"cpu": 0.0})


@pytest.mark.parametrize("prompts", [["1+2=", "3+4=", "5+6="], PROMPTS], ids=["same-length", "left-padded"])
@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("split", [False, True], ids=["one-pass", "chunked"])
def test_float64_equals_one_forward(
    tiny_dir: Path, tok: Any, prompts: list[str], k: int, entropy_grad: bool, split: bool, request: Any
) -> None:
    if split:
        request.getfixturevalue("chunked")
    model = f64(tiny_dir)
    batch = rollout(tok, prompts, k, 7)
    assert_same(
        forward_backward(model, batch, k, entropy_grad=entropy_grad),
        forward_backward(model, batch, None, entropy_grad=entropy_grad),
        EXACT,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_is_as_accurate_as_one_forward(tiny_dir: Path, tok: Any, dtype: torch.dtype) -> None:
    """Against the float64 truth: measured float32 6.9e-7 vs 6.5e-7 (log-probs), 8.8e-7 vs 9.7e-7 (gradients);
    bfloat16 6.3e-3 vs 6.3e-3 and 1.9e-2 vs 2.0e-2 (shared vs unshared)."""
    from transformers import AutoModelForCausalLM

    batch = rollout(tok, PROMPTS, 4, 7)
    truth = forward_backward(f64(tiny_dir), batch, None)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=dtype)
    shared, plain = forward_backward(model, batch, 4), forward_backward(model, batch, None)
    for i in (0, 1):
        assert (shared[i] - truth[i]).abs().max() <= 2 * (plain[i] - truth[i]).abs().max() + 1e-7
    assert relative(shared[2], truth[2]) <= 2 * relative(plain[2], truth[2]) + 1e-7


def test_each_prompt_runs_once_and_unused_columns_are_not_computed(tiny_dir: Path, tok: Any) -> None:
    """The prompt pass sees G rows, the response pass B rows of S - 1 columns (S: the last used column + 1), and
    columns that are padding in every row (here a micro-batch of the two short prompts) are left out."""
    model = f64(tiny_dir)
    ids, pm, resp, mask = rollout(tok, PROMPTS, 3, 7)
    rows = slice(0, 6)  # the groups of "1+2=" and "12+345=": the first of the 8 prompt columns is padding in both
    shapes = _fed_shapes(model)
    batch = (ids[rows], pm[rows], resp[rows], mask[rows])
    used = int(batch[3].any(0).nonzero().max()) + 1
    assert used < 7 and int(batch[1].any(0).long().argmax()) == 1  # trailing and leading columns to leave out
    assert_same(forward_backward(model, batch, 3), forward_backward(model, batch, None), EXACT)
    assert shapes[:2] == [(2, 8 - 1), (6, used - 1)]  # prompt pass [G, P'], response pass [B, S - 1]
    assert shapes[2] == (6, 8 + 7)  # the unshared forward: every row, every column


def test_chunks_feed_each_row_only_the_tokens_it_needs(tiny_dir: Path, tok: Any, chunked: None) -> None:
    """Split at every row end, the response passes feed each row its tokens but the last, and no padding."""
    model = f64(tiny_dir)
    batch = rollout(tok, PROMPTS, 4, 9)
    shapes = _fed_shapes(model)
    assert_same(forward_backward(model, batch, 4), forward_backward(model, batch, None), EXACT)
    passes = shapes[1 : shapes.index((16, batch[0].shape[1] + 9))]
    assert len(passes) > 2 and [r for r, _ in passes] == sorted((r for r, _ in passes), reverse=True)
    assert sum(r * c for r, c in passes) == int((batch[3].sum(1) - 1).sum())


def _fed_shapes(model: Any) -> list[tuple[int, ...]]:
    """The ``input_ids`` shapes of every forward of ``model`` from now on."""
    shapes: list[tuple[int, ...]] = []
    model.model.embed_tokens.register_forward_hook(lambda m, args, out: shapes.append(tuple(args[0].shape)))
    return shapes


def test_micro_batches_of_whole_groups_add_up_to_the_batch(tiny_dir: Path, tok: Any) -> None:
    model = f64(tiny_dir)
    batch = rollout(tok, PROMPTS, 2, 7)
    w = torch.randn(batch[2].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    model.zero_grad(set_to_none=True)
    for start in (0, 4):  # two micro-batches of 2 groups
        part = [x[start : start + 4] for x in batch]
        logp, _ = token_logprobs(model, *part, group_size=2)
        (logp * w[start : start + 4]).sum().backward()
    micro = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    logp, _ = token_logprobs(model, *batch)
    (logp * w).sum().backward()
    assert relative(micro, [p.grad for p in model.parameters()]) < EXACT


@pytest.mark.parametrize("split", [False, True], ids=["one-pass", "chunked"])
def test_lora_adapters(tiny_dir: Path, tok: Any, split: bool, request: Any) -> None:
    if split:
        request.getfixturevalue("chunked")
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False)
    model = peft.get_peft_model(f64(tiny_dir), config)
    batch = rollout(tok, PROMPTS, 4, 7)
    shared = forward_backward(model, batch, 4)
    assert len(shared[2]) == 2 * 3 * 2  # A and B of 3 modules in 2 layers: only the adapters train
    assert_same(shared, forward_backward(model, batch, None), EXACT)


@pytest.mark.parametrize("split", [False, True], ids=["one-pass", "chunked"])
def test_gradient_checkpointing_non_reentrant_shares_and_recomputes(
    tiny_dir: Path, tok: Any, caplog: pytest.LogCaptureFixture, split: bool, request: Any
) -> None:
    """Non-reentrant checkpointing (what ``model.gradient_checkpointing`` turns on): shared, exact, and the layers
    are recomputed in backward (layer 0's query projection runs twice per pass: forward and recomputation)."""
    if split:
        request.getfixturevalue("chunked")
    model = f64(tiny_dir)
    passes = _fed_shapes(model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batch = rollout(tok, PROMPTS, 4, 7)
    calls = [0]
    model.model.layers[0].self_attn.q_proj.register_forward_pre_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    with caplog.at_level(logging.WARNING):
        shared = forward_backward(model, batch, 4)
    assert calls[0] == 2 * len(passes) and (len(passes) > 2) == split and not caplog.records
    assert_same(shared, forward_backward(model, batch, None), EXACT)
    assert not any(hasattr(m, "__dict__") and "_can_checkpoint_with_cache" in m.__dict__ for m in model.modules())


def _fallback(
    model: Any, batch: tuple[torch.Tensor, ...], k: int, caplog: pytest.LogCaptureFixture, match: str
) -> None:
    """The forward with ``group_size`` logs ``match`` once and returns the unshared forward's values exactly."""
    shared_prefix._LOGGED.clear()
    with caplog.at_level(logging.WARNING, logger=shared_prefix.__name__):
        shared = forward_backward(model, batch, k)
        forward_backward(model, batch, k)
    assert [r.getMessage() for r in caplog.records if match in r.getMessage()] and len(caplog.records) == 1
    assert_same(shared, forward_backward(model, batch, None), 0.0)


def test_reentrant_checkpointing_falls_back(tiny_dir: Path, tok: Any, caplog: pytest.LogCaptureFixture) -> None:
    model = f64(tiny_dir)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    _fallback(model, rollout(tok, PROMPTS, 4, 7), 4, caplog, "reentrant gradient checkpointing")
    with torch.no_grad():  # no backward, nothing recomputed: shared
        assert shared_prefix.why_not_shared(model, *rollout(tok, PROMPTS, 4, 7)[:2], group_size=4) is None


def test_rows_of_a_group_with_different_prompts_fall_back(
    tiny_dir: Path, tok: Any, caplog: pytest.LogCaptureFixture
) -> None:
    batch = rollout(tok, PROMPTS, 4, 7)
    ids = batch[0].clone()
    ids[1, -1] = 9  # one sample's prompt differs from its group's
    _fallback(f64(tiny_dir), (ids, *batch[1:]), 4, caplog, "different prompts")


def test_sliding_window_layers_fall_back(tiny_dir: Path, tok: Any, caplog: pytest.LogCaptureFixture) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = AutoConfig.from_pretrained(tiny_dir).to_dict()
    fields.pop("layer_types", None)  # derived again from the sliding-window options
    config = type(AutoConfig.from_pretrained(tiny_dir))(
        **{**fields, "use_sliding_window": True, "sliding_window": 4, "max_window_layers": 0}
    )
    assert set(config.layer_types) == {"sliding_attention"}
    model = exact_norms(AutoModelForCausalLM.from_pretrained(tiny_dir, config=config, dtype=torch.float64))
    _fallback(model, rollout(tok, PROMPTS, 4, 7), 4, caplog, "DynamicSlidingWindowLayer")


class NoCache(torch.nn.Module):
    """A causal LM whose forward takes no KV cache."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.inner = model

    def forward(
        self, input_ids: Any, attention_mask: Any, position_ids: Any, use_cache: bool, logits_to_keep: int
    ) -> Any:
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=use_cache, logits_to_keep=logits_to_keep)  # fmt: skip


def test_a_forward_without_a_cache_falls_back(tiny_dir: Path, tok: Any, caplog: pytest.LogCaptureFixture) -> None:
    model = NoCache(f64(tiny_dir))
    model.config = model.inner.config
    _fallback(model, rollout(tok, PROMPTS, 4, 7), 4, caplog, "takes no KV cache")


def test_one_sample_per_prompt_is_not_a_fallback(tiny_dir: Path, tok: Any, caplog: pytest.LogCaptureFixture) -> None:
    shared_prefix._LOGGED.clear()
    with caplog.at_level(logging.WARNING, logger=shared_prefix.__name__):
        assert_same(forward_backward(f64(tiny_dir), rollout(tok, PROMPTS, 1, 5), 1),
                    forward_backward(f64(tiny_dir), rollout(tok, PROMPTS, 1, 5), None), 0.0)  # fmt: skip
    assert not caplog.records
    with pytest.raises(ShapeError, match="group_size"):
        token_logprobs(f64(tiny_dir), *rollout(tok, PROMPTS, 3, 5), group_size=5)


def test_vocab_log_softmax_and_response_logits(tiny_dir: Path, tok: Any) -> None:
    """The full-vocabulary log-probs of the top-K fillers: equal on every response position of the mask."""
    from posttrain.llm.rollout.batch import RolloutBatch

    model = f64(tiny_dir).eval()
    ids, pm, resp, mask = rollout(tok, PROMPTS, 3, 7)
    batch = RolloutBatch(ids, pm, resp, mask, rewards=torch.zeros(ids.shape[0]), group_size=3)
    with torch.no_grad():
        shared = vocab_log_softmax(model, batch, temperature=0.7)
        plain = torch.log_softmax(response_logits(model, ids, pm, resp, mask, temperature=0.7), dim=-1)
    assert shared.shape == plain.shape == (*resp.shape, model.config.vocab_size)
    torch.testing.assert_close(shared[mask], plain[mask], rtol=0, atol=EXACT)


def test_prompts_cheaper_than_a_forward_call_are_not_shared(tiny_dir: Path, tok: Any, monkeypatch: Any) -> None:
    """By default the tiny model's prompts (a few hundred thousand FLOPs) are not worth the prompt pass's call,
    without a log; SmolLM2's 41-token prompts, 8 samples each, are (7 x 41 x 2 x 135M FLOPs)."""
    monkeypatch.setattr(shared_prefix, "SHARE_MIN_FLOPS", 2e9)
    model = f64(tiny_dir)
    ids, pm, resp, mask = rollout(tok, PROMPTS, 4, 7)
    facts = shared_prefix.row_facts(model, ids, pm, mask, group_size=4)
    assert facts.prompt_tokens == sum(len(tok(p)["input_ids"]) for p in PROMPTS)
    assert shared_prefix.why_not_shared(model, ids, pm, group_size=4, facts=facts) is None
    assert not shared_prefix.worth_sharing(model, facts, group_size=4)
    shapes = _fed_shapes(model)
    assert_same(
        forward_backward(model, (ids, pm, resp, mask), 4), forward_backward(model, (ids, pm, resp, mask), None), 0.0
    )
    assert shapes[0] == shapes[1] == (16, ids.shape[1] + 7)  # one unshared forward each
    big = type(facts)(True, 0, (), prompt_tokens=41)
    monkeypatch.setattr(shared_prefix, "_flops_per_token", lambda m: 2 * 135e6)
    assert shared_prefix.worth_sharing(model, big, group_size=8)
