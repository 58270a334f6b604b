"""Every public estimator goes through ``posttrain.testing.check_estimator``.

The list of functions is not written here: it is read from ``posttrain.estimators.__all__`` and
from the registries (advantages, policy losses, KL estimators, preference losses, value
gradients). Each function is in exactly one of three tables:

- ``CASES`` (below): its contract is run here;
- ``ELSEWHERE``: a named test elsewhere runs ``check_estimator`` on it (checked by reading that
  test's source);
- ``NO_TENSOR_CONTRACT``: it has no float-tensor-in, tensor-out contract, with the reason.

A new public function that is in none of them fails ``test_every_public_function_is_covered``.
Sizes are distinct per dimension (G=2, K=3, B=6, T=5, V=7, top-k 4) so a wrong axis cannot pass.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch

import posttrain.estimators as E
from posttrain.estimators.advantages import hdpo_advantages, kdrl_annealing_advantages, kdrl_mask_advantages
from posttrain.estimators.losses import sis_gspo_loss
from posttrain.testing import ContractFailure, check_estimator

G, K, T, V, TOPK = 2, 3, 5, 7, 4
B = G * K
Make = Callable[[torch.dtype], dict[str, Any]]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _logp(dtype: torch.dtype, seed: int = 0, shift: float = 0.1) -> torch.Tensor:
    return (-torch.rand(B, T, generator=_gen(seed), dtype=torch.float64) - shift).to(dtype)


def _near(x: torch.Tensor, seed: int, scale: float = 0.2) -> torch.Tensor:
    """``x`` plus a small perturbation (log-ratios of at most ``scale``), clamped below 0."""
    d = (torch.rand(x.shape, generator=_gen(seed), dtype=torch.float64) - 0.5) * 2 * scale
    return (x.double() + d).clamp(max=-1e-3).to(x.dtype)


def _mask() -> torch.Tensor:
    m = torch.ones(B, T, dtype=torch.bool)
    m[0, 3:] = False  # right padding
    m[1, 1] = False  # a hole
    return m


def _rand(*shape: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed), dtype=torch.float64).to(dtype)


def _topk(dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(B, T, TOPK, generator=_gen(seed), dtype=torch.float64).log_softmax(-1).to(dtype)


def _rewards(dtype: torch.dtype, seed: int = 3) -> torch.Tensor:
    return (torch.rand(G, K, generator=_gen(seed)) < 0.5).to(dtype)


def _policy(dtype: torch.dtype) -> dict[str, Any]:
    lp = _logp(dtype)
    return {"logp": lp, "logp_old": _near(lp, 1), "advantages": _rand(B, dtype=dtype, seed=2), "mask": _mask()}


def _flow(dtype: torch.dtype) -> dict[str, Any]:
    lp = _logp(dtype)
    return {
        "logp": lp,
        "logp_old": _near(lp, 1),
        "logp_ref": _near(lp, 4),
        "rewards": _rewards(dtype),
        "mask": _mask(),
    }


def _rule(dtype: torch.dtype) -> dict[str, Any]:
    return {"seq_advantages": torch.linspace(-1, 1, B, dtype=dtype), "opd": _rand(B, T, dtype=dtype), "mask": _mask()}


def _velocities(dtype: torch.dtype, n: int = 4, d: int = 2) -> dict[str, torch.Tensor]:
    return {
        "v_theta": _rand(n, d, dtype=dtype, seed=20),
        "v_old": _rand(n, d, dtype=dtype, seed=21),
        "v_target": _rand(n, d, dtype=dtype, seed=22),
    }


def _times(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    return (0.05 + 0.9 * torch.rand(*shape, generator=_gen(9), dtype=torch.float64)).to(dtype)


def _out(index: int = 0) -> Callable[..., Any]:
    return lambda out: out[index]


POLICY_BAD = {"clip_low": [0.0, 1.0], "clip_high": [0.0]}

# name -> (function, make_inputs, check_estimator options)
CASES: dict[str, tuple[Callable[..., Any], Make, dict[str, Any]]] = {
    "no_correction_loss": (E.no_correction_loss, _policy, {"output_shape": (B, T), "grad_args": ["logp"]}),
    "truncated_is_loss": (
        E.truncated_is_loss,
        _policy,
        {"output_shape": (B, T), "grad_args": ["logp"], "bad_values": {"cap": [0.0, -1.0]}},
    ),
    "sis_loss": (
        E.sis_loss,
        lambda d: {**_policy(d), "accepted": torch.rand(B, T, generator=_gen(5)) < 0.5},
        {"output_shape": (B, T), "grad_args": ["logp"], "bad_values": POLICY_BAD},
    ),
    "sis_gspo_loss": (
        sis_gspo_loss,
        lambda d: {**_policy(d), "accepted": torch.rand(B, T, generator=_gen(5)) < 0.5},
        {"output_shape": (B, T), "grad_args": ["logp"]},
    ),
    "sis_logp_old": (
        E.sis_logp_old,
        lambda d: {"logp": _logp(d), "logp_old": _near(_logp(d), 1), "accepted": torch.rand(B, T, generator=_gen(5)) < 0.5},
        {"output_shape": (B, T), "mask_arg": None},
    ),
    "sis_acceptance_prob": (
        E.sis_acceptance_prob,
        lambda d: {
            "logp": _logp(d),
            "logp_old": _near(_logp(d), 1),
            "cur_topk_logp": _topk(d, 6),
            "old_topk_logp": _topk(d, 7),
            "in_topk": torch.rand(B, T, generator=_gen(8)) < 0.7,
        },
        {"output_shape": (B, T), "mask_arg": None, "grad_args": ()},
    ),
    "ppo_clip_objective": (
        E.ppo_clip_objective,
        lambda d: {
            "ratio": torch.rand(B, T, generator=_gen(3), dtype=torch.float64).add(0.5).to(d),
            "advantages": _rand(B, T, dtype=d),
            "clip_low": 0.2,
            "clip_high": 0.2,
            "dual_clip": 3.0,
        },
        {"output_shape": (B, T), "mask_arg": None, "rank_args": (), "mismatch_args": ()},
    ),
    "full_reverse_kl": (
        E.full_reverse_kl,
        lambda d: {
            "logp_student": torch.randn(B, T, V, generator=_gen(1), dtype=torch.float64).log_softmax(-1).to(d),
            "logp_teacher": torch.randn(B, T, V, generator=_gen(2), dtype=torch.float64).log_softmax(-1).to(d),
        },
        {"output_shape": (B, T), "mask_arg": None, "rank_args": ()},
    ),
    "eos_teacher_mask": (
        E.eos_teacher_mask,
        lambda d: {"mask": _mask()},
        {"output_shape": (B, T), "mask_arg": None, "grad_args": ()},
    ),
    "opd_then_rl_advantages": (
        E.opd_then_rl_advantages,
        lambda d: {**_rule(d), "step": 1, "switch_step": 3},
        {"output_shape": (B, T), "rank_args": ("opd", "mask")},
    ),
    "kdrl_mask_advantages": (
        kdrl_mask_advantages,
        lambda d: {**_rule(d), "correct": torch.tensor([True, False, True, True, False, False])},
        {"output_shape": (B, T), "rank_args": ("opd", "mask"), "bad_values": {"beta": [-0.1]}},
    ),
    "hdpo_advantages": (
        hdpo_advantages,
        lambda d: {**_rule(d), "all_wrong": torch.tensor([True, False, True, True, False, False])},
        {"output_shape": (B, T), "rank_args": ("opd", "mask"), "bad_values": {"beta": [-0.1]}},
    ),
    "kdrl_annealing_advantages": (
        kdrl_annealing_advantages,
        lambda d: {**_rule(d), "step": 2, "total_steps": 10},
        {"output_shape": (B, T), "rank_args": ("opd", "mask")},
    ),
    "naive_injection_advantages": (
        E.naive_injection_advantages,
        lambda d: {"rewards": _rewards(d), "oracle_reward": torch.ones(G, dtype=d)},
        {"output_shape": (G, K + 1), "mask_arg": None, "bad_values": {"eps": [0.0]}},
    ),
    "orarl_advantages": (
        E.orarl_advantages,
        lambda d: {"rewards": _rewards(d), "oracle_reward": torch.ones(G, dtype=d)},
        # advantages are constants of the policy gradient (documented: detached oracle)
        {"mask_arg": None, "grad_args": (), "bad_values": {"oracle_mode": ["nope"], "gamma": [-1.0]}},
    ),
    "self_routing_probabilities": (
        E.self_routing_probabilities,
        lambda d: {"rewards": _rewards(d), "mean_entropy": torch.rand(G, K, generator=_gen(4), dtype=torch.float64).to(d)},
        {"output_shape": (G, 4), "mask_arg": None, "rank_args": (), "bad_values": {"delta_mode": ["nope"]}},
    ),
    "flowrl_loss": (
        E.flowrl_loss,
        lambda d: {**_flow(d), "log_z": torch.zeros(G, dtype=d)},
        {"output_shape": (B, T), "grad_args": ["logp", "log_z"]},
    ),
    "flowrl_optimal_log_z": (E.flowrl_optimal_log_z, _flow, {"output_shape": (G,), "grad_args": ()}),
    "gflowrl_loss": (
        E.gflowrl_loss,
        _flow,
        {"output_shape": (B, T), "grad_args": ["logp"], "bad_values": {"variant": ["nope"], "beta": [0.0]}},
    ),
    "flow_gap": (
        E.flow_gap,
        lambda d: {k: v for k, v in _flow(d).items() if k != "logp"},
        {"grad_args": (), "bad_values": {"variant": ["nope"]}},
    ),
    "mc_log_partition": (
        E.mc_log_partition,
        lambda d: {"scores": _rand(G, K, dtype=d), "valid": torch.tensor([[True, False, True], [True, True, True]])},
        {"output_shape": (G,), "mask_arg": "valid", "grad_args": ()},  # documented: a stop-gradient baseline
    ),
    "headroom": (
        E.headroom,
        lambda d: {
            "logp": _logp(d).reshape(G, K, T),
            "advantages": _rand(G, K, dtype=d),
            "mask": _mask().reshape(G, K, T),
        },
        {"output_shape": (G,), "grad_args": (), "rank_args": ()},
    ),
    "policy_drift": (
        E.policy_drift,
        lambda d: {
            "logp": _logp(d).reshape(G, K, T),
            "logp_gen": _near(_logp(d), 1).reshape(G, K, T),
            "mask": _mask().reshape(G, K, T),
        },
        {"output_shape": (G,), "grad_args": (), "rank_args": ()},
    ),
    "recoverability_gain": (
        E.recoverability_gain,
        lambda d: {"base_rewards": _rand(4, 3, dtype=d), "branch_rewards": _rand(4, 2, dtype=d, seed=1)},
        {"output_shape": (4,), "mask_arg": None, "rank_args": ()},
    ),
    "garl_advantages": (
        E.garl_advantages,
        lambda d: {"rewards": _rewards(d), "q": 0.5},
        # advantages are constants of the policy gradient (documented: no gradient)
        {"output_shape": (G, K), "mask_arg": None, "grad_args": (), "bad_values": {"q": [-0.5, 1.5]}},
    ),
    "paft_advantages": (
        E.paft_advantages,
        lambda d: {"rewards": _rewards(d), "uniforms": torch.rand(G, K, generator=_gen(5), dtype=torch.float64).to(d), "q": 0.5},
        {"output_shape": (G, K), "mask_arg": None, "grad_args": ()},
    ),
    "garl_weights": (
        E.garl_weights,
        lambda d: {"log_w": _rand(G, K, dtype=d), "q": 0.5},
        {"mask_arg": None, "grad_args": ()},
    ),
    "paft_weights": (
        E.paft_weights,
        lambda d: {"log_w": _rand(G, K, dtype=d), "uniforms": torch.rand(G, 4, generator=_gen(5), dtype=torch.float64).to(d), "q": 0.5},
        {"mask_arg": None, "grad_args": ()},
    ),
    "log_mean_weight": (
        E.log_mean_weight,
        lambda d: {"log_w": _rand(G, K, dtype=d)},
        {"output_shape": (G,), "mask_arg": None, "grad_args": ()},  # documented: the weights are stop-gradient
    ),
    "garl_loss": (
        E.garl_loss,
        lambda d: {"logp": _logp(d), "mask": _mask(), "log_w": _rand(G, K, dtype=d), "q": 0.5},
        {"output_shape": (B, T), "grad_args": ["logp"]},
    ),
    "paft_loss": (
        E.paft_loss,
        lambda d: {
            "logp": _logp(d),
            "mask": _mask(),
            "log_w": _rand(G, K, dtype=d),
            "uniforms": torch.rand(G, 4, generator=_gen(5), dtype=torch.float64).to(d),
            "q": 0.5,
        },
        {"output_shape": (B, T), "grad_args": ["logp"]},
    ),
    "dpo_loss": (
        E.dpo_loss,
        lambda d: {
            "logp_chosen": _rand(B, dtype=d).sub(3),
            "logp_rejected": _rand(B, dtype=d, seed=1).sub(3),
            "logp_ref_chosen": _rand(B, dtype=d, seed=2).sub(3),
            "logp_ref_rejected": _rand(B, dtype=d, seed=3).sub(3),
        },
        {"output_shape": (B,), "mask_arg": None, "bad_values": {"beta": [0.0], "label_smoothing": [-0.1, 0.6]}},
    ),
    "girsanov_template_weights": (
        E.girsanov_template_weights,
        lambda d: {"advantages": _rand(4, dtype=d), "t": _times(4, dtype=d), "eta": _times(4, dtype=d).mul(0.5)},
        {"output_shape": (4,), "mask_arg": None, "rank_args": ()},
    ),
    "template_loss": (
        E.template_loss,
        lambda d: {
            "delta_v": _rand(4, 2, dtype=d),
            "value_grad": _rand(4, 2, dtype=d, seed=1),
            "w1": _times(4, dtype=d),
            "w2": _times(4, dtype=d).mul(0.5),
        },
        {"output_shape": (4,), "mask_arg": None, "rank_args": ()},
    ),
    "bounded_weight": (
        E.bounded_weight,
        lambda d: {"t": _times(4, dtype=d)},
        {"output_shape": (4,), "mask_arg": None, "rank_args": (), "bad_values": {"kappa": [-0.1]}},
    ),
    "elbo_weight": (
        E.elbo_weight,
        lambda d: {"t": _times(4, dtype=d)},
        {"output_shape": (4,), "mask_arg": None, "rank_args": ()},
    ),
    "domain_means": (
        E.domain_means,
        lambda d: {"values": _rand(B, dtype=d), "domain": torch.tensor([0, 1, 1, 0, 1, 1]), "num_domains": 2},
        {"output_shape": (2,), "mask_arg": None},
    ),
    "es_gradient": (
        E.es_gradient,
        lambda d: {"rewards": _rand(4, dtype=d), "noise": _rand(4, 3, dtype=d, seed=1), "sigma": 0.1},
        {"output_shape": (3,), "mask_arg": None, "bad_values": {"sigma": [0.0]}},
    ),
    "antithetic_gradient": (
        E.antithetic_gradient,
        lambda d: {
            "rewards_plus": _rand(4, dtype=d),
            "rewards_minus": _rand(4, dtype=d, seed=2),
            "noise": _rand(4, 3, dtype=d, seed=1),
            "sigma": 0.1,
        },
        {"output_shape": (3,), "mask_arg": None, "bad_values": {"sigma": [0.0]}},
    ),
    "zscore_rewards": (
        E.zscore_rewards,
        lambda d: {"rewards": _rand(4, dtype=d)},
        {"output_shape": (4,), "mask_arg": None, "bad_values": {"eps": [0.0]}},
    ),
    "centered_rank_rewards": (
        E.centered_rank_rewards,
        lambda d: {"rewards": _rand(4, dtype=d)},
        {"output_shape": (4,), "mask_arg": None, "grad_args": ()},
    ),
    "shape_rewards": (
        E.shape_rewards,
        lambda d: {"rewards": _rand(4, dtype=d)},
        {"output_shape": (4,), "mask_arg": None, "bad_values": {"shaping": ["nope"]}},
    ),
}  # fmt: skip

# name -> "module::test" whose source calls check_estimator on it.
ELSEWHERE: dict[str, str] = {
    **{
        name: "tests.estimators.test_contracts::" + test
        for name, test in {
            "aggregate": "test_aggregate_contract",
            "broadcast_sequence_advantages": "test_broadcast_sequence_advantages_contract",
            "clipped_ratio_loss": "test_clipped_ratio_loss_contract",
            "cispo_loss": "test_cispo_loss_contract",
            "drgrpo_advantages": "test_group_advantages_contract",
            "group_normalized_advantages": "test_group_advantages_contract",
            "rloo_advantages": "test_group_advantages_contract",
            "group_rewards": "test_group_rewards_contract",
            "gspo_loss": "test_gspo_loss_contract",
            "k1_kl": "test_kl_contract",
            "k2_kl": "test_kl_contract",
            "k3_kl": "test_kl_contract",
            "log_ratio": "test_log_ratio_contract",
            "masked_mean": "test_masked_reductions_contract",
            "masked_sum": "test_masked_reductions_contract",
            "masked_whiten": "test_masked_whiten_contract",
            "reinforce_pp_advantages": "test_reinforce_pp_contract",
            "reinforce_pp_baseline_advantages": "test_reinforce_pp_baseline_contract",
            "sequence_log_ratio": "test_sequence_log_ratio_contract",
            "straight_through": "test_straight_through_contract",
            "token_entropy": "test_token_entropy_contract",
        }.items()
    },
    **{
        name: "tests.estimators.test_distill_contracts::CASES"
        for name in (
            "opd_token_advantages", "kdrl_advantages", "srpo_advantages", "rlsd_advantages", "trrd_loss",
            "opd_policy_loss", "topk_reverse_kl_reward", "topk_reverse_kl", "exopd_advantages",
            "opd2_advantages", "topk_distill_loss",
        )
    },
    **{
        name: "tests.estimators.test_path_space::" + test
        for name, test in {
            "girsanov_log_weights": "test_contract_girsanov_log_weights",
            "path_score": "test_contract_path_score_and_ito",
            "ito_policy_gradient": "test_contract_path_score_and_ito",
            "stochastic_value_gradient": "test_contract_value_gradients",
            "value_gradient_policy_gradient": "test_contract_value_gradients",
            "deterministic_value_gradient": "test_contract_value_gradients",
            "kde_value_gradient": "test_contract_value_gradients",
            "scale_bounded_loss": "test_contract_forward_matching_losses",
            "nft_loss": "test_contract_forward_matching_losses",
            "awm_loss": "test_contract_forward_matching_losses",
        }.items()
    },
    "entropy_lens": "tests.estimators.test_entropy_lens::test_contract",
}  # fmt: skip

_STATE = "takes or returns a state object (buffer / controller / population), not a tensor contract"
_PARAMS = "acts on a dict of named parameters (ES), by design in place or keyed by name; tested in test_p05_*"
NO_TENSOR_CONTRACT: dict[str, str] = {
    "zero_off_mask": "the masking primitive the estimators call after validating their own inputs; it validates "
    "nothing itself (a hot-path helper), so the bad-input contract does not apply; values, NaN/inf handling and "
    "the gradient are pinned by its doctest and test_zero_off_mask_is_where_with_the_mask_as_gradient",
    **{n: "registry access, not an estimator" for n in (
        "get_advantage", "get_kl", "get_policy_loss", "register_advantage", "register_kl",
        "register_policy_loss", "register_preference_loss")},
    "pass_at_k": "integer counts in, float64 out (numpy for numpy, torch for torch): own contract in test_contracts.py",
    "mean_at_k": "integer counts in, float64 out (numpy for numpy, torch for torch): own contract in test_contracts.py",
    "accuracy_bins": "boolean correctness in, integer histogram out (no float input, no gradient)",
    "answer_entropy": "integer answer ids in (no float input, no gradient)",
    "majority_vote_correct": "integer answer ids in, boolean out (no float input, no gradient)",
    "sis_accept": "a comparison (boolean out) of a probability with a uniform draw: no gradient by design",
    "is_scale_bounded": "takes a weight function and returns a Python bool",
    "controller_init": _STATE, "controller_predict": _STATE, "controller_update": _STATE,
    "plan_interventions": _STATE + " (and an explicit generator)",
    "replay_init": _STATE, "replay_add": _STATE, "replay_select": _STATE,
    "antithetic_population": _STATE, "evolution_strategy": "a factory of (init, update) functions",
    **{n: _PARAMS for n in (
        "es_direction", "es_step", "perturbed_params", "relative_drift", "threshold_update", "update_sparsity")},
    **{n: "integer seeds and names in, a noise tensor out (no float input)" for n in (
        "noise_chunks", "population_noise", "seeded_noise", "tensor_seed")},
}  # fmt: skip

# Contract failures still open (remove the entry when fixed: it then shows as XPASS).
KNOWN_FAILURES: dict[str, str] = {}


def _public_functions() -> dict[str, Callable[..., Any]]:
    out = {n: getattr(E, n) for n in E.__all__ if inspect.isfunction(getattr(E, n))}
    for reg in (E.ADVANTAGES, E.POLICY_LOSSES, E.KL_ESTIMATORS, E.PREFERENCE_LOSSES, E.VALUE_GRADIENTS):
        for name in reg.names():
            fn = inspect.unwrap(reg.get(name))
            out.setdefault(fn.__name__, fn)
    return out


def test_every_public_function_is_covered() -> None:
    tables = (set(CASES), set(ELSEWHERE), set(NO_TENSOR_CONTRACT))
    names = set(_public_functions())
    missing = sorted(names - set().union(*tables))
    assert not missing, f"public functions with no contract case, pointer or reason: {missing}"
    overlap = (tables[0] & tables[1]) | (tables[0] & tables[2]) | (tables[1] & tables[2])
    assert not overlap, f"listed twice: {sorted(overlap)}"
    stale = sorted(set().union(*tables) - names)
    assert not stale, f"listed but not public: {stale}"


@pytest.mark.parametrize("name", sorted(ELSEWHERE))
def test_pointer_runs_check_estimator(name: str) -> None:
    module_name, attr = ELSEWHERE[name].split("::")
    module = importlib.import_module(module_name)
    obj = getattr(module, attr)
    source = inspect.getsource(module) if attr == "CASES" else inspect.getsource(obj)
    fn = _public_functions()[name]
    assert "check_estimator(" in source, f"{ELSEWHERE[name]} does not call check_estimator"
    if attr == "CASES":  # a table run by that module's parametrized test_contract
        assert any(
            case[0] is fn or (getattr(case[0], "__name__", "") == "<lambda>" and fn.__name__ in source)
            for case in obj.values()
        ), f"{fn.__name__} is not in {module_name}.CASES"
    else:
        assert fn.__name__ in source, f"{ELSEWHERE[name]} does not mention {fn.__name__}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_contract(name: str, request: pytest.FixtureRequest) -> None:
    if name in KNOWN_FAILURES:  # still run: a fix shows as XPASS (then delete the entry)
        request.applymarker(pytest.mark.xfail(reason=KNOWN_FAILURES[name], raises=ContractFailure))
    fn, make, options = CASES[name]
    check_estimator(fn, make, **options)


def test_zero_off_mask_is_where_with_the_mask_as_gradient() -> None:
    from posttrain.estimators import zero_off_mask

    x = torch.tensor([[1.5, -2.0, float("nan")], [float("inf"), 3.0, -float("inf")]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [False, True, False]])
    out = zero_off_mask(x, mask)
    assert torch.equal(out.detach(), torch.tensor([[1.5, -2.0, 0.0], [0.0, 3.0, 0.0]]))
    out.sum().backward()
    assert x.grad is not None and torch.equal(x.grad, mask.to(x.dtype))
    finite = torch.randn(3, 4, dtype=torch.float64)
    m = torch.rand(3, 4) < 0.5
    assert torch.equal(zero_off_mask(finite, m), torch.where(m, finite, 0.0))
