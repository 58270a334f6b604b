"""Which registered estimator or framework mode the function equals, and where it departs from the closest.

Candidates of the same kind: every registered estimator callable with its default options in one of
the accepted forms, and the framework modes that ``docs/anchors.md`` documents as recipes on the
package's functions (TRL's ``scale_rewards``, OpenRLHF's ε, verl's dual clip and ``low_var_kl``,
...). Each candidate is run beside the function on a fixed probe set (binary and continuous rewards,
K = 2..8, constant groups, masks with holes and fully masked rows; log-ratios up to ±0.3, ±1.5
and ±30) in
float64, in the canonical per-token form (`posttrain.arena.kinds`). A candidate is *equal* when the
values (and, for losses and KL estimators, the gradients with respect to ``logp``) agree to a
relative ``1e-7`` on every probe; *proportional* when the function is ``c`` times it with ``c``
fixed (or fixed per group size). For the closest other candidate hypothesis shrinks the first input
where the two differ.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample
from torch import Tensor

from posttrain.arena.inputs import SEARCH, describe, kl_inputs, masked_inputs, policy_inputs
from posttrain.arena.kinds import REGISTRIES, Form, Kind, Subject, advantage_tokens, kl_values, loss_values, subject
from posttrain.estimators import (
    clipped_ratio_loss,
    group_normalized_advantages,
    k2_kl,
    k3_kl,
    rloo_advantages,
    straight_through,
    zero_off_mask,
)
from posttrain.llm.adapters.trl_recipe import batch_scaled_advantages
from posttrain.testing import grouped_rewards

__all__ = ["Candidate", "ConventionReport", "candidates", "run_conventions"]

RTOL = 1e-7

ALIASES: dict[str, str] = {
    "grpo": "verl grpo; TRL scale_rewards='group' up to its eps 1e-4",
    "drgrpo": "verl grpo with norm_adv_by_std_in_grpo=False; TRL scale_rewards='none'",
    "rloo": "verl rloo, rloo_vectorized (K >= 2)",
    "reinforce_pp": "verl reinforce_plus_plus (gamma = 1, or masks without holes)",
    "reinforce_pp_baseline": "verl reinforce_plus_plus_baseline (K >= 2)",
    "ppo_clip": "TRL's clipped loss (epsilon=0.2; TRL does not clamp |log-ratio| at 20); verl vanilla without dual clip",
    "gspo": "verl gspo; TRL importance_sampling_level='sequence'",
    "cispo": "verl cispo",
    "k1": "verl kl; OpenRLHF k1",
    "k2": "verl mse",
    "k3": "verl k3 without its value clamp",
}
"""What each registered default equals in the anchors (``docs/anchors.md``), shown beside a match."""


@dataclass(frozen=True)
class Candidate:
    name: str
    source: str
    subject: Subject


def _mode(name: str, source: str, fn: Callable[..., Any], kind: Kind) -> Candidate:
    return Candidate(name, source, subject(name, fn, kind))


def _trl_rloo_normalized(rewards: Tensor) -> Tensor:
    return group_normalized_advantages(rloo_advantages(rewards).reshape(1, -1), eps=1e-4).reshape(rewards.shape)


def _verl_k3_plus(logp: Tensor, logp_ref: Tensor) -> Tensor:
    return straight_through(k3_kl(logp, logp_ref, log_ratio_clamp=20.0, max_value=10.0), k2_kl(logp, logp_ref))


def _modes(kind: Kind) -> list[Candidate]:
    if kind is Kind.ADVANTAGE:
        return [
            _mode(
                "TRL scale_rewards='group'", "TRL 1.16", functools.partial(group_normalized_advantages, eps=1e-4), kind
            ),
            _mode("TRL scale_rewards='batch'", "TRL 1.16", batch_scaled_advantages, kind),
            _mode("OpenRLHF group_norm", "OpenRLHF", functools.partial(group_normalized_advantages, eps=1e-9), kind),
            _mode("TRL RLOOTrainer normalize_advantages", "TRL 1.16", _trl_rloo_normalized, kind),
            _mode("no baseline (REINFORCE)", "reference", lambda rewards: rewards.clone(), kind),
        ]
    if kind is Kind.LOSS:
        return [
            _mode(
                "verl vanilla (clip_ratio_c=3)",
                "verl 0.9.1",
                functools.partial(clipped_ratio_loss, dual_clip=3.0),
                kind,
            ),
            _mode(
                "DAPO clip-higher (clip_high=0.28)",
                "verl / TRL",
                functools.partial(clipped_ratio_loss, clip_high=0.28),
                kind,
            ),
        ]
    return [
        _mode("verl low_var_kl", "verl 0.9.1", functools.partial(k3_kl, log_ratio_clamp=20.0, max_value=10.0), kind),
        _mode("TRL k3 (no clamp)", "TRL 1.16", functools.partial(k3_kl, log_ratio_clamp=None), kind),
        _mode("verl k3+ (k3 value, k2 gradient)", "verl 0.9.1", _verl_k3_plus, kind),
    ]


def candidates(kind: Kind) -> list[Candidate]:
    """Registered estimators of ``kind`` usable with default options, then the framework modes."""
    out = []
    for entry in REGISTRIES[kind]:
        try:
            out.append(Candidate(entry.name, "registered", subject(entry.name, entry.obj, kind)))
        except Exception:  # needs options or extra inputs (teacher log-probs, oracle rewards): not comparable
            continue
    return out + _modes(kind)


# --- the canonical outputs ---------------------------------------------------------------------------------


def _outputs(s: Subject, ex: dict[str, Tensor]) -> tuple[Tensor, Tensor | None]:
    """The per-token values, and for losses / KL the gradient of their valid sum with respect to ``logp``."""
    if s.kind is Kind.ADVANTAGE:
        return advantage_tokens(s, ex["rewards"], ex["mask"]).detach(), None
    lp = ex["logp"].detach().clone().requires_grad_(True)
    if s.kind is Kind.LOSS:
        values = loss_values(s, lp, ex["logp_old"], ex["advantages"], ex["mask"])
        values = zero_off_mask(values, ex["mask"])
    else:
        values = kl_values(s, lp, ex["logp_ref"])
    (grad,) = torch.autograd.grad(values.sum(), lp, allow_unused=True)
    return values.detach(), torch.zeros_like(lp) if grad is None else grad


def _rel(a: Tensor, b: Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    scale = max(float(a.abs().max()) if a.numel() else 0.0, float(b.abs().max()) if b.numel() else 0.0, 1e-12)
    return float((a - b).abs().max()) / scale if a.numel() else 0.0


def _distance(user: tuple[Tensor, Tensor | None], other: tuple[Tensor, Tensor | None]) -> tuple[float, float]:
    value = _rel(user[0], other[0])
    grad = 0.0 if user[1] is None or other[1] is None else _rel(user[1], other[1])
    return value, grad


def _flat(out: tuple[Tensor, Tensor | None]) -> Tensor:
    return out[0].reshape(-1) if out[1] is None else torch.cat([out[0].reshape(-1), out[1].reshape(-1)])


def _differing(a: Tensor, b: Tensor) -> tuple[int, int]:
    """Entries of ``a`` that differ from ``b`` beyond `RTOL` of the larger magnitude, and the count of entries."""
    scale = max(float(a.abs().max()), float(b.abs().max()), 1e-12) if a.numel() else 1.0
    return int(((a - b).abs() > RTOL * scale).sum()), a.numel()


def _probes(kind: Kind) -> list[dict[str, Tensor]]:
    """The fixed probe set (seeded)."""
    g = torch.Generator().manual_seed(20250)
    out = []
    for i, k in enumerate((2, 3, 4, 8, 2, 5, 4, 8, 3, 6, 4, 2)):
        groups, t = 1 + i % 3, 1 + i % 4
        if i % 3 == 0:
            rewards = (torch.rand(groups, k, generator=g, dtype=torch.float64) < 0.5).double()
        else:
            rewards = torch.rand(groups, k, generator=g, dtype=torch.float64)
        if i % 4 == 1:
            rewards[0] = 0.25  # a constant group
        b = groups * k
        mask = torch.rand(b, t, generator=g) < 0.8
        mask[:, 0] = True
        if i % 5 == 2 and b > 1:
            mask[-1] = False  # a fully masked row
        logp = -3.0 * torch.rand(b, t, generator=g, dtype=torch.float64)
        far = 0.6 if i < 6 else 3.0 if i < 10 else 60.0  # |log-ratio| up to 0.3, 1.5, and 30 (clamps act)
        delta = far * (torch.rand(b, t, generator=g, dtype=torch.float64) - 0.5)
        adv = torch.randn(b, *((t,) if i % 2 else ()), generator=g, dtype=torch.float64)
        if kind is Kind.ADVANTAGE:
            out.append({"rewards": rewards, "mask": mask if i % 2 else torch.ones(b, t, dtype=torch.bool)})
        elif kind is Kind.LOSS:
            out.append({"logp": logp, "logp_old": logp - delta, "advantages": adv, "mask": mask})
        else:
            out.append({"logp": logp, "logp_ref": logp + delta})
    return out


@dataclass(frozen=True)
class Match:
    """How the function compares with one candidate over the probes."""

    name: str
    source: str
    value_diff: float
    grad_diff: float
    relation: str  # "equal", "same gradient", "proportional", "differs", "not comparable"
    share: float = float("nan")  # share of the probes' values (and gradients) that differ
    factor: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ConventionReport:
    matches: tuple[Match, ...]
    closest: str | None
    departure: str
    aliases: dict[str, str]

    @property
    def equal(self) -> tuple[Match, ...]:
        return tuple(m for m in self.matches if m.relation == "equal")


def _factor(pairs: list[tuple[int, Tensor, Tensor]]) -> dict[int, float] | None:
    """``{K: c}`` with user = c * other on every probe of group size K (c != 0), or None."""
    by_k: dict[int, float] = {}
    for k, u, o in pairs:
        denom = float((o * o).sum())
        if denom < 1e-20:
            if float(u.abs().max()) > 1e-12:
                return None
            continue
        c = float((u * o).sum()) / denom
        if abs(c) < 1e-9 or _rel(u, c * o) > 1e-6 or abs(by_k.get(k, c) - c) > 1e-6 * abs(c):
            return None
        by_k[k] = c
    return by_k or None


def _compare(user: Subject, cand: Candidate, probes: list[dict[str, Tensor]]) -> Match:
    values, grads, pairs, differ, total = [], [], [], 0, 0
    for ex in probes:
        try:
            mine, theirs = _outputs(user, ex), _outputs(cand.subject, ex)
        except Exception:  # either side refuses this probe (e.g. K = 1): skip it
            continue
        v, g = _distance(mine, theirs)
        values.append(v)
        grads.append(g)
        d, n = _differing(_flat(mine), _flat(theirs))
        differ, total = differ + d, total + n
        pairs.append((ex["rewards"].shape[-1] if "rewards" in ex else 0, _flat(mine), _flat(theirs)))
    if not values:
        return Match(cand.name, cand.source, float("nan"), float("nan"), "not comparable")
    v, g, share = max(values), max(grads), differ / max(total, 1)
    if v <= RTOL and g <= RTOL:
        return Match(cand.name, cand.source, v, g, "equal", share)
    if g <= RTOL and user.kind is not Kind.ADVANTAGE:
        return Match(cand.name, cand.source, v, g, "same gradient", share)
    factor = _factor(pairs)
    if factor is not None:
        return Match(cand.name, cand.source, v, g, "proportional", share, factor)
    return Match(cand.name, cand.source, v, g, "differs", share)


def _search_space(user: Subject) -> st.SearchStrategy[dict[str, Tensor]]:
    if user.form is Form.GROUPED:
        rewards = grouped_rewards(groups=(1, 3), k=(2, 6))
        return rewards.map(lambda r: {"rewards": r, "mask": torch.ones(r.numel(), 1, dtype=torch.bool)})
    if user.kind is Kind.ADVANTAGE:
        return masked_inputs(grouped_rewards(groups=(1, 3), k=(2, 6)))
    return policy_inputs(max_log_ratio=1.5) if user.kind is Kind.LOSS else kl_inputs()


def _departure(user: Subject, cand: Candidate, max_examples: int) -> str:
    def differs(ex: dict[str, Tensor]) -> bool:
        try:
            return max(_distance(_outputs(user, ex), _outputs(cand.subject, ex))) > RTOL
        except Exception:
            return False

    try:
        ex = find(_search_space(user), differs, settings=settings(SEARCH, max_examples=max_examples))
    except NoSuchExample:
        return f"no input found where it differs from {cand.name} (the fixed probes differ)"
    shown = ex if user.form is not Form.GROUPED else {"rewards": ex["rewards"]}
    mine, theirs = _outputs(user, ex), _outputs(cand.subject, ex)
    what = "value" if _rel(mine[0], theirs[0]) > RTOL else "gradient"
    i = 0 if what == "value" else 1
    a, b = mine[i], theirs[i]
    assert a is not None and b is not None
    extra = ""
    if user.kind is Kind.LOSS:
        extra = f"; ratio {describe({'r': (ex['logp'] - ex['logp_old']).exp()})[2:]}"
    return (
        f"first input where it differs from {cand.name} ({what}): {describe(shown)}{extra}; "
        f"yours {describe({'x': a})[2:]}, {cand.name} {describe({'x': b})[2:]}"
    )


def _closeness(m: Match) -> tuple[bool, float, float]:
    """Sort key: proportional (or same-gradient) candidates first, then the fewest differing entries, then
    the factor nearest 1."""
    factor_gap = max((abs(c - 1.0) for c in m.factor.values()), default=0.0)
    if m.relation == "proportional":
        return False, factor_gap, m.share
    return m.relation != "same gradient", m.share, factor_gap


def run_conventions(user: Subject, *, max_examples: int = 200) -> ConventionReport:
    """Compare ``user`` with every candidate of its kind; shrink where it departs from the closest one."""
    probes = _probes(user.kind)
    matches = tuple(_compare(user, c, probes) for c in candidates(user.kind) if c.subject.fn is not user.fn)
    comparable = [m for m in matches if m.relation != "not comparable"]
    if not comparable or any(m.relation == "equal" for m in comparable):
        return ConventionReport(matches, None, "", ALIASES)
    best = min(comparable, key=_closeness)
    cand = next(c for c in candidates(user.kind) if c.name == best.name)
    return ConventionReport(matches, best.name, _departure(user, cand, max_examples), ALIASES)
