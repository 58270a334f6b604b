"""Our estimators registered in verl's registries: looked up through verl, equal to ours and to verl's built-ins.

Needs verl (``make test-adapters`` installs it with ``--no-deps`` beside what ``core_algos`` imports).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

core_algos = pytest.importorskip(
    "verl.trainer.ppo.core_algos",
    reason="verl is not installed (make test-adapters: pip install --no-deps verl + its core_algos needs)",
)

from posttrain.estimators import (  # noqa: E402
    AggregationMode,
    aggregate,
    cispo_loss,
    clipped_ratio_loss,
    drgrpo_advantages,
    group_normalized_advantages,
    gspo_loss,
    reinforce_pp_advantages,
    rloo_advantages,
)
from posttrain.llm.adapters import verl as pverl  # noqa: E402

MODES = [m.value for m in AggregationMode]


def _batch(seed: int, *, groups: int = 3, k: int = 4, t: int = 5) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """verl-style rows in shuffled order: scores on the last valid token, a 0/1 float mask, string uids."""
    gen = torch.Generator().manual_seed(seed)
    b = groups * k
    perm = torch.randperm(b, generator=gen)
    uids = np.array([f"prompt-{i // k}" for i in range(b)], dtype=object)[perm.numpy()]
    scores = torch.randint(0, 3, (b,), generator=gen).float() / 2  # ties and constant groups occur
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    mask = (torch.arange(t) < lengths.unsqueeze(-1)).float()
    token_rewards = torch.zeros(b, t)
    token_rewards[torch.arange(b), lengths - 1] = scores
    return token_rewards, mask, uids


def _by_hand(fn: object, token_rewards: torch.Tensor, mask: torch.Tensor, uids: np.ndarray) -> torch.Tensor:
    """Our grouped estimator applied group by group in a plain loop, scattered back to verl's rows."""
    scores = token_rewards.sum(-1)
    out = torch.zeros_like(scores)
    for uid in dict.fromkeys(uids.tolist()):
        rows = torch.tensor([i for i, u in enumerate(uids.tolist()) if u == uid])
        out[rows] = fn(scores[rows].unsqueeze(0))[0]  # type: ignore[operator]
    return out.unsqueeze(-1) * mask


def test_every_adapter_is_registered_and_found_through_verl() -> None:
    names = pverl.check_registered()
    for name in names["adv_estimator"]:
        assert core_algos.get_adv_estimator_fn(name) is pverl.ADVANTAGE_ESTIMATORS[name]
    for name in names["policy_loss"]:
        assert core_algos.get_policy_loss_fn(name) is pverl.POLICY_LOSSES[name]
    assert pverl.register() == [*names["adv_estimator"], *names["policy_loss"]]  # idempotent: verl accepts it again


def test_check_registered_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from posttrain.errors import RegistryError

    monkeypatch.delitem(core_algos.POLICY_LOSS_REGISTRY, "posttrain_gspo")
    with pytest.raises(RegistryError, match="posttrain_gspo"):
        pverl.check_registered()


def _registered_in_fresh_process(env: dict[str, str]) -> str:
    code = (
        "import verl\nfrom verl.trainer.ppo import core_algos\n"
        "print(all(n in core_algos.ADV_ESTIMATOR_REGISTRY for n in ('posttrain_grpo', 'posttrain_rloo')),"
        " 'posttrain_ppo_clip' in core_algos.POLICY_LOSS_REGISTRY)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_plugin_hooks_register_in_a_fresh_process_that_only_imports_verl() -> None:
    """The entry point ``verl.plugins`` and ``VERL_USE_EXTERNAL_MODULES``, each alone; with neither, nothing."""
    plugins_off = {"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": ""}
    assert _registered_in_fresh_process({"VERL_USE_EXTERNAL_MODULES": ""}) == "True True"
    assert (
        _registered_in_fresh_process(plugins_off | {"VERL_USE_EXTERNAL_MODULES": "posttrain.llm.adapters.verl"})
        == "True True"
    )
    assert _registered_in_fresh_process(plugins_off) == "False False"


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("by_std", [True, False])
def test_posttrain_grpo_equals_ours_and_verl_grpo(seed: int, by_std: bool) -> None:
    token_rewards, mask, uids = _batch(seed)
    ours, _ = core_algos.get_adv_estimator_fn("posttrain_grpo")(
        token_level_rewards=token_rewards, response_mask=mask, index=uids,
        config={"norm_adv_by_std_in_grpo": by_std},
    )  # fmt: skip
    by_hand = _by_hand(lambda r: group_normalized_advantages(r, scale_by_std=by_std), token_rewards, mask, uids)
    torch.testing.assert_close(ours, by_hand)
    for builtin in ("grpo", "grpo_vectorized"):
        theirs, _ = core_algos.get_adv_estimator_fn(builtin)(
            token_level_rewards=token_rewards, response_mask=mask, index=uids, norm_adv_by_std_in_grpo=by_std
        )
        torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("seed", [0, 1])
def test_posttrain_drgrpo_and_rloo_equal_ours_and_verl(seed: int) -> None:
    token_rewards, mask, uids = _batch(seed)
    kw = {"token_level_rewards": token_rewards, "response_mask": mask, "index": uids}
    dr, _ = core_algos.get_adv_estimator_fn("posttrain_drgrpo")(**kw)
    torch.testing.assert_close(dr, _by_hand(drgrpo_advantages, token_rewards, mask, uids))
    torch.testing.assert_close(dr, core_algos.compute_grpo_outcome_advantage(**kw, norm_adv_by_std_in_grpo=False)[0])
    rl, _ = core_algos.get_adv_estimator_fn("posttrain_rloo")(**kw)
    torch.testing.assert_close(rl, _by_hand(rloo_advantages, token_rewards, mask, uids))
    for builtin in ("rloo", "rloo_vectorized"):
        torch.testing.assert_close(rl, core_algos.get_adv_estimator_fn(builtin)(**kw)[0])


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_posttrain_reinforce_pp_variants_equal_ours_and_verl(gamma: float) -> None:
    token_rewards, mask, uids = _batch(3)
    from verl.trainer.config import AlgoConfig

    config = AlgoConfig(gamma=gamma)
    ours, _ = core_algos.get_adv_estimator_fn("posttrain_reinforce_pp")(
        token_level_rewards=token_rewards, response_mask=mask, config=config
    )
    torch.testing.assert_close(ours, reinforce_pp_advantages(token_rewards, mask.bool(), gamma=gamma))
    theirs, _ = core_algos.get_adv_estimator_fn("reinforce_plus_plus")(
        token_level_rewards=token_rewards, response_mask=mask, config=config
    )
    torch.testing.assert_close(ours, theirs)
    kw = {"token_level_rewards": token_rewards, "response_mask": mask, "index": uids, "config": config}
    base, _ = core_algos.get_adv_estimator_fn("posttrain_reinforce_pp_baseline")(**kw)
    torch.testing.assert_close(base, core_algos.get_adv_estimator_fn("reinforce_plus_plus_baseline")(**kw)[0])


def _actor(**overrides: object) -> object:
    from verl.workers.config.actor import ActorConfig

    return ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=2, **overrides)


def _policy_inputs(seed: int, b: int = 6, t: int = 5) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    old = -torch.rand(b, t, generator=gen) * 3
    return {
        "old_log_prob": old,
        "log_prob": (old + 0.6 * torch.randn(b, t, generator=gen)).requires_grad_(),  # ratios beyond every clip
        "advantages": torch.randn(b, 1, generator=gen).expand(b, t).contiguous(),
        "response_mask": torch.arange(t) < lengths.unsqueeze(-1),
    }


def _value_and_grad(fn: object, inputs: dict[str, torch.Tensor], **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
    lp = inputs["log_prob"].detach().clone().requires_grad_()
    loss, metrics = fn(**{**inputs, "log_prob": lp}, **kw)  # type: ignore[operator]
    assert set(metrics) >= {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"}
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("ours", "builtin"), [("posttrain_ppo_clip", "vanilla"), ("posttrain_gspo", "gspo")])
def test_policy_losses_equal_verl_builtins_in_value_and_gradient(ours: str, builtin: str, mode: str) -> None:
    inputs = _policy_inputs(4)
    config = _actor(clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode=mode)
    v_ours, g_ours = _value_and_grad(core_algos.get_policy_loss_fn(ours), inputs, loss_agg_mode=mode, config=config)
    v_verl, g_verl = _value_and_grad(core_algos.get_policy_loss_fn(builtin), inputs, loss_agg_mode=mode, config=config)
    torch.testing.assert_close(v_ours, v_verl)
    torch.testing.assert_close(g_ours, g_verl)
    mask = inputs["response_mask"]
    per_token = (
        clipped_ratio_loss(
            inputs["log_prob"], inputs["old_log_prob"], inputs["advantages"], mask, clip_high=0.28, dual_clip=3.0
        )[0]
        if ours == "posttrain_ppo_clip"
        else gspo_loss(
            inputs["log_prob"], inputs["old_log_prob"], inputs["advantages"], mask, clip_low=0.2, clip_high=0.28
        )[0]
    )
    torch.testing.assert_close(v_ours, aggregate(per_token, mask, mode).detach())


@pytest.mark.parametrize("mode", MODES)
def test_policy_loss_with_global_batch_info_and_mismatch_weights_equals_verl(mode: str) -> None:
    """Data-parallel normalisers and rollout IS weights go through exactly as in verl's ``vanilla``."""
    inputs = _policy_inputs(5)
    mask = inputs["response_mask"]
    weights = torch.rand(mask.shape, generator=torch.Generator().manual_seed(6)) + 0.5
    config = _actor(loss_scale_factor=8)
    config.global_batch_info.update(  # as verl's actor loop fills it (workers/utils/losses.py)
        dp_size=2, batch_num_tokens=int(mask.sum()) * 2, global_batch_size=mask.shape[0] * 2, loss_scale_factor=8
    )
    kw = {"loss_agg_mode": mode, "config": config, "rollout_is_weights": weights}
    v_ours, g_ours = _value_and_grad(core_algos.get_policy_loss_fn("posttrain_ppo_clip"), inputs, **kw)
    v_verl, g_verl = _value_and_grad(core_algos.get_policy_loss_fn("vanilla"), inputs, **kw)
    torch.testing.assert_close(v_ours, v_verl)
    torch.testing.assert_close(g_ours, g_verl)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("low", "high"), [(0.2, 0.2), (0.2, 0.28), (1.0, 4.0)], ids=["sym", "clip-higher", "no-lower"])
def test_posttrain_cispo_equals_verl_cispo_in_value_and_gradient(mode: str, low: float, high: float) -> None:
    """verl's ``cispo`` is -sg(clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)) A log pi: our ``clip_mode="verl"``."""
    inputs = _policy_inputs(7)
    config = _actor(clip_ratio_low=low, clip_ratio_high=high, loss_agg_mode=mode)
    kw = {"loss_agg_mode": mode, "config": config}
    v_ours, g_ours = _value_and_grad(core_algos.get_policy_loss_fn("posttrain_cispo"), inputs, **kw)
    v_verl, g_verl = _value_and_grad(core_algos.get_policy_loss_fn("cispo"), inputs, **kw)
    torch.testing.assert_close(v_ours, v_verl)
    torch.testing.assert_close(g_ours, g_verl)
    mask = inputs["response_mask"]
    per_token, diag = cispo_loss(
        inputs["log_prob"], inputs["old_log_prob"], inputs["advantages"], mask, clip_low=low, clip_high=high
    )
    torch.testing.assert_close(v_ours, aggregate(per_token, mask, mode).detach())
    _, metrics = core_algos.get_policy_loss_fn("cispo")(**inputs, **kw)
    assert float(diag.clip_frac) == pytest.approx(metrics["actor/pg_clipfrac"], abs=1e-6)
    assert float(diag.clip_frac) > 0.0 or low >= 1.0  # log-ratios ~ N(0, 0.6^2) leave [0.8, 1.2]: the clip is tested


# Through verl's own call sites: the trainer's compute_advantage on a DataProto, and the actor's ppo_loss.


def _data_proto(token_rewards: torch.Tensor, mask: torch.Tensor, uids: np.ndarray) -> object:
    from verl import DataProto

    return DataProto.from_dict(
        tensors={"token_level_rewards": token_rewards.clone(), "response_mask": mask.clone()},
        non_tensors={"uid": uids.copy()},
    )


@pytest.mark.parametrize("by_std", [True, False])
def test_posttrain_grpo_through_verls_compute_advantage_equals_verl_grpo(by_std: bool) -> None:
    """``algorithm.adv_estimator=posttrain_grpo`` as verl's trainer runs it (ray_trainer.compute_advantage).

    verl's v1 trainer hands every estimator but its own ``grpo`` to this same function.
    """
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.ray_trainer import compute_advantage

    token_rewards, mask, uids = _batch(8, groups=4, k=4, t=6)
    results = {}
    for name in ("posttrain_grpo", "grpo"):
        config = AlgoConfig(adv_estimator=name, norm_adv_by_std_in_grpo=by_std)
        out = compute_advantage(
            _data_proto(token_rewards, mask, uids),
            adv_estimator=config.adv_estimator,
            gamma=config.gamma,
            lam=config.lam,
            num_repeat=4,
            norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo,
            config=config,
        )
        results[name] = (out.batch["advantages"], out.batch["returns"])
    torch.testing.assert_close(results["posttrain_grpo"][0], results["grpo"][0])
    torch.testing.assert_close(results["posttrain_grpo"][1], results["grpo"][1])
    by_hand = _by_hand(lambda r: group_normalized_advantages(r, scale_by_std=by_std), token_rewards, mask, uids)
    torch.testing.assert_close(results["posttrain_grpo"][0], by_hand)
    assert bool((by_hand != 0).any())


def test_posttrain_rloo_through_verls_compute_advantage_equals_verl_rloo() -> None:
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.ray_trainer import compute_advantage

    token_rewards, mask, uids = _batch(9)
    outs = [
        compute_advantage(
            _data_proto(token_rewards, mask, uids), adv_estimator=name, config=AlgoConfig(adv_estimator=name)
        )
        for name in ("posttrain_rloo", "rloo")
    ]
    torch.testing.assert_close(outs[0].batch["advantages"], outs[1].batch["advantages"])


def _engine_micro_batch(inputs: dict[str, torch.Tensor], *, prompt_len: int, dp_size: int, scale: int) -> tuple:
    """A padded micro-batch as verl's engine hands it to ``ppo_loss``, and the model output it expects.

    verl's model output holds one log-prob per token of the unpadded ``prompt + response`` sequences,
    shifted left by one (position ``P - 1 + j`` holds response token ``j``); ``ppo_loss`` cuts it back to
    ``[B, T]`` with ``no_padding_2_padding``. Here the output is built from ``log_prob`` so the gradient
    reaches it.
    """
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    mask = inputs["response_mask"]
    b, t = mask.shape
    lengths = mask.sum(-1)
    log_prob = inputs["log_prob"]
    pieces = []
    for i in range(b):
        n = int(lengths[i])
        filler = log_prob.new_zeros(prompt_len - 1)
        pieces += [filler, log_prob[i, :n], log_prob.new_zeros(1)]
    flat = torch.cat(pieces)
    attention = torch.cat([torch.ones(b, prompt_len, dtype=torch.long), mask.long()], dim=1)
    data = TensorDict(
        {
            "prompts": torch.ones(b, prompt_len, dtype=torch.long),
            "responses": torch.ones(b, t, dtype=torch.long),
            "attention_mask": attention,
            "response_mask": mask.long(),
            "old_log_probs": inputs["old_log_prob"],
            "advantages": inputs["advantages"],
        },
        batch_size=[b],
    )
    tu.assign_non_tensor(data, dp_size=dp_size, batch_num_tokens=int(mask.sum()) * scale, global_batch_size=b * scale)
    return {"log_probs": flat}, data


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("ours", "builtin"), [("posttrain_ppo_clip", "vanilla"), ("posttrain_cispo", "cispo")])
def test_policy_loss_through_verls_ppo_loss_equals_the_builtin(ours: str, builtin: str, mode: str) -> None:
    """``actor.policy_loss.loss_mode=posttrain_*`` as verl's actor computes its loss (workers/utils/losses.ppo_loss).

    ppo_loss fills ``global_batch_info`` from the micro-batch (two data-parallel ranks, a micro-batch a
    quarter of the global batch here), looks the loss up by name and calls it with verl's keywords.
    """
    from verl.workers.utils.losses import ppo_loss

    inputs = _policy_inputs(11)
    values, grads = [], []
    for loss_mode in (ours, builtin):
        lp = inputs["log_prob"].detach().clone().requires_grad_()
        from verl.workers.config.actor import PolicyLossConfig

        config = _actor(
            loss_agg_mode=mode,
            clip_ratio_high=0.28,
            loss_scale_factor=8,
            policy_loss=PolicyLossConfig(loss_mode=loss_mode),
        )
        output, data = _engine_micro_batch({**inputs, "log_prob": lp}, prompt_len=3, dp_size=2, scale=4)
        loss, metrics = ppo_loss(config, output, data)
        assert "actor/pg_loss" in metrics
        assert config.global_batch_info["batch_num_tokens"] == 4 * int(inputs["response_mask"].sum())
        direct, _ = core_algos.get_policy_loss_fn(loss_mode)(  # the same loss on the padded tensors
            **{**inputs, "log_prob": lp}, loss_agg_mode=mode, config=config
        )
        torch.testing.assert_close(loss, direct)  # ppo_loss cut verl's flat model output back to our rows
        (grad,) = torch.autograd.grad(loss, lp)
        values.append(loss.detach())
        grads.append(grad)
    torch.testing.assert_close(values[0], values[1])
    torch.testing.assert_close(grads[0], grads[1])
    assert bool((grads[0] != 0).any())


# Masked rows: verl's rollout correction (rollout_rs) masks tokens or whole rows after the reward is placed.


def _rejected(token_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``mask`` after rejection: row 0 entirely, and the last valid token (the one holding the score) of row 1."""
    out = mask.clone()
    out[0] = 0
    out[1, int(mask[1].sum()) - 1] = 0
    assert float(token_rewards[0].abs().sum()) + float(token_rewards[1].abs().sum()) > 0  # scores are hidden
    return out


@pytest.mark.parametrize(
    ("ours", "builtin", "config"),
    [
        ("posttrain_grpo", "grpo", {"norm_adv_by_std_in_grpo": True}),
        ("posttrain_grpo", "grpo", {"norm_adv_by_std_in_grpo": False}),
        ("posttrain_drgrpo", "grpo", {"norm_adv_by_std_in_grpo": False}),
        ("posttrain_rloo", "rloo", {}),
        ("posttrain_reinforce_pp_baseline", "reinforce_plus_plus_baseline", {}),
    ],
)
def test_rows_masked_after_scoring_keep_their_score_in_the_group_as_in_verl(
    ours: str, builtin: str, config: dict[str, object]
) -> None:
    """Through verl's compute_advantage: a rejected row still counts in its group's mean and std (verl sums the
    token rewards over every position) and gets advantage 0."""
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.ray_trainer import compute_advantage

    token_rewards, mask, uids = _batch(12, groups=3, k=4, t=6)
    token_rewards[0, 0] += 1.0  # row 0's score is not 0
    token_rewards[1, int(mask[1].sum()) - 1] += 1.0
    rejected = _rejected(token_rewards, mask)
    results = []
    for name in (ours, builtin):
        algo = AlgoConfig(adv_estimator=name, **config)  # type: ignore[arg-type]
        out = compute_advantage(
            _data_proto(token_rewards, rejected, uids),
            adv_estimator=name,
            norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
            num_repeat=4,
            config=algo,
        )
        results.append(out.batch["advantages"])
    torch.testing.assert_close(results[0], results[1])
    assert bool((results[0][0] == 0).all()) and bool((results[0][2:] != 0).any())


def _masked_policy_inputs(seed: int) -> dict[str, torch.Tensor]:
    inputs = _policy_inputs(seed)
    inputs["response_mask"] = inputs["response_mask"].clone()
    inputs["response_mask"][0] = False  # a row verl's rollout rejection dropped
    return inputs


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("ours", "builtin"),
    [("posttrain_ppo_clip", "vanilla"), ("posttrain_gspo", "gspo"), ("posttrain_cispo", "cispo")],
)
def test_policy_losses_with_masked_rows_and_masked_micro_batches_equal_verl(ours: str, builtin: str, mode: str) -> None:
    config = _actor(clip_ratio_high=0.28, loss_agg_mode=mode)
    inputs = _masked_policy_inputs(13)
    kw = {"loss_agg_mode": mode, "config": config}
    v_ours, g_ours = _value_and_grad(core_algos.get_policy_loss_fn(ours), inputs, **kw)
    v_verl, g_verl = _value_and_grad(core_algos.get_policy_loss_fn(builtin), inputs, **kw)
    torch.testing.assert_close(v_ours, v_verl)
    torch.testing.assert_close(g_ours, g_verl)
    # every token masked (with verl's global counts, as its actor passes them): 0 and no gradient, not an error
    empty = {**inputs, "response_mask": torch.zeros_like(inputs["response_mask"])}
    config.global_batch_info.update(dp_size=1, batch_num_tokens=10, global_batch_size=6)
    for name in (ours, builtin):
        value, grad = _value_and_grad(core_algos.get_policy_loss_fn(name), empty, **kw)
        assert float(value) == 0.0 and not bool(grad.any())


def _packed(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's valid entries moved to the front (order kept): ``(values, mask, order)``."""
    order = torch.sort((~mask).int(), dim=-1, stable=True).indices
    return values.gather(-1, order), mask.gather(-1, order), order


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_posttrain_reinforce_pp_across_holes_in_the_mask(gamma: float) -> None:
    """verl 0.9.1 carries the running return across a masked position (gamma counts valid tokens); ours discounts
    by position. Equal for gamma = 1; for gamma < 1 verl's value is ours on the rows with the holes closed."""
    from verl.trainer.config import AlgoConfig

    token_rewards, mask, _ = _batch(14, t=6)
    mask = mask.bool()
    holes = mask.clone()
    holes[:, 1] &= mask.sum(-1) < 3  # a masked observation span in every row with >= 3 tokens
    assert bool((holes != mask).any())
    config = AlgoConfig(gamma=gamma)
    kw = {"token_level_rewards": token_rewards, "response_mask": holes.float(), "config": config}
    ours, _ = core_algos.get_adv_estimator_fn("posttrain_reinforce_pp")(**kw)
    theirs, _ = core_algos.get_adv_estimator_fn("reinforce_plus_plus")(**kw)
    if gamma == 1.0:
        torch.testing.assert_close(ours, theirs)
        return
    assert not torch.allclose(ours, theirs)
    rewards, packed_mask, order = _packed(token_rewards * holes, holes)
    closed = torch.zeros_like(ours).scatter(-1, order, reinforce_pp_advantages(rewards, packed_mask, gamma=gamma))
    torch.testing.assert_close(closed, theirs)
