"""The trainer's per-step RACE FLOP split equals the accounting of the path that ran, applied by hand to the step's batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.llm.rollout import shared_prefix
from posttrain.llm.run import build_trainer
from posttrain.llm.tools.tiny import TinyConfig, char_tokenizer
from posttrain.theory.race_flops import Accounting, PolicyCost, learning_flops, search_flops
from tests.llm._lift import record_rollouts, small_config

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")


@pytest.mark.parametrize("share", [False, True], ids=["unshared", "shared-prompt"])
def test_logged_flops_are_those_of_the_path_that_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, share: bool
) -> None:
    """The tiny model's prompts are not worth sharing (`worth_sharing`): its steps are counted unshared; forced to
    share, with each prompt computed once. Generation: KV-cached, each prompt prefilled once."""
    if share:
        monkeypatch.setattr(shared_prefix, "SHARE_MIN_FLOPS", 0.0)
    cfg = small_config(algorithm={"method": "grpo", "kl": "k3", "kl_coef": 0.05}, updates_per_batch=3)
    trainer = build_trainer(cfg, tmp_path / "run")
    batches = record_rollouts(trainer)
    trainer.fit()
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    tiny = cfg.model.tiny  # N by hand: q, o; k, v (grouped heads); gated MLP, per layer
    d, kv = tiny.hidden_size, tiny.hidden_size * tiny.num_key_value_heads // tiny.num_attention_heads
    body = tiny.num_hidden_layers * (2 * d * d + 2 * d * kv + 3 * d * tiny.intermediate_size)
    head = len(char_tokenizer()) * d  # the LM head's [V, d] matmul (tied to the input embedding)
    policy = PolicyCost(body + head, n_head=head)
    accounting = Accounting.SHARED_PROMPT if share else Accounting.UNSHARED
    assert len(logged) == len(batches) == cfg.optim.steps
    for row, batch in zip(logged, batches, strict=True):
        g, k = cfg.data.prompts_per_step, cfg.rollout.group_size
        prompt = [int(batch.prompt_mask[i * k].sum()) for i in range(g)]
        response = [[int(batch.mask[i * k + j].sum()) for j in range(k)] for i in range(g)]
        search = search_flops(prompt, response, policy=policy, accounting=Accounting.UNSHARED)
        learning = learning_flops(prompt, response, policy=policy, epochs=3, ref_forward=True, accounting=accounting)
        assert row["flops/search"] == search and row["flops/learning"] == learning
        assert row["flops/reward"] == 0.0 and row["flops/total"] == search + learning
    # generation: each prompt prefilled once (its logits at the last position), then each response token but the last
    fed = sum(max(r - 1, 0) for rows in response for r in rows)
    assert logged[-1]["flops/search"] == 2 * body * sum(prompt) + 2 * head * g + 2 * (body + head) * fed


def test_policy_cost_counts_the_lm_head_once_and_agrees_with_posttrain_flops() -> None:
    """N with the LM head = N without it + V d (tied head: one matrix, two uses); the plan's tiny N agrees."""
    from posttrain.llm.tools.flops import plan_from_mapping
    from posttrain.llm.tools.tiny import tiny_model
    from posttrain.llm.train.step_log import policy_cost

    tiny = TinyConfig()
    vocab = len(char_tokenizer())
    for tied in (True, False):
        model = tiny_model(TinyConfig(tie_word_embeddings=tied), vocab)
        with_head, without = policy_cost(model).n_params, policy_cost(model, lm_head=False).n_params
        assert with_head - without == vocab * tiny.hidden_size
    cfg = small_config()
    plan = plan_from_mapping({"model": {"tiny": cfg.model.tiny}, "data": {"task": "addition"}})
    assert plan.n_params == policy_cost(tiny_model(cfg.model.tiny, vocab)).n_params
