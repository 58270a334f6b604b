"""Every declared mutant (a wrong method in the method's place) is not judged *reproduced* by its check.

Each mutant runs at its declared test size (default: the check's smoke config). The unmutated check
runs beside it at the same size: where the real method is not reproduced either, the mutant's verdict
shows nothing about the check, and the test is marked xfail with that reason (size the mutant with
``Mutant.test_config`` so that the real method reproduces).
"""

from __future__ import annotations

import pytest

from posttrain.paper_checks import CHECKS, load_all
from posttrain.paper_checks.model import Mutant, PaperCheck, Verdict
from posttrain.paper_checks.report import interval_text, primary_row, summarise
from posttrain.paper_checks.runner import CheckOutcome, run_check

pytestmark = pytest.mark.slow

load_all()
CASES = [(CHECKS.get(n), m) for n in CHECKS.names() for m in CHECKS.get(n).mutants]


def _primary(o: CheckOutcome) -> str:
    row = primary_row(summarise(o.result)) if o.result is not None else None
    return f"{o.verdict.value}: {interval_text(row)}" if row is not None else str(o.error)


def test_mutants_are_declared() -> None:
    assert CASES, "no check declares a mutant"
    for check, mutant in CASES:
        assert mutant.description and mutant.name == mutant.name.strip() and " " not in mutant.name, (check.id, mutant)


@pytest.mark.parametrize(("check", "mutant"), CASES, ids=[f"{c.id}-{m.name}" for c, m in CASES])
def test_a_mutant_is_not_reproduced(check: PaperCheck, mutant: Mutant) -> None:
    config = mutant.test_config() if mutant.test_config is not None else check.config(smoke=True)
    wrong = run_check(check, config=mutant.apply(config), mutant=mutant.name)
    assert wrong.verdict is not Verdict.ERROR, wrong.traceback
    assert wrong.verdict is not Verdict.REPRODUCED, f"check {check.id} reproduces {mutant.name}: {_primary(wrong)}"
    real = run_check(check, config=config)
    assert real.verdict is not Verdict.ERROR, real.traceback
    if real.verdict is not Verdict.REPRODUCED:
        pytest.xfail(f"at this size check {check.id} does not reproduce the real method either ({_primary(real)})")
