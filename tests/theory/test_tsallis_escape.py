"""`escape_integral` against the flow's escape time and a simulated gradient ascent (models M1 and M2).

The closed form $I_q(p_0)=\\int_{p_0}^{p_{esc}}P^{q-2}dP$ brackets the escape time,
$I_q/C \\le T_q \\le I_q/c$ for score norms $s\\in[c, C]$ (`escape_time_bracket`), and for q < 1 it is
the escape time's small-$p_0$ limit in M1. Compared with: the exact flow time (`escape_time`: closed form,
quadrature, or the M2 ODE) and the simulated step count of gradient ascent on the sigmoid logit
(`discrete_escape_steps`, step $\\eta = T/20000$, so the Euler lag is below $10^{-3}T$). Mutants
(the integral x 1.05 or x 0.95, the exponent of a q shifted by 0.05) must break the comparison.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import pytest

from posttrain.theory import tsallis as th

QS = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)
P0S = (1e-6, 1e-4, 1e-2, 0.2)
SIM_STEPS = 20_000
EULER = 1e-3
"""Relative slack for the simulated ascent (forward Euler with T/20000 steps lags the flow by < 1e-3 T)."""
TIGHT = 0.01
"""|T/I - 1| at p0 = 1e-6 for q <= 1/2 (measured below 0.3%)."""

Integral = Callable[[float, float], float]


@cache
def _simulated_time(p0: float, q: float) -> float:
    eta = th.escape_time(p0, q) / SIM_STEPS
    return th.discrete_escape_steps(p0, q, eta=eta) * eta


def _violations(integral: Integral) -> list[str]:
    """Every (q, p0) where the bracket built from ``integral`` misses the flow or the simulated escape time,
    or where the small-p0 limit is off by more than `TIGHT`."""
    out = []
    for q in QS:
        for p0 in P0S:
            i = integral(p0, q)
            lo, hi = i / (1 - p0) ** 2, i / 0.25
            flow, sim = th.escape_time(p0, q), _simulated_time(p0, q)
            if not lo <= flow <= hi:
                out.append(f"flow q={q} p0={p0}: {flow:.6g} not in [{lo:.6g}, {hi:.6g}]")
            if not lo * (1 - EULER) <= sim <= hi * (1 + EULER):
                out.append(f"simulated q={q} p0={p0}: {sim:.6g} not in [{lo:.6g}, {hi:.6g}]")
            if p0 == P0S[0] and q <= 0.5 and abs(sim / i - 1) > TIGHT:
                out.append(f"limit q={q}: simulated T / I = {sim / i:.4f}")
    return out


def test_escape_integral_brackets_the_flow_and_the_simulated_escape() -> None:
    assert _violations(th.escape_integral) == []


def test_escape_time_bracket_is_the_integral_over_the_score_bounds() -> None:
    for q in QS:
        for p0 in P0S:
            lo, hi = th.escape_time_bracket(p0, q)
            assert lo == pytest.approx(th.escape_integral(p0, q) / (1 - p0) ** 2, rel=1e-14)
            assert hi == pytest.approx(4 * th.escape_integral(p0, q), rel=1e-14)


@pytest.mark.parametrize("k", [20, 100, 1000])
def test_softmax_escape_time_is_inside_its_bracket(k: int) -> None:
    """M2 (K arms, one rewarded, p0 = 1/K) has $s=\\frac{K}{K-1}(1-P)^2$; its ODE time lies in the bracket."""
    for q in QS:
        lo, hi = th.escape_time_bracket(1 / k, q, model="softmax", K=k)
        assert lo <= th.escape_time(1 / k, q, model="softmax", K=k) <= hi, q


@pytest.mark.parametrize(
    "name, mutant",
    [
        ("x 1.05", lambda p0, q: 1.05 * th.escape_integral(p0, q)),
        ("x 0.95", lambda p0, q: 0.95 * th.escape_integral(p0, q)),
        ("q + 0.05", lambda p0, q: th.escape_integral(p0, min(q + 0.05, 1.0))),
        ("q - 0.05", lambda p0, q: th.escape_integral(p0, max(q - 0.05, 0.0))),
    ],
)
def test_a_wrong_integral_is_caught(name: str, mutant: Integral) -> None:
    assert _violations(mutant), name
