"""The RACE FLOP formulas against `torch.utils.flop_counter.FlopCounterMode` counts of real passes.

Passes measured, on the tiny model (built in code) and on SmolLM2-135M-Instruct (slow; skipped when it
is not prepared): generation by `HFEngine` (prefix-shared prefill, then one token at a time on the KV
cache; ``eos_id = -1`` so every row runs ``T_r`` tokens), a training pass (`token_logprobs` forward and
backward) and a reference pass (forward under ``no_grad``), each through the trainer's unshared forward
(prompt + response per row) and its shared-prompt forward (``group_size = K``).

What is compared:

- **matmuls** (every weight matrix, the LM head included): the count with SDPA attention (which
  the CPU counter does not see) equals the formula with ``count_attention=False`` under
  ``Accounting.UNSHARED`` / ``SHARED_PROMPT`` and ``n_head = V d`` *exactly* (relative 1e-12: both are
  integers); elementwise ops (norms, activations, RoPE, softmax) are in neither;
- **attention scores** ($QK^\\top$, $AV$): the eager run minus the SDPA run. Eager attention computes the
  dense rectangle of every pass, the formula the causal pairs; the measured count equals the formula's plus
  ``4 L d`` times the masked (future) pairs, computed here from the pass shapes.

The paper's ``PER_TOKEN`` convention and a head counted at every token (``n_head = 0``) are not exact; their
errors are printed in the assertion messages and must exceed the rounding (so a wrong formula is caught).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from posttrain.theory.race_flops import Accounting, PolicyCost, learning_flops, search_flops

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")

from torch.utils.flop_counter import FlopCounterMode

from posttrain.llm.rollout.engine import HFEngine, SamplingConfig
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.rollout.shared_prefix import why_not_shared
from posttrain.llm.train.step_log import policy_cost

EXACT = 1e-12


@dataclass(frozen=True)
class Shape:
    groups: int
    k: int
    prompt: int
    response: int

    @property
    def rows(self) -> int:
        return self.groups * self.k


@dataclass(frozen=True)
class Measured:
    """One pass: FLOPs counted with SDPA (matmuls only) and eager (matmuls + attention) attention."""

    linear: float
    attention: float


def _count(model: Any, run: Callable[[], object]) -> Measured:
    totals = {}
    for impl in ("sdpa", "eager"):
        model.set_attn_implementation(impl)
        with FlopCounterMode(display=False) as counter:
            run()
        totals[impl] = float(counter.get_total_flops())
    model.set_attn_implementation("sdpa")
    return Measured(totals["sdpa"], totals["eager"] - totals["sdpa"])


def _batch(shape: Shape, vocab: int) -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(4, vocab, (shape.groups, shape.prompt), generator=g)
    responses = torch.randint(4, vocab, (shape.rows, shape.response), generator=g)
    return prompts.tolist(), prompts.repeat_interleave(shape.k, 0), responses


def measure(model: Any, vocab: int, shape: Shape) -> dict[str, Measured]:
    """Generation, and the training and reference passes of each forward path."""
    prompts, prompt_ids, response_ids = _batch(shape, vocab)
    prompt_mask, mask = torch.ones_like(prompt_ids, dtype=torch.bool), torch.ones_like(response_ids, dtype=torch.bool)
    engine = HFEngine(model, pad_id=0, eos_id=-1, sampling=SamplingConfig(max_new_tokens=shape.response))
    out = {"generation": _count(model, lambda: engine.generate(prompts, n=shape.k, seed=0))}
    assert why_not_shared(model, prompt_ids, prompt_mask, group_size=shape.k) is None
    for path, group_size in (("unshared", None), ("shared_prompt", shape.k)):

        def train(group_size: int | None = group_size) -> None:
            logp, _ = token_logprobs(model, prompt_ids, prompt_mask, response_ids, mask, group_size=group_size)
            (-logp.sum()).backward()

        def reference(group_size: int | None = group_size) -> None:
            with torch.no_grad():
                token_logprobs(model, prompt_ids, prompt_mask, response_ids, mask, group_size=group_size)

        out[f"train {path}"] = _count(model, train)
        out[f"reference {path}"] = _count(model, reference)
    model.zero_grad(set_to_none=True)
    return out


def _square_masked(t: int) -> int:
    return t * (t - 1) // 2


def masked_pairs(shape: Shape) -> dict[str, int]:
    """Future query-key pairs that eager attention computes and masks, per pass (the formula leaves them out)."""
    tp, tr = shape.prompt, shape.response
    prompt_once = shape.groups * _square_masked(tp)
    return {
        "generation": prompt_once,  # the prefill's square; decode steps have no future keys
        "train unshared": shape.rows * _square_masked(tp + tr),
        "reference unshared": shape.rows * _square_masked(tp + tr),
        # the prompt pass's square, then each row's T_r - 1 response queries over all of them
        "train shared_prompt": prompt_once + shape.rows * _square_masked(tr - 1),
        "reference shared_prompt": prompt_once + shape.rows * _square_masked(tr - 1),
    }


def formulas(policy: PolicyCost, shape: Shape, accounting: Accounting, *, attention: bool) -> dict[str, float]:
    tp, tr = [float(shape.prompt)] * shape.groups, [[float(shape.response)] * shape.k] * shape.groups
    out = {"generation": search_flops(tp, tr, policy=policy, count_attention=attention, accounting=accounting)}
    for path in (Accounting.UNSHARED, Accounting.SHARED_PROMPT):
        acc = path if accounting is not Accounting.PER_TOKEN else accounting
        kw: dict[str, Any] = {"policy": policy, "count_attention": attention, "accounting": acc}
        base = learning_flops(tp, tr, **kw)
        out[f"train {path.value}"] = base
        out[f"reference {path.value}"] = learning_flops(tp, tr, ref_forward=True, **kw) - base
    return out


def _policy(model: Any) -> PolicyCost:
    config = model.config
    return dataclasses.replace(policy_cost(model), n_head=float(config.vocab_size * config.hidden_size))


def check_model(model: Any, shape: Shape) -> None:
    vocab = model.config.vocab_size
    policy = _policy(model)
    measured = measure(model, vocab, shape)
    linear = formulas(policy, shape, Accounting.UNSHARED, attention=False)
    with_attention = formulas(policy, shape, Accounting.UNSHARED, attention=True)
    per_layer_pair = 4.0 * policy.n_layer * policy.d_model
    for name, got in measured.items():
        assert got.linear == pytest.approx(linear[name], rel=EXACT), (name, got.linear, linear[name])
        causal = with_attention[name] - linear[name]
        factor = 3.0 if name.startswith("train") else 1.0  # backward: two products per forward product
        dense = causal + factor * per_layer_pair * masked_pairs(shape)[name]
        assert got.attention == pytest.approx(dense, rel=EXACT), (name, got.attention, dense)
    # the paper's per-token convention, and the head charged at every fed token, are off by more than rounding
    for wrong in (
        formulas(policy, shape, Accounting.PER_TOKEN, attention=False),
        formulas(dataclasses.replace(policy, n_head=0.0), shape, Accounting.UNSHARED, attention=False),
    ):
        errors = {name: wrong[name] / got.linear - 1 for name, got in measured.items()}
        assert min(abs(e) for e in errors.values()) > 1e-6, errors


def test_formulas_equal_the_counted_flops_of_the_tiny_model(monkeypatch: pytest.MonkeyPatch) -> None:
    from posttrain.llm.rollout import shared_prefix
    from posttrain.llm.tools.tiny import TinyConfig, char_tokenizer, tiny_model

    # at this size sharing saves less than its extra forward call costs, so the trainer would not share: force it
    monkeypatch.setattr(shared_prefix, "SHARE_MIN_FLOPS", 0.0)

    model = tiny_model(TinyConfig(), len(char_tokenizer()))
    check_model(model, Shape(groups=2, k=3, prompt=7, response=5))


@pytest.mark.slow
def test_formulas_equal_the_counted_flops_of_smollm2() -> None:
    from transformers import AutoModelForCausalLM

    from posttrain.llm.tools.models import model_dir

    path = model_dir("smollm2-135m-instruct")
    if not (path / "config.json").is_file():
        pytest.skip(f"SmolLM2-135M-Instruct is not prepared at {path} (posttrain models prepare smollm2-135m-instruct)")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    check_model(model, Shape(groups=2, k=2, prompt=24, response=12))
