"""Spec 19 §8, task generator: GF(p) chains, inverses, traces, symbol rendering and the strategy detector."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from posttrain.errors import DomainError
from posttrain.llm.tools.tiny import ALPHABET
from posttrain.simulators.ffchain import (
    ChainProblem,
    Symbols,
    apply_op,
    detect_strategy,
    field_inverse,
    inverse_op,
    make_trace,
    parse_problem,
    parse_trace,
    render_problem,
    render_trace,
    run_chain,
    sample_problem,
    trace_answer,
)

primes = st.sampled_from([5, 7, 11, 13])
seeds = st.integers(0, 2**31 - 1)


@given(p=primes, length=st.integers(1, 15), seed=seeds, x=st.integers(0, 12))
def test_chain_and_inverse_are_mutually_inverse(p: int, length: int, seed: int, x: int) -> None:
    prob = sample_problem(random.Random(seed), p=p, length=length, kind="eval")
    x %= p
    inv_ops = tuple(inverse_op(o, p) for o in reversed(prob.ops))
    y = run_chain(x, prob.ops, p)[-1]
    assert run_chain(y, inv_ops, p)[-1] == x and run_chain(run_chain(x, inv_ops, p)[-1], prob.ops, p)[-1] == x
    assert all(k in ("add", "mul") and 0 < c < p and (k, c) not in (("mul", 1),) for k, c in prob.ops)


@given(p=primes, c=st.integers(1, 12))
def test_field_inverse(p: int, c: int) -> None:
    c = 1 + (c - 1) % (p - 1)
    assert c * field_inverse(c, p) % p == 1
    with pytest.raises(DomainError):
        field_inverse(0, p)


@given(p=primes, length=st.integers(1, 15), seed=seeds, kind=st.sampled_from(["eval", "inv"]))
def test_traces_reach_the_answers_by_single_valid_steps(p: int, length: int, seed: int, kind: str) -> None:
    rng = random.Random(seed)
    prob = sample_problem(rng, p=p, length=length, kind=kind)
    natural = "F" if kind == "eval" else "B"
    other = "B" if natural == "F" else "F"
    nat = make_trace(prob, natural)
    assert trace_answer(prob, nat) == prob.answer == nat.states[-1]
    guess = rng.randrange(p)
    unnat = make_trace(prob, other, guess=guess)
    ends = (
        run_chain(guess, prob.ops, p)[-1]
        if other == "F"
        else run_chain(guess, tuple(inverse_op(o, p) for o in reversed(prob.ops)), p)[-1]
    )
    assert unnat.states[-1] == ends and trace_answer(prob, unnat) == guess
    assert (unnat.states[-1] == prob.given) == (guess == prob.answer)  # the check succeeds iff the guess is right
    ops = prob.ops if natural == "F" else tuple(inverse_op(o, p) for o in reversed(prob.ops))
    prev = prob.given
    for state, op in zip(nat.states, ops, strict=True):  # every line is one valid operation
        assert state == apply_op(prev, op, p)
        prev = state


@given(p=primes, length=st.integers(1, 15), seed=seeds, kind=st.sampled_from(["eval", "inv"]))
def test_rendering_roundtrips_and_relabelling_is_a_bijection(p: int, length: int, seed: int, kind: str) -> None:
    rng = random.Random(seed)
    sym = Symbols.random(p, rng)
    assert sorted(sym.perm) == list(range(p)) and len({sym.name(x) for x in range(p)}) == p
    assert all(sym.value(sym.name(x)) == x for x in range(p))
    prob = sample_problem(rng, p=p, length=length, kind=kind)
    text = render_problem(prob, sym)
    assert set(text) <= set(ALPHABET) and parse_problem(text, sym) == prob
    for strategy in ("F", "B"):
        natural = (kind == "eval") == (strategy == "F")
        tr = make_trace(prob, strategy, guess=None if natural else rng.randrange(p))
        rendered = render_trace(tr, sym)
        assert set(rendered) <= set(ALPHABET) and parse_trace(rendered, sym) == tr


@given(p=primes, length=st.integers(1, 15), seed=seeds, kind=st.sampled_from(["eval", "inv"]))
def test_detector_labels_generated_traces(p: int, length: int, seed: int, kind: str) -> None:
    rng = random.Random(seed)
    prob = sample_problem(rng, p=p, length=length, kind=kind)
    for strategy in ("F", "B"):
        natural = (kind == "eval") == (strategy == "F")
        tr = make_trace(prob, strategy, guess=None if natural else rng.randrange(p))
        assert detect_strategy(prob, tr) == strategy


def test_detector_rejects_a_wrong_first_step() -> None:
    prob = ChainProblem(11, (("add", 3), ("mul", 2)), "eval", 4)
    assert detect_strategy(prob, make_trace(prob, "F")) == "F"
    bad = make_trace(prob, "F")
    assert detect_strategy(prob, type(bad)(None, ((bad.states[0] + 1) % 11, *bad.states[1:]))) == "other"
