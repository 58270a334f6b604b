"""The adapters' plain conversions and the verl-signature functions, without verl or TRL installed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators import (
    AggregationMode,
    aggregate,
    clipped_ratio_loss,
    group_normalized_advantages,
    gspo_loss,
    reinforce_pp_baseline_advantages,
    rloo_advantages,
)
from posttrain.llm.adapters import verl as pverl
from posttrain.llm.adapters.convert import (
    clip_options,
    config_value,
    global_aggregate,
    group_ids_from_index,
    grouped_token_advantages,
)
from posttrain.llm.adapters.trl_recipe import (
    LOSS_TYPES,
    TrlAggregation,
    kl_term,
    resolve_advantage,
    resolve_policy_loss,
    trl_advantages,
    trl_policy_loss,
    trl_recipe,
    trl_reduce,
)
from posttrain.testing import grouped_rewards, policy_batches, response_masks

MODES = [m.value for m in AggregationMode]


def _flat_batch(rewards: torch.Tensor, perm: list[int]) -> tuple[torch.Tensor, np.ndarray]:
    """Rows of ``rewards [G, K]`` flattened, then permuted; uids are strings as verl's."""
    g, k = rewards.shape
    uids = np.array([f"uid-{i // k}" for i in range(g * k)], dtype=object)
    p = torch.tensor(perm)
    return rewards.reshape(-1)[p], uids[np.array(perm)]


@st.composite
def shuffled_groups(draw: st.DrawFn) -> tuple[torch.Tensor, list[int]]:
    rewards = draw(grouped_rewards(groups=(1, 4), k=(2, 5)))
    perm = draw(st.permutations(range(rewards.numel())))
    return rewards, list(perm)


def test_group_ids_number_uids_by_first_appearance() -> None:
    ids = group_ids_from_index(np.array(["x", "y", "x", "z", "y"], dtype=object))
    assert ids.tolist() == [0, 1, 0, 2, 1]
    assert group_ids_from_index(torch.tensor([7, 3, 7])).tolist() == [0, 1, 0]
    with pytest.raises(ShapeError, match="index"):
        group_ids_from_index(np.zeros((2, 2), dtype=object))
    with pytest.raises(ShapeError, match="index"):
        group_ids_from_index([])


@given(shuffled_groups())
def test_grouped_token_advantages_match_the_estimator_on_each_group_in_any_row_order(
    case: tuple[torch.Tensor, list[int]],
) -> None:
    rewards, perm = case
    scores, uids = _flat_batch(rewards, perm)
    mask = torch.ones(scores.shape[0], 3, dtype=torch.bool)
    mask[:, -1] = False
    out = grouped_token_advantages(rloo_advantages, scores, group_ids_from_index(uids), mask)
    expected = rloo_advantages(rewards).reshape(-1)[torch.tensor(perm)]
    torch.testing.assert_close(out[:, 0], expected)  # group sums in another order: last-bit differences
    assert bool((out[:, -1] == 0).all())


def test_grouped_token_advantages_reject_unequal_groups() -> None:
    with pytest.raises(ShapeError, match="equal sizes"):
        grouped_token_advantages(
            rloo_advantages, torch.zeros(3), torch.tensor([0, 0, 1]), torch.ones(3, 2, dtype=torch.bool)
        )


@given(policy_batches(b=(1, 5), t=(1, 6)), st.sampled_from(MODES))
def test_global_aggregate_on_one_rank_is_aggregate(batch: object, mode: str) -> None:
    values, mask = batch.logp, batch.mask  # type: ignore[attr-defined]
    torch.testing.assert_close(global_aggregate(values, mask, mode), aggregate(values, mask, mode))


@given(policy_batches(b=(2, 6), t=(1, 6)), st.sampled_from(MODES), st.data())
def test_global_aggregate_averaged_over_ranks_is_the_full_batch_aggregate(
    batch: object, mode: str, data: st.DataObject
) -> None:
    """Data-parallel invariance: each rank reduces its rows with the global counts; the rank mean equals the full batch."""
    values, mask = batch.logp, batch.mask  # type: ignore[attr-defined]
    b = values.shape[0]
    cut = data.draw(st.integers(1, b - 1))
    ranks = [slice(0, cut), slice(cut, b)]
    info = {"dp_size": 2, "batch_num_tokens": int(mask.sum()), "global_batch_size": int(mask.any(-1).sum())}
    per_rank = [global_aggregate(values[r], mask[r], mode, **info) for r in ranks]
    torch.testing.assert_close(sum(per_rank) / 2, aggregate(values, mask, mode))


def test_global_aggregate_needs_global_counts_on_several_ranks() -> None:
    v, m = torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(DomainError, match="batch_num_tokens"):
        global_aggregate(v, m, "token-mean", dp_size=2)
    with pytest.raises(DomainError, match="global_batch_size"):
        global_aggregate(v, m, "seq-mean-token-mean", dp_size=2)
    with pytest.raises(DomainError, match="aggregation mode"):
        global_aggregate(v, m, "sequence-mean")


@dataclass
class _Actor:
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = 0.28
    clip_ratio_c: float = 3.0


def test_config_readers_accept_dataclasses_mappings_and_none() -> None:
    assert clip_options(_Actor()) == clip_options({"clip_ratio": 0.2, "clip_ratio_high": 0.28})
    assert clip_options(None).kwargs() == {"clip_low": 0.2, "clip_high": 0.2, "dual_clip": 3.0}
    assert "dual_clip" not in clip_options(_Actor(), dual_clip=False).kwargs()
    assert config_value(_Actor(), "missing", 5) == 5


def _verl_rows(rewards: torch.Tensor, perm: list[int], t: int = 4) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """verl's inputs: the score on the last valid token of right-padded rows, uids, a 0/1 float mask."""
    scores, uids = _flat_batch(rewards, perm)
    lengths = torch.arange(scores.shape[0]) % t + 1
    mask = (torch.arange(t) < lengths.unsqueeze(-1)).float()
    token_rewards = torch.zeros(scores.shape[0], t, dtype=scores.dtype)
    token_rewards[torch.arange(scores.shape[0]), lengths - 1] = scores
    return token_rewards, mask, uids


@given(shuffled_groups(), st.booleans())
def test_verl_grpo_adapter_is_our_estimator_by_hand(case: tuple[torch.Tensor, list[int]], by_std: bool) -> None:
    rewards, perm = case
    token_rewards, mask, uids = _verl_rows(rewards, perm)
    adv, returns = pverl.ADVANTAGE_ESTIMATORS["posttrain_grpo"](
        token_level_rewards=token_rewards, response_mask=mask, index=uids, config={"norm_adv_by_std_in_grpo": by_std}
    )
    expected = group_normalized_advantages(rewards, scale_by_std=by_std).reshape(-1)[torch.tensor(perm)]
    torch.testing.assert_close(adv, expected.unsqueeze(-1) * mask)
    assert returns is adv


@given(shuffled_groups())
def test_verl_reinforce_pp_baseline_adapter_restores_verl_row_order(case: tuple[torch.Tensor, list[int]]) -> None:
    rewards, perm = case
    token_rewards, mask, uids = _verl_rows(rewards, perm)
    adv, _ = pverl.ADVANTAGE_ESTIMATORS["posttrain_reinforce_pp_baseline"](
        token_level_rewards=token_rewards, response_mask=mask, index=uids
    )
    inverse = torch.argsort(torch.tensor(perm))  # rows back in group order
    expected = reinforce_pp_baseline_advantages(rewards, mask[inverse].bool())
    torch.testing.assert_close(adv[inverse], expected)


def test_verl_group_adapters_need_the_uids() -> None:
    with pytest.raises(DomainError, match="index"):
        pverl.ADVANTAGE_ESTIMATORS["posttrain_rloo"](
            token_level_rewards=torch.zeros(2, 2), response_mask=torch.ones(2, 2)
        )


@given(policy_batches(b=(1, 4), t=(1, 5), token_advantages=True), st.sampled_from(MODES), st.booleans())
def test_verl_policy_loss_adapter_is_our_loss_then_aggregate(batch: object, mode: str, weighted: bool) -> None:
    logp, old, adv, mask = batch.logp, batch.logp_old, batch.advantages, batch.mask  # type: ignore[attr-defined]
    weights = torch.linspace(0.5, 1.5, logp.numel(), dtype=logp.dtype).reshape(logp.shape) if weighted else None
    config = {"clip_ratio": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0, "global_batch_info": {}}
    loss, metrics = pverl.POLICY_LOSSES["posttrain_ppo_clip"](
        old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask.float(), loss_agg_mode=mode,
        config=config, rollout_is_weights=weights,
    )  # fmt: skip
    per_token, diag = clipped_ratio_loss(logp, old, adv, mask, clip_high=0.28, dual_clip=3.0)
    expected = aggregate(per_token * (1 if weights is None else weights), mask, mode)
    torch.testing.assert_close(loss, expected)
    assert metrics["actor/pg_clipfrac"] == float(diag.clip_frac)
    gspo, _ = pverl.POLICY_LOSSES["posttrain_gspo"](
        old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, loss_agg_mode=mode, config=config
    )
    torch.testing.assert_close(
        gspo, aggregate(gspo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)[0], mask, mode)
    )


@given(grouped_rewards(groups=(1, 3), k=(2, 4)))
def test_trl_advantages_weight_the_reward_functions_then_group(rewards: torch.Tensor) -> None:
    per_func = torch.stack([rewards.reshape(-1), 2 * rewards.reshape(-1)], dim=-1)
    per_func[0, 1] = float("nan")  # a function that returned None is skipped
    weights = torch.tensor([1.0, 0.5], dtype=rewards.dtype)
    summed = per_func[:, 0] + torch.nan_to_num(per_func[:, 1]) * 0.5
    out = trl_advantages(per_func, weights, rewards.shape[1], rloo_advantages)
    torch.testing.assert_close(out, rloo_advantages(summed.view(rewards.shape)).reshape(-1))


def test_trl_advantages_refuse_unscored_completions() -> None:
    with pytest.raises(DomainError, match="None"):
        trl_advantages(torch.tensor([[float("nan")], [1.0]]), torch.ones(1), 2, rloo_advantages)


def test_trl_resolvers_list_the_usable_names() -> None:
    with pytest.raises(DomainError, match="drgrpo"):
        resolve_advantage("reinforce_pp")
    with pytest.raises(DomainError, match="ppo_clip"):
        resolve_policy_loss("sis")


@given(policy_batches(b=(1, 4), t=(1, 5)), st.sampled_from(MODES))
def test_trl_policy_loss_is_loss_plus_k3_aggregated_over_accumulation(batch: object, mode: str) -> None:
    from posttrain.estimators import k3_kl

    logp, old, adv, mask = batch.logp, batch.logp_old, batch.advantages, batch.mask  # type: ignore[attr-defined]
    ref = old - 0.1
    loss = resolve_policy_loss("ppo_clip", {"clip_high": 0.28})
    kl = kl_term(logp, old, ref, mask, bias_correction=False, sequence=False)
    out, _ = trl_policy_loss(
        logp, old, adv, mask, loss=loss, aggregation=TrlAggregation(AggregationMode(mode)), horizon=7, beta=0.04,
        kl=kl, grad_accum_steps=2,
    )  # fmt: skip
    per_token = clipped_ratio_loss(logp, old, adv, mask, clip_high=0.28)[0] + 0.04 * k3_kl(logp, ref)
    torch.testing.assert_close(out, aggregate(per_token, mask, mode, horizon=7) / 2)


def _trl_by_loop(values: torch.Tensor, mask: torch.Tensor, loss_type: str, horizon: int, accumulation: int) -> float:
    """TRL 1.16's normalisers written out row by row (empty rows count in every sequence mean)."""
    rows = [(float((v * m).sum()), float(m.sum())) for v, m in zip(values, mask.double(), strict=True)]
    b, tokens = len(rows), sum(n for _, n in rows)
    total = {
        "grpo": sum(s / max(n, 1.0) for s, n in rows) / b,
        "bnpo": sum(s for s, _ in rows) / max(tokens, 1.0),
        "dr_grpo": sum(s for s, _ in rows) / (b * horizon),
        "luspo": sum(s for s, _ in rows) / b,
    }[loss_type]
    return total / accumulation


@given(policy_batches(b=(1, 5), t=(1, 5)), st.sampled_from(["grpo", "bnpo", "dr_grpo", "luspo"]))
def test_trl_reduce_is_trls_normaliser_with_empty_rows(batch: object, loss_type: str) -> None:
    values, mask = batch.logp.double(), batch.mask.clone()  # type: ignore[attr-defined]
    mask[0] = False  # a fully masked row (TRL's mask_truncated_completions)
    out = trl_reduce(values, mask, LOSS_TYPES[loss_type], horizon=7, grad_accum_steps=3)
    assert float(out) == pytest.approx(_trl_by_loop(values, mask, loss_type, 7, 3), rel=1e-12, abs=1e-12)


def _args(**overrides: object) -> object:
    from types import SimpleNamespace

    defaults = {"loss_type": "grpo", "scale_rewards": "group", "epsilon": 0.2, "epsilon_high": None, "delta": None}
    return SimpleNamespace(**(defaults | {"importance_sampling_level": "token"} | overrides))


def _one_token_loss(args: object, logp: float, adv: list[float], mask: list[list[bool]], **kw: object) -> tuple:
    recipe = trl_recipe(args)
    lp = torch.full((len(adv), 1), logp, dtype=torch.float64, requires_grad=True)
    old = kw.pop("old", lp.detach())
    m = torch.tensor(mask)
    loss, _ = trl_policy_loss(
        lp, old, torch.tensor(adv, dtype=torch.float64), m, loss=recipe.loss, aggregation=recipe.aggregation, **kw
    )
    (grad,) = torch.autograd.grad(loss, lp)
    return float(loss.detach()), grad


def test_trl_numbers_by_hand_bias_corrected_kl_empty_rows_and_two_sided_clip() -> None:
    """The three points where the adapter once differed from TRL 1.16, with TRL's values."""
    lp, ref, mask = torch.tensor([[-1.0]], dtype=torch.float64), torch.tensor([[-2.0]], dtype=torch.float64), [[True]]
    for correct, grad in ((True, 0.04), (False, 0.04 * (1 - float(np.exp(-1.0))))):
        kl = kl_term(lp.requires_grad_(), lp.detach(), ref, torch.tensor(mask), bias_correction=correct, sequence=False)
        recipe = trl_recipe(_args())
        loss, _ = trl_policy_loss(lp, lp.detach(), torch.zeros(1, dtype=torch.float64), torch.tensor(mask),
                                  loss=recipe.loss, aggregation=recipe.aggregation, beta=0.04, kl=kl)  # fmt: skip
        (g,) = torch.autograd.grad(loss, lp)
        assert (round(float(loss.detach()), 6), round(float(g), 6)) == (0.014715, round(grad, 6))
        lp = lp.detach()
    # mask [[1], [0]], advantages [1, 0], on-policy: TRL's grpo divides by both rows
    assert _one_token_loss(_args(), -1.0, [1.0, 0.0], [[True], [False]])[0] == pytest.approx(-0.5)
    explicit = _args(policy_loss="ppo_clip", aggregation="seq-mean-token-mean", loss_type="dapo")
    assert _one_token_loss(explicit, -1.0, [1.0, 0.0], [[True], [False]])[0] == pytest.approx(
        -1.0
    )  # ours: rows with a token
    # ratio 2, advantage -1, delta 1.5: TRL's two-sided clip caps the ratio at delta
    old = torch.full((1, 1), float(-np.log(2.0)) - 1.0, dtype=torch.float64)
    assert _one_token_loss(_args(delta=1.5), -1.0, [-1.0], [[True]], old=old)[0] == pytest.approx(1.5)
    assert _one_token_loss(_args(), -1.0, [-1.0], [[True]], old=old)[0] == pytest.approx(2.0)


@given(response_masks((3, 4)))
def test_trl_policy_loss_needs_reference_log_probs_with_beta(mask: torch.Tensor) -> None:
    z = torch.zeros(3, 4)
    with pytest.raises(DomainError, match="kl"):
        trl_policy_loss(
            z, z, torch.ones(3), mask, loss=resolve_policy_loss("ppo_clip"), aggregation=LOSS_TYPES["bnpo"], beta=0.1
        )
