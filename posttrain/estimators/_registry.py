"""The estimator registries: advantage functions, policy losses and KL estimators.

Registration happens at import time of the module that defines the function; a duplicate name
fails there. Config and CLI code look functions up by name with `get_advantage` /
`get_policy_loss` / `get_kl`; the estimators themselves never see a config.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from posttrain.registry import Registry, registry

__all__ = [
    "ADVANTAGES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "get_advantage",
    "get_kl",
    "get_policy_loss",
    "register_advantage",
    "register_kl",
    "register_policy_loss",
]

F = TypeVar("F", bound=Callable[..., Any])

ADVANTAGES: Registry[Any] = registry("advantage")
POLICY_LOSSES: Registry[Any] = registry("policy_loss")
KL_ESTIMATORS: Registry[Any] = registry("kl")


def register_advantage(name: str, *, paper: str = "") -> Callable[[F], F]:
    """Register an advantage function under ``name`` (decorator)."""
    return ADVANTAGES.register(name, paper=paper)


def register_policy_loss(name: str, *, paper: str = "") -> Callable[[F], F]:
    """Register a per-token policy loss under ``name`` (decorator)."""
    return POLICY_LOSSES.register(name, paper=paper)


def register_kl(name: str, *, paper: str = "") -> Callable[[F], F]:
    """Register a per-token KL estimator under ``name`` (decorator)."""
    return KL_ESTIMATORS.register(name, paper=paper)


def get_advantage(name: str) -> Callable[..., Any]:
    """The advantage function registered as ``name``."""
    return ADVANTAGES.get(name)  # type: ignore[no-any-return]


def get_policy_loss(name: str) -> Callable[..., Any]:
    """The policy loss registered as ``name``."""
    return POLICY_LOSSES.get(name)  # type: ignore[no-any-return]


def get_kl(name: str) -> Callable[..., Any]:
    """The KL estimator registered as ``name``."""
    return KL_ESTIMATORS.get(name)  # type: ignore[no-any-return]
