"""Shared contract tests of the ES / select-and-improve paper checks (05, 10, 19), as a mixin class.

Each ``test_pNN_*.py`` subclasses :class:`CheckContract` with its check id, config type, ``run``
and a tiny config (small enough to run twice for the determinism test).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from posttrain.paper_checks import CHECKS
from posttrain.paper_checks.model import Result, Role
from tests.paper_checks._recorded import assert_matches_recorded


class CheckContract:
    check_id: ClassVar[str]
    config_type: ClassVar[Any]
    run: ClassVar[Callable[[Any], Result]]
    tiny: ClassVar[dict[str, Any]]

    @pytest.fixture(scope="class")
    @classmethod
    def smoke_result(cls) -> Result:
        return cls.run(cls.config_type.smoke())

    def test_registered(self) -> None:
        assert CHECKS.get(self.check_id).config_type is self.config_type

    def test_smoke_is_finite_and_complete(self, smoke_result: Result) -> None:
        seeds = self.config_type.smoke().seeds
        for m in smoke_result.metrics:
            assert m.per_seed and all(math.isfinite(v) for v in m.per_seed), m.name
        assert sum(len(m.per_seed) == seeds for m in smoke_result.metrics) >= len(smoke_result.metrics) // 2
        assert smoke_result.primary.role is Role.PRIMARY  # exactly one primary endpoint
        for c in smoke_result.comparisons:
            assert c.differences and all(math.isfinite(v) for v in c.differences), c.name
            assert c.margin_reason, c.name

    def test_same_seed_same_numbers(self) -> None:
        tiny = dataclasses.replace(self.config_type.smoke(), **self.tiny)
        first, again = type(self).run(tiny), type(self).run(tiny)
        assert first.metrics == again.metrics and first.comparisons == again.comparisons

    @pytest.mark.slow
    def test_full_verdict_matches_the_recorded_run(self) -> None:
        assert_matches_recorded(self.check_id, type(self).run(self.config_type()))
