"""The estimator contract (posttrain.testing.check_estimator) for the distillation estimators."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from posttrain.estimators import (
    exopd_advantages,
    kdrl_advantages,
    opd2_advantages,
    opd_policy_loss,
    opd_token_advantages,
    rlsd_advantages,
    topk_reverse_kl,
    topk_reverse_kl_reward,
    trrd_loss,
)
from posttrain.estimators.advantages import srpo_advantages
from posttrain.estimators.losses import topk_distill_loss
from posttrain.testing import check_estimator

B, T, K = 3, 5, 4  # distinct sizes so a wrong axis cannot pass as a valid shape


def _tok(dtype: torch.dtype, shift: float = 0.0, seed: int = 0) -> torch.Tensor:
    return -torch.rand(B, T, generator=torch.Generator().manual_seed(seed), dtype=dtype) - shift


def _topk(dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(B, T, K, generator=torch.Generator().manual_seed(seed), dtype=dtype).log_softmax(-1)


def _mask() -> torch.Tensor:
    m = torch.ones(B, T, dtype=torch.bool)
    m[0, 3:] = False
    return m


def _rule(dtype: torch.dtype) -> dict[str, Any]:
    return {"seq_advantages": torch.linspace(-1, 1, B, dtype=dtype), "opd": _tok(dtype), "mask": _mask()}


CASES: dict[str, tuple[Callable[..., Any], Callable[[torch.dtype], dict[str, Any]], dict[str, Any]]] = {
    "opd": (opd_token_advantages, lambda d: {"logp_teacher": _tok(d, 0.1, 1), "logp_old": _tok(d), "mask": _mask()},
            {"grad_args": ()}),
    "kdrl": (kdrl_advantages, _rule, {"rank_args": ("opd", "mask"), "bad_values": {"beta": [-0.1]}}),
    "srpo": (lambda seq_advantages, opd, mask: srpo_advantages(seq_advantages, opd, mask, torch.tensor([True, False, True])),
             _rule, {"rank_args": ("opd", "mask")}),
    "rlsd": (rlsd_advantages, _rule, {"rank_args": ("opd", "mask"), "bad_values": {"lam": [1.5], "eps_r": [0.0, 1.0]}}),
    "trrd": (trrd_loss, lambda d: {"logp": _tok(d), "logp_old": _tok(d, 0.05, 1), "logp_teacher": _tok(d, 0.2, 2),
                                   "advantages": torch.linspace(-1, 1, B, dtype=d), "mask": _mask()},
             {"bad_values": {"alpha": [-0.1, 1.1]}}),
    "opd_loss": (opd_policy_loss, lambda d: {"logp": _tok(d), "logp_old": _tok(d, 0.05, 1),
                                             "advantages": torch.linspace(-1, 1, B, dtype=d), "mask": _mask(),
                                             "logp_teacher": _tok(d, 0.2, 2), "beta": 0.2},
                 {"bad_values": {"beta": [-1.0]}}),
    "topk_reward": (topk_reverse_kl_reward, lambda d: {"logp_student_k": _topk(d, 0), "logp_teacher_k": _topk(d, 1),
                                                       "mask": _mask()}, {"grad_args": (), "output_shape": (B, T, K)}),
    "topk_kl": (topk_reverse_kl, lambda d: {"logp_student_k": _topk(d, 0), "logp_teacher_k": _topk(d, 1),
                                            "mask": _mask()}, {"grad_args": ()}),
    "exopd": (exopd_advantages, lambda d: {"logp_student": _tok(d), "logp_teacher": _tok(d, 0.1, 1),
                                           "logp_ref": _tok(d, 0.3, 2), "mask": _mask()}, {"grad_args": ()}),
    "opd2": (opd2_advantages, lambda d: {"logp_student": _tok(d), "logp_teacher": _tok(d, 0.1, 1),
                                         "logp_base": _tok(d, 0.3, 2), "logp_student_k": _topk(d, 3),
                                         "logp_teacher_k": _topk(d, 4), "logp_base_k": _topk(d, 5), "mask": _mask()},
             {"grad_args": ()}),
    "mopd_loss": (topk_distill_loss, lambda d: {"logp_k": _topk(d, 0), "logp_old_k": _topk(d, 1),
                                                "advantages_k": torch.randn(B, T, K, dtype=d), "mask": _mask()},
                  {"bad_values": {"dual_clip": [0.5]}}),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_contract(name: str) -> None:
    fn, make, options = CASES[name]
    options = {"output_shape": (B, T), **options}
    check_estimator(fn, make, **options)
