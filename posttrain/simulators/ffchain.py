r"""Finite-field arithmetic chains with abstract symbols (docs: methods/select_improve.md; Krishnamurthy et al. 2026, arXiv:2606.13125).

A problem over $\mathrm{GF}(p)$ has operations $o_1..o_L$, each ``("add", c)``
($x\mapsto x+c$) or ``("mul", c)`` ($x\mapsto cx$, $c\ne0$), chain
$f=o_L\circ\dots\circ o_1$. *Evaluation* gives $x_0$ and asks $f(x_0)$;
*inversion* gives $y$ and asks $f^{-1}(y)$, with $\mathrm{add}(c)^{-1}=\mathrm{add}(-c)$,
$\mathrm{mul}(c)^{-1}=\mathrm{mul}(c^{p-2})$. Strategy **F** writes $x_1..x_L$ forward,
**B** undoes the operations from the output, writing $x_{L-1}..x_0$. An unnatural pairing
(F on inversion, B on evaluation) starts from a stated guess of the unknown end (*reconstructed*,
docs: methods/select_improve.md): the answer is the guess, correct iff the chain reproduces the given end.

Field elements are rendered through a seeded permutation as ``(eK)`` symbols, using only
characters of the tiny tokenizer's alphabet, e.g. ``eval:(e3);add(e5);mul(e2)`` and a trace
``guess(e4);(e1);(e7)``. Generation excludes identity operations (``add 0``, ``mul 1``) and never
produces ``mul 0`` (docs: methods/select_improve.md recommendation).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from posttrain.errors import DomainError

__all__ = [
    "ChainProblem",
    "Symbols",
    "Trace",
    "apply_op",
    "detect_strategy",
    "field_inverse",
    "inverse_op",
    "make_trace",
    "parse_problem",
    "parse_trace",
    "render_problem",
    "render_trace",
    "run_chain",
    "sample_problem",
    "trace_answer",
]

Op = tuple[str, int]
_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31)


def field_inverse(c: int, p: int) -> int:
    """$c^{-1} = c^{p-2} \\bmod p$ (Fermat) for ``c != 0``.

    Examples:
        >>> field_inverse(3, 11), 3 * field_inverse(3, 11) % 11
        (4, 1)
    """
    if c % p == 0:
        raise DomainError(f"c: 0 has no inverse in GF({p})")
    return pow(c, p - 2, p)


def apply_op(x: int, op: Op, p: int) -> int:
    """One operation: ``add`` -> ``x + c``, ``mul`` -> ``c x`` (mod p)."""
    kind, c = op
    return (x + c) % p if kind == "add" else (x * c) % p


def inverse_op(op: Op, p: int) -> Op:
    """``add(c) -> add(-c)``, ``mul(c) -> mul(c^(p-2))``."""
    kind, c = op
    return ("add", (-c) % p) if kind == "add" else ("mul", field_inverse(c, p))


def run_chain(x: int, ops: tuple[Op, ...], p: int) -> list[int]:
    """States after each operation: ``[o_1(x), o_2(o_1(x)), ...]``."""
    states = []
    for op in ops:
        x = apply_op(x, op, p)
        states.append(x)
    return states


@dataclass(frozen=True)
class ChainProblem:
    """``kind`` is ``"eval"`` (``given`` = x_0) or ``"inv"`` (``given`` = y = f(x_0))."""

    p: int
    ops: tuple[Op, ...]
    kind: str
    given: int

    @property
    def answer(self) -> int:
        if self.kind == "eval":
            return run_chain(self.given, self.ops, self.p)[-1]
        return run_chain(self.given, tuple(inverse_op(o, self.p) for o in reversed(self.ops)), self.p)[-1]


def sample_problem(rng: random.Random, *, p: int, length: int, kind: str) -> ChainProblem:
    """A uniform random problem: operations uniform over {add, mul} and non-identity constants."""
    if p not in _PRIMES:
        raise DomainError(f"p: expected a small prime in {_PRIMES}, got {p}")
    if length < 1 or kind not in ("eval", "inv"):
        raise DomainError(f"length/kind: expected length >= 1 and kind in ('eval', 'inv'), got {length}, {kind!r}")
    ops = tuple(
        ("add", rng.randrange(1, p)) if rng.random() < 0.5 else ("mul", rng.randrange(2, p)) for _ in range(length)
    )
    return ChainProblem(p, ops, kind, rng.randrange(p))


@dataclass(frozen=True)
class Trace:
    """A response: an optional stated guess (unnatural pairings) and the written states."""

    guess: int | None
    states: tuple[int, ...]


def make_trace(problem: ChainProblem, strategy: str, *, guess: int | None = None) -> Trace:
    """The F or B trace of ``problem``; unnatural pairings need the ``guess`` of the unknown end."""
    natural = (problem.kind == "eval") == (strategy == "F")
    if strategy not in ("F", "B") or (natural and guess is not None) or (not natural and guess is None):
        raise DomainError(
            f"strategy/guess: a guess is needed exactly for unnatural pairings, got {strategy!r}, {guess}"
        )
    start = problem.given if natural else int(guess)  # type: ignore[arg-type]
    ops = problem.ops if strategy == "F" else tuple(inverse_op(o, problem.p) for o in reversed(problem.ops))
    return Trace(guess, tuple(run_chain(start, ops, problem.p)))


def trace_answer(problem: ChainProblem, trace: Trace) -> int:
    """The answer a trace gives: its last state (natural) or its guess (unnatural)."""
    return trace.states[-1] if trace.guess is None else trace.guess


def detect_strategy(problem: ChainProblem, trace: Trace) -> str:
    """``"F"`` if the first state is $o_1$ of the input, ``"B"`` if it is $o_L^{-1}$ of the output.

    The input/output is the given end or, for unnatural pairings, the stated guess; because the
    rendering marks a guess explicitly, the rule is unambiguous for every ``L >= 1`` (a rule on the
    first state alone confuses F and B at ``L = 1``, where both start from the given end).
    """
    if not trace.states:
        return "other"
    first, p = trace.states[0], problem.p
    start_in = problem.given if problem.kind == "eval" else trace.guess
    start_out = problem.given if problem.kind == "inv" else trace.guess
    if (trace.guess is None) == (problem.kind == "eval") and start_in is not None:
        return "F" if first == apply_op(start_in, problem.ops[0], p) else "other"
    if start_out is not None and first == apply_op(start_out, inverse_op(problem.ops[-1], p), p):
        return "B"
    return "other"


@dataclass(frozen=True)
class Symbols:
    """A bijection $\\mathbb Z_p \\to \\{e0..e(p-1)\\}$ given by a permutation."""

    perm: tuple[int, ...]

    @classmethod
    def random(cls, p: int, rng: random.Random) -> Symbols:
        perm = list(range(p))
        rng.shuffle(perm)
        return cls(tuple(perm))

    def name(self, x: int) -> str:
        return f"(e{self.perm[x]})"

    def value(self, name: str) -> int:
        m = re.fullmatch(r"\(e(\d+)\)", name)
        if m is None or int(m.group(1)) >= len(self.perm):
            raise DomainError(f"name: not a symbol of GF({len(self.perm)}): {name!r}")
        return self.perm.index(int(m.group(1)))


_SYMBOL = r"\(e\d+\)"


def render_problem(problem: ChainProblem, symbols: Symbols) -> str:
    """``eval:(e3);add(e5);mul(e2)``.

    Examples:
        >>> sym = Symbols((2, 0, 1))  # 0 -> e2, 1 -> e0, 2 -> e1 in GF(3)
        >>> prob = ChainProblem(3, (("add", 1), ("mul", 2)), "eval", 0)
        >>> render_problem(prob, sym), prob.answer, render_trace(make_trace(prob, "F"), sym)
        ('eval:(e2);add(e0);mul(e1)', 2, '(e0);(e1)')
    """
    ops = ";".join(f"{k}{symbols.name(c)}" for k, c in problem.ops)
    return f"{problem.kind}:{symbols.name(problem.given)};{ops}"


def parse_problem(text: str, symbols: Symbols) -> ChainProblem:
    """Inverse of `render_problem`."""
    m = re.fullmatch(rf"(eval|inv):({_SYMBOL})((?:;(?:add|mul){_SYMBOL})+)", text)
    if m is None:
        raise DomainError(f"text: not a rendered chain problem: {text!r}")
    ops = tuple((k, symbols.value(s)) for k, s in re.findall(rf";(add|mul)({_SYMBOL})", m.group(3)))
    return ChainProblem(len(symbols.perm), ops, m.group(1), symbols.value(m.group(2)))


def render_trace(trace: Trace, symbols: Symbols) -> str:
    """``guess(e4);(e1);(e7)`` (no ``guess`` part for natural pairings)."""
    head = [f"guess{symbols.name(trace.guess)}"] if trace.guess is not None else []
    return ";".join(head + [symbols.name(x) for x in trace.states])


def parse_trace(text: str, symbols: Symbols) -> Trace:
    """Inverse of `render_trace`."""
    parts = text.split(";")
    guess = symbols.value(parts[0][len("guess") :]) if parts[0].startswith("guess") else None
    return Trace(guess, tuple(symbols.value(s) for s in parts[1 if guess is not None else 0 :]))
