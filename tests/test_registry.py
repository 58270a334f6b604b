"""The name registries: registration, lookup errors that list valid names, duplicates, summaries."""

from __future__ import annotations

import pytest

from posttrain.errors import RegistryError
from posttrain.estimators import (
    ADVANTAGES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    clipped_ratio_loss,
    get_advantage,
    get_kl,
    get_policy_loss,
    group_normalized_advantages,
    k3_kl,
)
from posttrain.registry import REGISTRIES, Registry, registry


def test_core_estimators_are_registered_under_their_names() -> None:
    assert get_advantage("grpo") is group_normalized_advantages
    assert get_policy_loss("ppo_clip") is clipped_ratio_loss
    assert get_kl("k3") is k3_kl
    for reg, names in (
        (ADVANTAGES, {"grpo", "drgrpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"}),
        (POLICY_LOSSES, {"ppo_clip", "gspo", "cispo"}),
        (KL_ESTIMATORS, {"k1", "k2", "k3"}),
    ):
        assert names <= set(reg.names())


def test_every_core_entry_has_a_summary_and_a_paper() -> None:
    for reg in (ADVANTAGES, POLICY_LOSSES, KL_ESTIMATORS):
        for entry in reg:
            assert entry.summary, entry.name
            assert entry.paper, entry.name


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(RegistryError) as info:
        get_advantage("grpoo")
    message = str(info.value)
    assert "'grpoo'" in message and "grpo" in message and "rloo" in message
    assert isinstance(info.value, KeyError)  # RegistryError is a KeyError


def test_duplicate_name_fails_and_keeps_the_first() -> None:
    reg: Registry[object] = Registry("thing")

    @reg.register("a", paper="P")
    def first() -> None:
        """First line of the docstring.

        More text.
        """

    with pytest.raises(RegistryError, match="already registered"):
        reg.add("a", object())
    assert reg.get("a") is first
    assert reg.entry("a").summary == "First line of the docstring."
    assert reg.entry("a").paper == "P"
    assert "a" in reg and len(reg) == 1 and [e.name for e in reg] == ["a"]


def test_registry_rejects_empty_names_and_lists_none_when_empty() -> None:
    reg: Registry[object] = Registry("empty")
    with pytest.raises(RegistryError, match="non-empty"):
        reg.add("", object())
    with pytest.raises(RegistryError, match=r"\(none\)"):
        reg.get("x")


def test_registry_of_a_kind_is_process_wide() -> None:
    kind = "test-registry-kind"
    assert registry(kind) is registry(kind)
    assert REGISTRIES[kind] is registry(kind)
    assert registry("advantage") is ADVANTAGES
    del REGISTRIES[kind]
