"""The entropy lens (paper 06): the estimator contract and the per-domain means."""

from __future__ import annotations

import torch

from posttrain.estimators import domain_means, entropy_lens
from posttrain.testing import check_estimator


def _inputs(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[True, True, False, False, True], [True, False, False, False, False], [True] * 5])
    return {
        "logits": torch.randn(3, 5, 7, generator=g, dtype=torch.float64).to(dtype),
        "tokens": torch.randint(0, 7, (3, 5), generator=g),
        "mask": mask,
    }


def test_contract() -> None:
    # the contract's empty-mask case is covered: a response with no token raises DomainError naming mask
    check_estimator(entropy_lens, _inputs, output_shape=(3,), grad_args=("logits",))


def test_domain_means() -> None:
    v = torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=torch.float64)
    out = domain_means(v, torch.tensor([1, 1, 0, 1]), num_domains=2)
    torch.testing.assert_close(out, torch.tensor([4.0, 11.0 / 3.0], dtype=torch.float64))
