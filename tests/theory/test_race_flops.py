"""Unit tests of the RACE accounting: the hand-computed cases of the paper's FLOP model."""

from __future__ import annotations

import numpy as np
import pytest

from posttrain.errors import DomainError, ShapeError
from posttrain.theory.race_flops import (
    Accounting,
    PolicyCost,
    RewardCost,
    RewardKind,
    flops_per_step,
    learning_flops,
    reward_flops,
    search_flops,
)

TP, TR = np.full(2, 100.0), np.full((2, 4), 50.0)


def test_spec_cases_exact() -> None:
    full = flops_per_step(TP, TR, policy=PolicyCost(1e9))
    assert (full.search, full.learning, full.reward) == (1.2e12, 7.2e12, 0.0)
    assert abs(full.p - 7.2 / 8.4) < 1e-15
    lora = flops_per_step(TP, TR, policy=PolicyCost(1e9, n_lora=1e7, lora=True), ref_forward=True)
    assert lora.learning == 7.272e12
    prm = flops_per_step(TP, TR, policy=PolicyCost(1e9), reward=RewardCost(RewardKind.MODEL, n_params=7e9))
    assert prm.reward == 1.68e13


def test_prm_steps_and_judge_by_hand() -> None:
    tp, tr = np.array([10.0]), np.array([[8.0]])
    steps = reward_flops(tp, tr, reward=RewardCost(RewardKind.PRM_STEPS, n_params=1.0, steps=4))
    assert steps == 2.0 * (12 + 14 + 16 + 18)
    judge = reward_flops(tp, tr, reward=RewardCost(RewardKind.JUDGE, n_params=1.0, judge_output_tokens=5))
    assert judge == 2.0 * 23


def test_attention_generation_by_hand() -> None:
    policy = PolicyCost(1.0, n_layer=1, d_model=1)
    # prefill 4*(3*4/2) = 24; generate 2 tokens after 3: 4*(3*2 + 2*3/2) = 36; linear 2*(3 + 2)
    assert search_flops([3], [[2]], policy=policy, count_attention=True) == 24 + 36 + 10


def test_bad_inputs_name_the_argument() -> None:
    with pytest.raises(ShapeError, match="response_tokens"):
        search_flops([1, 2], [1, 2], policy=PolicyCost(1.0))
    with pytest.raises(DomainError, match="n_lora"):
        PolicyCost(1e9, n_lora=5.0)
    with pytest.raises(DomainError, match="n_params"):
        RewardCost(RewardKind.MODEL)
    with pytest.raises(ShapeError, match="trained"):
        flops_per_step(TP, TR, np.ones((2, 3), dtype=bool), policy=PolicyCost(1.0))


def test_executed_accountings_by_hand() -> None:
    """One group, K = 2 rows, T_p = 3, T_r = 2; body N - n_head = 10, head 4 (counted where logits are computed)."""
    policy = PolicyCost(14.0, n_head=4.0)
    tp, tr = [3.0], [[2.0, 2.0]]
    # generation: prefill 3 tokens + 1 head position; each row feeds its first sampled token (1 body, 1 head)
    assert search_flops(tp, tr, policy=policy, accounting=Accounting.UNSHARED) == 2 * (10 * 3 + 4) + 2 * 2 * (10 + 4)
    # unshared training pass: 5 tokens per row, head at T_r + 1 = 3 positions, x 6
    assert learning_flops(tp, tr, policy=policy, accounting=Accounting.UNSHARED) == 2 * 6 * (10 * 5 + 4 * 3)
    # shared prompt: the prompt once (3 tokens, head at 1), then 1 response token per row (head at 1)
    assert learning_flops(tp, tr, policy=policy, accounting=Accounting.SHARED_PROMPT) == 6 * (10 * 3 + 4 + 2 * 14)
    # a reference pass (forward only) of the shared path, and the per-token convention of the paper
    shared_ref = learning_flops(tp, tr, policy=policy, ref_forward=True, accounting=Accounting.SHARED_PROMPT)
    assert shared_ref == 8 * (10 * 3 + 4 + 2 * 14)
    assert learning_flops(tp, tr, policy=policy) == 2 * 6 * 14 * 5
    with pytest.raises(DomainError, match="n_head"):
        PolicyCost(1.0, n_head=2.0)


def test_attention_pairs_of_the_shared_prompt_path_by_hand() -> None:
    """Causal pairs: the prompt's 3 * 4 / 2 = 6, then each row's one response token sees 4 keys."""
    policy = PolicyCost(1.0, n_layer=1, d_model=1)
    shared = Accounting.SHARED_PROMPT
    with_attention = learning_flops([3.0], [[2.0, 2.0]], policy=policy, count_attention=True, accounting=shared)
    attention = with_attention - learning_flops([3.0], [[2.0, 2.0]], policy=policy, accounting=shared)
    assert attention == 3 * 4 * (6 + 2 * 4)
