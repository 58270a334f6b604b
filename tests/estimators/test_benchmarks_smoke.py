"""The benchmark runner (``python -m benchmarks``) at a tiny size, so that it cannot rot.

Times are not asserted (this is not a timed test); the runner's own equivalence checks (ours equals
its reference on the benchmark inputs) run inside it and would raise.
"""

from __future__ import annotations

import math

from benchmarks.__main__ import main, parse, run, table


def test_benchmark_runner_small() -> None:
    rows = run(parse(["--small"]))
    names = [r.name for r in rows]
    assert any(n.startswith("GRPO advantages end to end") for n in names)
    assert any(n.startswith("clipped loss + default aggregate") for n in names)
    assert any(r.reference.startswith("floor: 17 B/token") for r in rows)
    for r in rows:
        anchored = r.reference != "-"  # a row without its anchor (verl not importable) says so
        assert r.ours_s >= 0 and (not anchored or (r.reference_s > 0 and math.isfinite(r.ratio)))
        assert (r.met is None) == (r.target is None)
    assert table(rows).row_count == len(rows)


def test_benchmark_main_prints_a_table(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--small"]) == 0
    assert "ratio" in capsys.readouterr().out
