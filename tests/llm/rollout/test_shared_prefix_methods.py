"""The trainer and the methods' own forwards on the prompt-shared path equal the unshared forward (float64).

The tiny model's prompts cost less than the prompt pass's extra forward call, so by default it does not share
(`posttrain.llm.rollout.shared_prefix.worth_sharing`); here sharing is forced (``SHARE_MIN_FLOPS = 0``) or
turned off (``inf``). The RMS norms run in float64 (`exact_norms`): transformers computes them in float32
even in a float64 model, forward and backward, which bounds the agreement of any two differently batched
forwards at float32 rounding (measured 9.7e-8 relative on these gradients), where float64 norms agree to
1e-15.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from posttrain.estimators import (
    AggregationMode,
    aggregate,
    broadcast_sequence_advantages,
    clipped_ratio_loss,
    group_normalized_advantages,
    k3_kl,
)
from posttrain.llm.methods.mopd import topk_forward
from posttrain.llm.methods.needs import logp_filler
from posttrain.llm.rollout import logprobs, shared_prefix
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.logprobs import token_logprobs
from tests.llm.rollout.test_shared_prefix import EXACT, PROMPTS, exact_norms, f64, relative, rollout

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")


@pytest.fixture()
def shared_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the forwards that shared their prompts (``[groups]`` per call)."""
    calls: list[int] = []
    real = logprobs.shared_prompt_forward

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[1].shape[0] // kwargs["group_size"])
        return real(*args, **kwargs)

    monkeypatch.setattr(logprobs, "shared_prompt_forward", counting)
    return calls


def _sharing(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    monkeypatch.setattr(shared_prefix, "SHARE_MIN_FLOPS", 0.0 if on else float("inf"))


def _grads(model: Any) -> list[torch.Tensor]:
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def test_method_forwards_and_fillers_share_and_equal_unshared(
    tiny_dir: Any, tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, shared_calls: list[int]
) -> None:
    """The default training forward, Open-MOPD's top-K forward (`vocab_log_softmax`) and a teacher filler."""
    model = f64(tiny_dir)
    ids, pm, resp, mask = rollout(tiny[1], PROMPTS, 3, 7)
    topk = torch.randint(4, 40, (*resp.shape, 4), generator=torch.Generator().manual_seed(2))
    batch = RolloutBatch(ids, pm, resp, mask, rewards=torch.zeros(ids.shape[0]), group_size=3, topk_ids=topk)
    w = torch.randn(resp.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def default(m: Any, b: RolloutBatch, tau: float, grad: bool) -> tuple[Any, Any, dict[str, Any]]:
        logp, ent = token_logprobs(m, b.prompt_ids, b.prompt_mask, b.response_ids, b.mask, temperature=tau,
                                   with_entropy=True, entropy_grad=grad, group_size=b.group_size)  # fmt: skip
        return logp, ent, {}

    for forward in (default, topk_forward):
        runs = []
        for on in (True, False):
            _sharing(monkeypatch, on)
            model.zero_grad(set_to_none=True)
            logp, ent, live = forward(model, batch, 0.8, True)
            extra = sum(v.sum() for v in live.values())
            ((logp * w).sum() + 0.1 * ent.sum() + 0.01 * extra).backward()
            runs.append((logp.detach(), ent.detach(), [v.detach() for v in live.values()], _grads(model)))
        (a, b) = runs
        torch.testing.assert_close(a[0], b[0], rtol=0, atol=EXACT)
        torch.testing.assert_close(a[1], b[1], rtol=0, atol=EXACT)
        for x, y in zip(a[2], b[2], strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=EXACT)
        assert relative(a[3], b[3]) <= EXACT
    teacher = f64(tiny_dir)
    fill = logp_filler(teacher, 0.8)
    _sharing(monkeypatch, True)
    shared = fill(batch)
    _sharing(monkeypatch, False)
    torch.testing.assert_close(shared, fill(batch), rtol=0, atol=EXACT)
    assert shared_calls == [4, 4, 4]  # one shared forward each (4 groups), none when turned off


@pytest.mark.parametrize("micro", [None, 4], ids=["whole-batch", "micro-batches"])
def test_trainer_step_equals_the_unshared_forward_by_hand(
    tiny: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, shared_calls: list[int], micro: int | None
) -> None:
    """The trainer's GRPO + k3 KL + entropy loss and gradients with shared prompts, against the estimators on
    the unshared forward."""
    from tests.llm.methods.test_algorithm import G, K, _trainer

    algorithm = {"method": "grpo", "kl": "k3", "kl_coef": 0.05, "entropy_coef": 0.01}
    trainer = _trainer(tiny, algorithm, micro=micro)
    model = exact_norms(trainer.model)
    batch, _ = trainer.rollout()
    _sharing(monkeypatch, True)
    model.zero_grad(set_to_none=True)
    stats = trainer.accumulate_gradients(batch)
    got = _grads(model)
    assert shared_calls == ([G] if micro is None else [1] * G)
    _sharing(monkeypatch, False)
    model.zero_grad(set_to_none=True)
    adv = broadcast_sequence_advantages(group_normalized_advantages(batch.rewards.reshape(G, K)), batch.mask)
    logp, entropy = token_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask,
                                   with_entropy=True, entropy_grad=True)  # fmt: skip
    assert entropy is not None and batch.logp_old is not None and batch.logp_ref is not None
    tok, _ = clipped_ratio_loss(logp, batch.logp_old, adv, batch.mask)
    tok = tok + 0.05 * k3_kl(logp, batch.logp_ref) - 0.01 * entropy
    by_hand = aggregate(tok, batch.mask, AggregationMode.SEQ_MEAN_TOKEN_MEAN)
    by_hand.backward()
    assert stats["loss"] == pytest.approx(float(by_hand.detach()), rel=EXACT, abs=1e-15)
    assert relative(got, _grads(model)) <= EXACT
