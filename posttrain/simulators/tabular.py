r"""Tabular autoregressive policies over short token sequences, with exact enumeration.

A policy is a logits table ``[*seeds, G, N_nodes, V]``: one row of V logits per (prompt, context
node). `TabularSpec` fixes vocabulary ``V``, horizon ``T``, an optional end-of-sequence
token and how a prefix maps to a node: ``"tree"`` (one node per distinct prefix, a token tree:
$\sum_{t<T} V^t$ nodes) or ``"markov"`` (one node per (position, previous token):
$1 + (T-1)V$ nodes). The sequence probability is

$$
\pi(y \mid g) = \prod_{t} \mathrm{softmax}(\theta_{g,\,n(y_{<t})})[y_t]
$$

over the positions up to and including the first EOS. After EOS a response is padded with token
0 and masked out, so a finished sequence has one canonical ``[T]`` row.

Sampling draws ``[*seeds, G, K, T]`` tokens with behaviour log-probs and masks (one uniform per
position, a loop over the T positions only); `token_logp` returns the differentiable
``[*seeds, G, K, T]`` log-probs in the layout `posttrain.estimators` consumes after
``reshape(-1, T)``. When $V^T \le 10^5$ every sequence is enumerated
(`enumerate_sequences`), giving exact sequence probabilities, expected reward, pass@k,
entropy, and reverse/forward KL to a teacher table of the same spec. Verifiers score complete
sequences; `TargetVerifier` holds several correct sequences per prompt,
`HammingVerifier` gives the dense reward $1 - \mathrm{Hamming}(y, \tau)/T$.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators import zero_off_mask
from posttrain.simulators._base import Generatorish, Rollout, log_softmax_small, sample_categorical, uniform
from posttrain.theory.es_coverage import exact_pass_at_k
from posttrain.validate import check_float, check_tensor

__all__ = [
    "HammingVerifier",
    "TabularEnv",
    "TabularSpec",
    "TargetVerifier",
    "Verifier",
    "boost_sequences",
    "enumerate_sequences",
    "sample_sequences",
    "sequence_logp",
    "token_logp",
    "visited_logit_rows",
    "visited_rows",
]

MAX_ENUMERATION = 100_000
_Idx = TypeVar("_Idx", int, Tensor)


@dataclass(frozen=True)
class TabularSpec:
    """Vocabulary ``vocab`` (V), horizon ``horizon`` (T), optional ``eos`` token id, and the context map.

    Examples:
        >>> TabularSpec(vocab=3, horizon=2).num_nodes, TabularSpec(vocab=3, horizon=2, context="markov").num_nodes
        (4, 4)
    """

    vocab: int
    horizon: int
    eos: int | None = None
    context: Literal["tree", "markov"] = "tree"

    def __post_init__(self) -> None:
        if self.vocab < 2 or self.horizon < 1:
            raise DomainError(f"vocab, horizon: expected vocab >= 2 and horizon >= 1, got {self.vocab}, {self.horizon}")
        if self.eos is not None and not 0 <= self.eos < self.vocab:
            raise DomainError(f"eos: expected a token id in [0, {self.vocab}), got {self.eos}")
        if self.context not in ("tree", "markov"):
            raise DomainError(f"context: expected 'tree' or 'markov', got {self.context!r}")

    @property
    def num_nodes(self) -> int:
        v, t = self.vocab, self.horizon
        return (v**t - 1) // (v - 1) if self.context == "tree" else 1 + (t - 1) * v

    def prefix_nodes(self, tokens: Int[Tensor, "*batch T"]) -> Int[Tensor, "*batch T"]:
        """Node index of the prefix ``tokens[..., :t]`` for every position ``t`` (batched, no loop)."""
        v, t = self.vocab, self.horizon
        prev = torch.nn.functional.pad(tokens[..., :-1], (1, 0))  # y_{t-1}, 0 at t = 0
        pos = torch.arange(t, device=tokens.device)
        if self.context == "markov":
            return torch.where(pos == 0, 0, 1 + (pos - 1).clamp(min=0) * v + prev)
        # tree: node = offset_t + sum_{i<t} y_i V^{t-1-i}; W[i, t] = V^{t-1-i} for i < t.
        lag = pos.unsqueeze(0) - 1 - pos.unsqueeze(1)
        weights = torch.where(lag >= 0, v ** lag.clamp(min=0), 0)
        offsets = (v**pos - 1) // (v - 1)
        return offsets + tokens @ weights

    def next_node(self, node: _Idx, t: int, token: _Idx) -> _Idx:
        """Node of the prefix extended by ``token`` at position ``t`` (the incremental form of `prefix_nodes`)."""
        if self.context == "markov":
            return 1 + t * self.vocab + token
        return node * self.vocab + token + 1

    def response_mask(self, tokens: Int[Tensor, "*batch T"]) -> Bool[Tensor, "*batch T"]:
        """True up to and including the first EOS (everywhere when ``eos`` is None)."""
        if self.eos is None:
            return torch.ones_like(tokens, dtype=torch.bool)
        is_eos = (tokens == self.eos).to(torch.long)
        ended_before = (is_eos.cumsum(-1) - is_eos) > 0
        return ~ended_before


def _check_table(spec: TabularSpec, table: Tensor) -> Tensor:
    check_float("table", table)
    if table.ndim < 3 or table.shape[-2:] != (spec.num_nodes, spec.vocab):
        raise ShapeError(
            f"table: expected shape [*seeds, G, {spec.num_nodes}, {spec.vocab}] for {spec}, got {list(table.shape)}"
        )
    return table


def visited_rows(spec: TabularSpec, table: Tensor, tokens: Tensor) -> Int[Tensor, " R"]:
    """``[R]`` (R = ``tokens.numel()``) index of each prefix's logit row in ``table.reshape(-1, V)``, row-major
    over ``tokens [*seeds, G, K, T]`` (``table [*seeds, G, N, V]``)."""
    if table.ndim != tokens.ndim:
        raise ShapeError(f"tokens: expected rank {table.ndim} ([*seeds, G, K, T]), got {list(tokens.shape)}")
    lead_g = table.shape[:-2]
    base = torch.arange(math.prod(lead_g), device=tokens.device).reshape(*lead_g, 1) * spec.num_nodes
    return (base + spec.prefix_nodes(tokens).reshape(*lead_g, -1)).reshape(-1)


def visited_logit_rows(spec: TabularSpec, table: Tensor, tokens: Tensor) -> Float[Tensor, "R V"]:
    """``[R, V]`` copies of the logit rows at every prefix of ``tokens`` (`visited_rows`; one ``index_select``
    of whole rows, differentiable; faster than an expanded ``gather``, same values and gradient)."""
    return table.reshape(-1, spec.vocab).index_select(0, visited_rows(spec, table, tokens))


def token_logp(spec: TabularSpec, table: Float[Tensor, "*seeds G N V"], tokens: Int[Tensor, "*seeds G K T"]) -> Tensor:
    r"""Per-token $\log\pi(y_t \mid g, y_{<t})$ ``[*seeds, G, K, T]``, differentiable; 0 off the mask.

    Examples:
        >>> spec = TabularSpec(vocab=2, horizon=2)
        >>> token_logp(spec, torch.zeros(1, 3, 2), torch.tensor([[[1, 0]]])).exp().tolist()
        [[[0.5, 0.5]]]
    """
    _check_table(spec, table)
    check_tensor("tokens", tokens, ndim=table.ndim)
    rows = log_softmax_small(visited_logit_rows(spec, table, tokens))  # only the visited rows: [R, V]
    out = rows.gather(-1, tokens.reshape(-1, 1)).reshape(tokens.shape)
    return zero_off_mask(out, spec.response_mask(tokens))


def sample_sequences(
    spec: TabularSpec, table: Float[Tensor, "*seeds G N V"], k: int, generator: Generatorish
) -> tuple[Int[Tensor, "*seeds G K T"], Bool[Tensor, "*seeds G K T"], Float[Tensor, "*seeds G K T"]]:
    """Draw ``k`` sequences per prompt: ``(tokens, mask, logp)`` (no gradient; canonical padding after EOS)."""
    _check_table(spec, table)
    lead, (g, n, v) = table.shape[:-3], table.shape[-3:]
    u = uniform(generator, (*lead, g, int(k), spec.horizon))
    flat = table.detach().reshape(-1, v)  # rows of every (seed, prompt, node)
    base = (torch.arange(flat.shape[0] // n) * n).reshape(*lead, g, 1)
    tokens = torch.zeros(*lead, g, int(k), spec.horizon, dtype=torch.long)
    logp = torch.zeros(*lead, g, int(k), spec.horizon, dtype=table.dtype)
    node = torch.zeros(*lead, g, int(k), dtype=torch.long)
    alive = torch.ones(*lead, g, int(k), dtype=torch.bool)
    for t in range(spec.horizon):  # autoregressive: position t needs y_{<t}
        logits = flat.index_select(0, (base + node).reshape(-1)).reshape(*node.shape, v)  # [*s, G, K, V]
        y = torch.where(alive, sample_categorical(logits, u[..., t, None])[..., 0], 0)
        tokens[..., t] = y
        logp[..., t] = torch.where(alive, log_softmax_small(logits).gather(-1, y[..., None])[..., 0], 0.0)
        node = spec.next_node(node, t, y)
        if spec.eos is not None:
            alive = alive & (y != spec.eos)
    return tokens, spec.response_mask(tokens), logp


@functools.cache
def enumerate_sequences(spec: TabularSpec) -> tuple[Tensor, Tensor]:
    """Every distinct complete sequence once: ``(tokens [N_seq, T], mask [N_seq, T])`` (needs ``V^T <= 1e5``)."""
    if spec.vocab**spec.horizon > MAX_ENUMERATION:
        raise DomainError(f"spec: V^T = {spec.vocab**spec.horizon} exceeds {MAX_ENUMERATION}; sample instead")
    grids = torch.cartesian_prod(*[torch.arange(spec.vocab)] * spec.horizon).reshape(-1, spec.horizon)
    mask = spec.response_mask(grids)
    canonical = (torch.where(mask, 0, grids) == 0).all(-1)
    return grids[canonical].contiguous(), mask[canonical].contiguous()


@functools.cache
def _enumerated_edges(spec: TabularSpec) -> tuple[Tensor, Tensor]:
    """Flat (node * V + token) index ``[N_seq * T]`` of every enumerated sequence's edges, and its mask."""
    tokens, mask = enumerate_sequences(spec)
    return (spec.prefix_nodes(tokens) * spec.vocab + tokens).reshape(-1), mask


def sequence_logp(spec: TabularSpec, table: Float[Tensor, "*seeds G N V"]) -> Float[Tensor, "*seeds G N_seq"]:
    """Exact $\\log\\pi(y\\mid g)$ of every enumerated sequence (differentiable; they sum to 1 in probability)."""
    _check_table(spec, table)
    idx, mask = _enumerated_edges(spec)
    logp_table = torch.log_softmax(table, dim=-1).flatten(-2)  # [*s, G, N*V]
    edges = logp_table[..., idx].unflatten(-1, tuple(mask.shape))  # [*s, G, N_seq, T]
    return zero_off_mask(edges, mask).sum(-1)


def boost_sequences(
    spec: TabularSpec,
    table: Float[Tensor, "G N V"],
    sequences: Int[Tensor, "G C T"],
    amount: Float[Tensor, "G C T"] | float,
) -> Tensor:
    """Add ``amount`` to the logit of every edge on the given sequences (e.g. a teacher that knows the answers)."""
    _check_table(spec, table)
    g, c, t = sequences.shape
    idx = (spec.prefix_nodes(sequences) * spec.vocab + sequences).reshape(g, c * t)
    add = torch.as_tensor(amount, dtype=table.dtype).expand(g, c, t).reshape(g, c * t)
    add = zero_off_mask(add, spec.response_mask(sequences).reshape(g, c * t))
    flat = table.reshape(g, -1).scatter_add(-1, idx, add)
    return flat.reshape(table.shape)


class Verifier(Protocol):
    """Scores complete sequences: ``(tokens [*seeds, G, K, T], mask) -> rewards [*seeds, G, K]`` in [0, 1].

    It must broadcast over leading axes: `TabularEnv` scores every enumerated sequence for
    every prompt at once by passing ``[1, N_seq, T]`` and reading ``[G, N_seq]``.
    """

    def __call__(self, tokens: Tensor, mask: Tensor) -> Tensor: ...


@dataclass(frozen=True, eq=False)
class TargetVerifier:
    """Reward 1 when the sequence equals one of its prompt's correct sequences ``targets [G, C, T]``.

    Targets are canonical (0 after EOS); duplicates among a prompt's targets count once.
    """

    spec: TabularSpec
    targets: Int[Tensor, "G C T"]

    def __call__(self, tokens: Tensor, mask: Tensor) -> Tensor:
        canon = torch.where(mask, tokens, 0)
        hit = (canon.unsqueeze(-2) == self.targets.unsqueeze(-3)).all(-1)  # [*s, G, K, C]
        return hit.any(-1).to(torch.float64)

    @classmethod
    def random(
        cls, spec: TabularSpec, *, num_prompts: int, num_correct: int, generator: torch.Generator
    ) -> TargetVerifier:
        """``num_correct`` distinct correct sequences per prompt, uniform over all enumerated sequences."""
        tokens, _ = enumerate_sequences(spec)
        keys = torch.rand(num_prompts, tokens.shape[0], generator=generator, dtype=torch.float64)
        pick = keys.argsort(-1)[:, :num_correct]
        return cls(spec, tokens[pick])


@dataclass(frozen=True, eq=False)
class HammingVerifier:
    """Dense reward $1 - \\#\\{t: y_t \\ne \\tau_t\\}/T$ against one target ``[G, T]`` per prompt (no EOS)."""

    target: Int[Tensor, "G T"]

    def __call__(self, tokens: Tensor, mask: Tensor) -> Tensor:
        return (tokens == self.target.unsqueeze(-2)).to(torch.float64).mean(-1)


@dataclass(frozen=True, eq=False)
class TabularEnv:
    """A tabular policy's environment: the paper and a verifier, with exact metrics by enumeration.

    Examples:
        >>> spec = TabularSpec(vocab=3, horizon=2)
        >>> env = TabularEnv(spec, TargetVerifier(spec, torch.tensor([[[1, 2]]])))
        >>> table = torch.zeros(1, spec.num_nodes, 3, dtype=torch.float64)
        >>> round(env.exact_metrics(table)["success"].item(), 6)
        0.111111
    """

    spec: TabularSpec
    verifier: Verifier
    pass_ks: tuple[int, ...] = field(default=(1, 8))

    @property
    def horizon(self) -> int:
        return self.spec.horizon

    @functools.cached_property
    def sequence_rewards(self) -> Float[Tensor, "G N_seq"]:
        """Reward of every enumerated sequence for every prompt."""
        tokens, mask = enumerate_sequences(self.spec)
        probe = self.verifier(tokens.unsqueeze(0), mask.unsqueeze(0))
        return probe.reshape(-1, tokens.shape[0])

    def sample(self, params: Tensor, k: int, generator: Generatorish) -> Rollout:
        tokens, mask, logp = sample_sequences(self.spec, params, k, generator)
        return Rollout(tokens, mask, logp.to(params.dtype), self.verifier(tokens, mask).to(params.dtype))

    def token_logp(self, params: Tensor, tokens: Tensor) -> Tensor:
        return token_logp(self.spec, params, tokens)

    def sequence_probs(self, params: Tensor) -> Tensor:
        """``[*seeds, G, N_seq]`` exact sequence probabilities (differentiable)."""
        return sequence_logp(self.spec, params).exp()

    def expected_reward(self, params: Tensor) -> Tensor:
        """``[*seeds, G]`` exact $E_\\pi[r]$ (differentiable: autograd gives the exact policy gradient)."""
        return (self.sequence_probs(params) * self.sequence_rewards.to(params.dtype)).sum(-1)

    def success_prob(self, params: Tensor) -> Tensor:
        """``[*seeds, G]`` exact probability of a reward-1 sequence."""
        ok = self.sequence_rewards >= 1.0
        return torch.where(ok, self.sequence_probs(params), torch.zeros((), dtype=params.dtype)).sum(-1)

    def entropy(self, params: Tensor) -> Tensor:
        """``[*seeds, G]`` sequence-level entropy in nats."""
        logp = sequence_logp(self.spec, params)
        return -torch.special.xlogy(logp.exp(), logp.exp()).sum(-1)

    def kl(self, params: Tensor, teacher: Tensor, *, direction: Literal["reverse", "forward"] = "reverse") -> Tensor:
        r"""Exact sequence-level KL ``[*seeds, G]`` to a teacher table.

        ``reverse``: $\mathrm{KL}(\pi\|\pi_T)$; ``forward``: $\mathrm{KL}(\pi_T\|\pi)$.
        """
        a, b = sequence_logp(self.spec, params), sequence_logp(self.spec, teacher.to(params.dtype))
        if direction == "forward":
            a, b = b, a
        elif direction != "reverse":
            raise DomainError(f"direction: expected 'reverse' or 'forward', got {direction!r}")
        p = a.exp()
        return torch.where(p > 0, p * (a - b), torch.zeros((), dtype=p.dtype)).sum(-1)

    def exact_metrics(self, params: Tensor) -> dict[str, Tensor]:
        """Means over prompts: ``success``, ``reward``, ``entropy``, ``pass@k`` for ``k`` in ``pass_ks``."""
        with torch.no_grad():
            logp = sequence_logp(self.spec, params)
            probs = logp.exp()
            rewards = self.sequence_rewards.to(params.dtype)
            p = torch.where(rewards >= 1.0, probs, torch.zeros((), dtype=probs.dtype)).sum(-1)
            out = {
                "success": p.mean(-1),
                "reward": (probs * rewards).sum(-1).mean(-1),
                "entropy": -torch.special.xlogy(probs, probs).sum(-1).mean(-1),
            }
            for k in self.pass_ks:
                out[f"pass@{k}"] = exact_pass_at_k(p.clamp(max=1.0), k=k).mean(-1)  # a softmax sum may round above 1
        return out
