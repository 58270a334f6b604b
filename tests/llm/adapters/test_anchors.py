"""Each recipe and anchor statement of docs/anchors.md, executed against the installed anchor.

TRL 1.16 and verl 0.9.1 are installed by ``make test-adapters`` (``.venv-adapters``); elsewhere these tests skip.
TRL's advantage and loss code runs for real on fixed float64 inputs (`_trl_harness`); verl's functions are
called directly. The sections follow the page. OpenRLHF and NeMo-RL are not installed: their columns are read
from their code, not executed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from posttrain.errors import ShapeError
from posttrain.estimators import (
    AggregationMode,
    aggregate,
    clipped_ratio_loss,
    group_normalized_advantages,
    gspo_loss,
    k1_kl,
    k2_kl,
    k3_kl,
    log_ratio,
    masked_sum,
    masked_whiten,
    ppo_clip_objective,
    reinforce_pp_advantages,
    rloo_advantages,
    straight_through,
)
from posttrain.llm.adapters.convert import global_aggregate
from posttrain.llm.adapters.trl_recipe import batch_scaled_advantages

MODES = [m.value for m in AggregationMode]


def _verl() -> Any:
    return pytest.importorskip(
        "verl.trainer.ppo.core_algos", reason="verl is not installed (make test-adapters installs verl 0.9.1)"
    )


def _trl() -> Any:
    pytest.importorskip("datasets", reason="TRL's datasets dependency is missing")
    return pytest.importorskip("trl", reason="TRL is not installed (the [trl] extra; make test-adapters installs it)")


def _harness() -> Any:
    _trl()
    from tests.llm.adapters import _trl_harness

    return _trl_harness


def _verl_advantage(name: str, scores: torch.Tensor, uids: np.ndarray, **kw: Any) -> torch.Tensor:
    """verl's estimator ``name`` on one score per row (placed on the last of two valid tokens)."""
    tokens = torch.zeros(scores.shape[0], 2, dtype=scores.dtype)
    tokens[:, 1] = scores
    fn = _verl().get_adv_estimator_fn(name)
    return fn(token_level_rewards=tokens, response_mask=torch.ones_like(tokens), index=uids, **kw)[0][:, 1]


def _uids(groups: int, k: int) -> np.ndarray:
    return np.array([f"p{i // k}" for i in range(groups * k)], dtype=object)


def _one_token_batch(logp: list[float], old: list[float], ref: list[float], rewards: list[float]) -> Any:
    """Completions of one (terminated) token each: a `Batch` with the given log-probs and rewards."""
    h = _harness()

    def col(x: list[float]) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.float64).unsqueeze(-1)

    n = len(logp)
    return h.Batch([[h.EOS]] * n, [[r] for r in rewards], col(old), col(logp), col(ref), None, col([0.5] * n))


# --- Group-normalised advantages ---------------------------------------------------------------


def test_verl_grpo_adds_eps_to_the_bessel_std_with_no_variance_floor() -> None:
    """Both verl 0.9.1 estimators are ours with eps=1e-6, also for a group whose variance is below eps."""
    rewards = torch.tensor([[0.0, 1e-4, 0.0, 1e-4], [1.0, 0.0, 0.5, 0.25], [3.0, -1.0, 2.0, 0.0]])
    ours = group_normalized_advantages(rewards, eps=1e-6).reshape(-1)
    assert float(ours[1]) > 0.8  # a variance floor of 1e-6 (std 1e-3) would give ~0.05
    for name in ("grpo", "grpo_vectorized"):
        torch.testing.assert_close(_verl_advantage(name, rewards.reshape(-1), _uids(3, 4)), ours, rtol=1e-5, atol=1e-5)


def test_verl_leaves_float32_rounding_on_a_constant_group_ours_is_exactly_zero() -> None:
    rewards = torch.full((1, 7), 0.7)
    for name in ("grpo", "grpo_vectorized"):
        assert float(_verl_advantage(name, rewards.reshape(-1), _uids(1, 7)).abs().max()) > 0.05
    assert bool((group_normalized_advantages(rewards) == 0).all())


def test_verl_singleton_group_is_the_reward_over_one_plus_eps_ours_zero() -> None:
    theirs = _verl_advantage("grpo", torch.tensor([2.0, 1.0, 0.0]), np.array(["a", "b", "b"], dtype=object))
    assert float(theirs[0]) == pytest.approx(2.0 / (1 + 1e-6))  # the recipe: rewards / (1 + eps)
    assert float(group_normalized_advantages(torch.tensor([[2.0]]))[0, 0]) == 0.0


TRL_SCALING = {
    "group": lambda r: group_normalized_advantages(r, eps=1e-4),
    "none": lambda r: group_normalized_advantages(r, scale_by_std=False),
    "batch": lambda r: batch_scaled_advantages(r, eps=1e-4),
}


@pytest.mark.parametrize("scale", list(TRL_SCALING))
def test_trl_grpo_advantages_are_the_recipe_of_scale_rewards(scale: str, tiny_dir: Path, tmp_path: Path) -> None:
    trl, h = _trl(), _harness()
    batch = h.random_batch(0)
    out = h.score(h.build(trl.GRPOTrainer, trl.GRPOConfig, tiny_dir, tmp_path, batch, scale_rewards=scale))
    rewards = torch.tensor([row[0] for row in batch.rewards], dtype=torch.float64).view(-1, 4)
    torch.testing.assert_close(out["advantages"], TRL_SCALING[scale](rewards).reshape(-1), rtol=1e-9, atol=1e-10)


def test_trl_singleton_groups_get_zero(tiny_dir: Path, tmp_path: Path) -> None:
    """TRL trains with K >= 2; evaluation with num_generations_eval=1 takes the std as 0: advantage 0, as ours."""
    trl, h = _trl(), _harness()
    trainer = h.build(trl.GRPOTrainer, trl.GRPOConfig, tiny_dir, tmp_path, h.random_batch(1), num_generations_eval=1)
    assert bool((h.score(trainer, train=False)["advantages"] == 0).all())


# --- RLOO ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("normalize", [False, True])
def test_trl_rloo_advantages_are_the_recipe(normalize: bool, tiny_dir: Path, tmp_path: Path) -> None:
    """R - beta sum_t m k1(old, ref), then rloo_advantages, then (normalize_advantages) a batch z-score with 1e-4."""
    trl, h = _trl(), _harness()
    batch = h.random_batch(2)
    trainer = h.build(
        trl.RLOOTrainer, trl.RLOOConfig, tiny_dir, tmp_path, batch, mixin=h.RlooStubbed, beta=0.05,
        normalize_advantages=normalize,
    )  # fmt: skip
    out = h.score(trainer)
    mask = out["completion_mask"].bool()
    rewards = torch.tensor([row[0] for row in batch.rewards], dtype=torch.float64)
    shaped = rewards - 0.05 * masked_sum(k1_kl(batch.old, batch.ref), mask, dim=-1)
    advantages = rloo_advantages(shaped.view(-1, 4)).reshape(-1)
    if normalize:
        advantages = group_normalized_advantages(advantages.view(1, -1), eps=1e-4).reshape(-1)
    torch.testing.assert_close(out["advantages"], advantages, rtol=1e-9, atol=1e-10)


def test_trls_rloo_z_score_is_not_a_variance_whitening() -> None:
    a = torch.tensor([[0.01, -0.01]])
    assert float(group_normalized_advantages(a, eps=1e-4)[0, 0]) == pytest.approx(0.70214, abs=1e-5)  # TRL
    assert float(masked_whiten(a, torch.ones_like(a, dtype=torch.bool))[0, 0]) == pytest.approx(0.70709, abs=1e-5)


def test_rloo_singleton_group_verl_keeps_the_reward_or_zeroes_it_ours_refuses() -> None:
    scores, uids = torch.tensor([2.0, 1.0, 0.0]), np.array(["a", "b", "b"], dtype=object)
    assert float(_verl_advantage("rloo", scores, uids)[0]) == 2.0
    assert float(_verl_advantage("rloo_vectorized", scores, uids)[0]) == 0.0
    with pytest.raises(ShapeError, match="K >= 2"):
        rloo_advantages(torch.tensor([[2.0]]))


# --- REINFORCE++ (the holes in the mask: tests/llm/adapters/test_verl.py) -------------------------


def test_reinforce_pp_one_valid_token_verl_raises_ours_gives_zero() -> None:
    core = _verl()
    from verl.trainer.config import AlgoConfig

    rewards, mask = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0]])
    with pytest.raises(ValueError, match="sum of the mask is one"):
        core.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=AlgoConfig())
    assert bool((reinforce_pp_advantages(rewards, mask.bool()) == 0).all())


def test_reinforce_pp_baseline_singleton_group_verl_scores_the_reward() -> None:
    core = _verl()
    scores = torch.tensor([2.0, 1.0, 0.0])
    tokens = torch.zeros(3, 3)
    tokens[:, -1] = scores
    mask = torch.ones(3, 3)
    theirs, _ = core.compute_reinforce_plus_plus_baseline_outcome_advantage(
        tokens, mask, np.array(["a", "b", "b"], dtype=object)
    )
    centred = torch.tensor([2.0, 0.5, -0.5]).unsqueeze(-1).expand(3, 3)  # the singleton keeps R (mean taken as 0)
    torch.testing.assert_close(theirs, masked_whiten(centred, mask.bool()))


# --- Clipped-ratio policy loss --------------------------------------------------------------------


def _actor(**overrides: Any) -> Any:
    _verl()
    from verl.workers.config.actor import ActorConfig

    return ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=2, **overrides)


def test_verl_vanilla_metrics_are_our_diagnostics_and_both_clamp_the_log_ratio() -> None:
    core = _verl()
    old = torch.zeros(2, 4)
    logp = torch.tensor([[25.0, 0.3, -0.4, 2.0], [0.05, 1.5, 0.1, -0.3]])
    adv = torch.tensor([[-1.0] * 4, [1.0] * 4])
    mask = torch.ones(2, 4, dtype=torch.bool)
    loss, metrics = core.compute_policy_loss_vanilla(old, logp, adv, mask, "token-mean", _actor(clip_ratio_c=3.0))
    per_token, diag = clipped_ratio_loss(logp, old, adv, mask, dual_clip=3.0)
    torch.testing.assert_close(loss, aggregate(per_token, mask, "token-mean"))
    assert metrics["actor/ppo_kl"] == pytest.approx(float(diag.approx_kl))  # -(mean log-ratio clamped at +-20)
    assert float(diag.approx_kl) == pytest.approx(-(20.0 + 0.3 - 0.4 + 2.0 + 0.05 + 1.5 + 0.1 - 0.3) / 8)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(float(diag.clip_frac))
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(float(diag.dual_clip_frac))
    assert float(diag.dual_clip_frac) > 0 and float(diag.clip_frac) > 0


def test_a_token_where_the_log_ratio_guard_binds_counts_as_clipped_in_ours_only() -> None:
    """A > 0 and log-ratio -25: the +-20 guard zeroes the gradient; our clip_frac counts it, verl's does not."""
    core = _verl()
    old, logp, adv = torch.zeros(1, 2), torch.tensor([[-25.0, 0.05]]), torch.ones(1, 2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    _, metrics = core.compute_policy_loss_vanilla(old, logp, adv, mask, "token-mean", _actor())
    assert metrics["actor/pg_clipfrac"] == 0.0
    assert float(clipped_ratio_loss(logp, old, adv, mask, dual_clip=3.0)[1].clip_frac) == 0.5


def test_a_nan_off_the_mask_reaches_neither_verls_loss_nor_ours() -> None:
    core = _verl()
    old, adv, mask = torch.zeros(1, 3), torch.ones(1, 3), torch.tensor([[True, True, False]])
    grads = []
    for fn in (
        lambda lp: core.compute_policy_loss_vanilla(old, lp, adv, mask, "token-mean", _actor())[0],
        lambda lp: aggregate(clipped_ratio_loss(lp, old, adv, mask, dual_clip=3.0)[0], mask),
    ):
        logp = torch.tensor([[0.1, -0.2, float("nan")]], requires_grad=True)
        loss = fn(logp)
        assert math.isfinite(float(loss.detach()))
        grads.append(torch.autograd.grad(loss, logp)[0])
    torch.testing.assert_close(grads[0], grads[1])
    assert float(grads[1][0, 2]) == 0.0


def test_trl_does_not_clamp_the_log_ratio(tiny_dir: Path, tmp_path: Path) -> None:
    """A token with log-ratio 25 and A < 0: TRL's loss is |A| e^25 there; the recipe log_ratio(..., clamp=None)."""
    trl, h = _trl(), _harness()
    batch = _one_token_batch([0.1, 25.0, -0.2, 0.0], [0.0] * 4, [0.0] * 4, [1.0, 0.0, 0.0, 0.0])
    trainer = h.build(
        trl.GRPOTrainer, trl.GRPOConfig, tiny_dir, tmp_path, batch, loss_type="bnpo", num_iterations=2, beta=0.0
    )
    out = h.score(trainer)
    value, _ = h.loss_and_grad(trainer, out, accumulation=1)
    adv = out["advantages"].unsqueeze(-1)
    assert float(adv[1]) < 0
    ratio = torch.exp(log_ratio(batch.logp, batch.old, clamp=None))
    recipe = ppo_clip_objective(ratio, adv, clip_low=0.2, clip_high=0.2, dual_clip=None)[0].mean()
    torch.testing.assert_close(value, recipe, rtol=1e-12, atol=0.0)
    mask = torch.ones_like(batch.logp, dtype=torch.bool)
    clamped = aggregate(clipped_ratio_loss(batch.logp, batch.old, out["advantages"], mask)[0], mask)
    assert float(value) / float(clamped) == pytest.approx(math.exp(5.0), rel=1e-3)


# --- GSPO ----------------------------------------------------------------------------------------


def test_verl_gspo_clamps_the_sequence_log_ratio_at_10_and_follows_loss_agg_mode() -> None:
    core = _verl()
    old = torch.zeros(2, 3)
    logp = torch.tensor([[12.0, 12.5, 11.5], [0.05, -0.02, 0.0]])
    adv = torch.tensor([[-1.0] * 3, [0.5] * 3])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    values = {}
    for mode in MODES:
        config = _actor(loss_agg_mode=mode)
        values[mode], _ = core.compute_policy_loss_gspo(old, logp, adv, mask, mode, config)
        per_token, _ = gspo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
        torch.testing.assert_close(values[mode], aggregate(per_token, mask, mode))
    assert float(values["token-sum"]) == pytest.approx(3 * math.exp(10.0) - 0.5 * math.exp(0.05 / 1), rel=1e-5)
    assert not torch.allclose(values["token-mean"], values["seq-mean-token-mean"])  # verl does not force one mode


# --- Aggregation ---------------------------------------------------------------------------------


def test_check_vector_and_empty_rows_against_verl_agg_loss() -> None:
    core = _verl()
    values = torch.tensor([[1.0, 1.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0], [7.0, 7.0, 7.0, 7.0]])
    mask = torch.tensor([[True, True, False, False], [True] * 4, [False] * 4])  # the third row is empty
    expected = {
        "token-mean": 10 / 6,
        "token-sum": 10.0,
        "seq-mean-token-mean": 1.5,
        "seq-mean-token-sum": 5.0,
        "seq-mean-token-sum-norm": 1.25,
    }
    for mode, value in expected.items():
        assert float(core.agg_loss(values, mask.float(), mode)) == pytest.approx(value, rel=1e-6)
        assert float(aggregate(values, mask, mode)) == pytest.approx(value, rel=1e-6)


@pytest.mark.parametrize(
    ("loss_type", "mode"),
    [("grpo", "seq-mean-token-mean"), ("dr_grpo", "seq-mean-token-sum-norm"), ("luspo", "seq-mean-token-sum")],
)
def test_trl_sequence_means_count_every_row(loss_type: str, mode: str, tiny_dir: Path, tmp_path: Path) -> None:
    """TRL divides by all B rows, empty ones too: global_aggregate(..., global_batch_size=B)."""
    trl, h = _trl(), _harness()
    batch = h.random_batch(3)
    trainer = h.build(
        trl.GRPOTrainer, trl.GRPOConfig, tiny_dir, tmp_path, batch, loss_type=loss_type, beta=0.0,
        mask_truncated_completions=True, max_completion_length=7,
    )  # fmt: skip
    out = h.score(trainer)
    value, _ = h.loss_and_grad(trainer, out, accumulation=2)
    mask = out["completion_mask"].bool()
    assert bool((~mask.any(-1)).any())  # empty rows in the batch
    per_token, _ = clipped_ratio_loss(batch.logp, batch.logp, out["advantages"], mask)  # on-policy
    recipe = global_aggregate(per_token, mask, mode, global_batch_size=mask.shape[0], loss_scale_factor=7) / 2
    torch.testing.assert_close(value, recipe, rtol=1e-12, atol=1e-14)
    assert not torch.allclose(value, aggregate(per_token, mask, mode, horizon=7) / 2)  # ours leaves them out


# --- KL estimators -------------------------------------------------------------------------------


def _grid() -> tuple[torch.Tensor, torch.Tensor]:
    gaps = torch.tensor([[-30.0, -12.0, -2.0, -0.1, 0.0, 0.5, 3.0, 25.0]], dtype=torch.float64)
    return gaps.clone().requires_grad_(), torch.zeros_like(gaps)


def _value_and_grad(fn: Any) -> tuple[torch.Tensor, torch.Tensor]:
    logp, ref = _grid()
    out = fn(logp, ref)
    (grad,) = torch.autograd.grad(out.sum(), logp)
    return out.detach(), grad


@pytest.mark.parametrize(
    ("verl_name", "ours"),
    [
        ("low_var_kl", lambda lp, ref: k3_kl(lp, ref, log_ratio_clamp=20, max_value=10)),
        ("k1", k1_kl),
        ("k2", k2_kl),
        ("k3+", lambda lp, ref: straight_through(k3_kl(lp, ref, log_ratio_clamp=20, max_value=10), k2_kl(lp, ref))),
    ],
)
def test_verl_kl_penalties_are_the_recipes(verl_name: str, ours: Any) -> None:
    core = _verl()
    v_verl, g_verl = _value_and_grad(lambda lp, ref: core.kl_penalty(lp, ref, verl_name))
    v_ours, g_ours = _value_and_grad(ours)
    torch.testing.assert_close(v_ours, v_verl)
    torch.testing.assert_close(g_ours, g_verl)


def test_our_k3_clamps_the_log_ratio_at_20_by_default() -> None:
    logp, ref = torch.zeros(1, 1, dtype=torch.float64), torch.full((1, 1), 30.0, dtype=torch.float64)
    assert float(k3_kl(logp, ref)) == pytest.approx(math.exp(20) + 19)  # 4.85e8
    assert float(k3_kl(logp, ref, log_ratio_clamp=None)) == pytest.approx(math.exp(30) - 31)  # 1.07e13


@pytest.mark.parametrize("correct", [True, False])
def test_trls_kl_term_is_unclamped_k3_times_the_ratio(correct: bool, tiny_dir: Path, tmp_path: Path) -> None:
    """Advantages 0 (equal rewards), bnpo: TRL's loss is the token mean of k3(lp, ref) [* exp(lp - old)]."""
    trl, h = _trl(), _harness()
    batch = _one_token_batch([0.0, -0.3, 0.2, 0.1], [0.1, 0.0, 0.0, -0.2], [30.0, -1.0, 0.5, 2.0], [0.5] * 4)
    trainer = h.build(
        trl.GRPOTrainer, trl.GRPOConfig, tiny_dir, tmp_path, batch, loss_type="bnpo", num_iterations=2, beta=1.0,
        use_bias_correction_kl=correct,
    )  # fmt: skip
    out = h.score(trainer)
    value, grad = h.loss_and_grad(trainer, out, accumulation=1)
    logp = batch.logp.clone().requires_grad_()
    kl = k3_kl(logp, batch.ref, log_ratio_clamp=None)
    recipe = (kl * torch.exp(logp - batch.old) if correct else kl).mean()
    (recipe_grad,) = torch.autograd.grad(recipe, logp)
    torch.testing.assert_close(value, recipe.detach(), rtol=1e-12, atol=0.0)
    torch.testing.assert_close(grad, recipe_grad, rtol=1e-12, atol=1e-15)
    assert float(value) > 1e12  # the unclamped k3 of the gap of 30 (e^30 - 31 = 1.07e13)
