r"""Multi-path verifier bandit: a one-step "response" toy where RL sharpening trades away coverage.

docs: methods/es_coverage.md, methods/es_solution_coverage.md (our design, calibrated to the papers' qualitative claims, not from them). A prompt
``x`` has a type (A with probability ``p_type_a``, else B); type A is solvable only by paths
``0..J/2-1``, type B only by the rest, each path of the right type independently correct with
probability ``q``. Logits $z(x) = b + W\phi(x) + \zeta(x)$ with fixed prompt-specific base
logits $\zeta(x)\sim\mathcal N(0,\tau^2 I_J)$ ("pretrained knowledge") and uninformative
features $\phi(x)\sim\mathcal N(0, I_D)/\sqrt D$; trainable $\theta=(b, W)$ starts at 0.
Because $b$ is shared and types are not identifiable from $\phi$, sharpening onto
type-A paths helps the majority and removes type-B coverage.

Everything carries a leading seed axis ``S`` so that seeds run in one batched computation; member
populations add a ``P`` axis. The exact success probability $p(x)=\sum_{j\in C(x)}
\mathrm{softmax}(z(x)/T)_j$ sits next to the sampler.

Trainers (both call the library's estimators):

- `train_grpo`: per step ``batch`` prompts, ``group`` samples at temperature 1, group
  advantages (`group_normalized_advantages`; Bessel std, which only
  rescales the step by a constant that Adam removes), the clipped-ratio loss at ratio 1 (one update
  per batch, so the gradient is exactly $-\frac1{BG}\sum\hat A\nabla\log\pi$), Adam.
- `train_es`: per step a population from `evolution_strategy`,
  all members evaluated in one batched matmul on the same prompts; fitness = greedy accuracy (or
  exact expected accuracy at temperature 1). Each member's noise is drawn once per step (a
  `NoiseCache` shared by the perturbation and the update).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import evolution_strategy, perturbed_params, tensor_seed
from posttrain.estimators.es import NoiseCache
from posttrain.simulators.loop import grpo_surrogate

__all__ = [
    "ARMS",
    "BanditArms",
    "BanditParams",
    "BanditSetup",
    "MultiPathBandit",
    "init_params",
    "make_bandit",
    "run_bandit_arms",
    "train_es",
    "train_grpo",
]

BanditParams = dict[str, Tensor]  # {"b": [S, J], "W": [S, J, D]}


@dataclass(frozen=True)
class MultiPathBandit:
    """A pool of prompts for ``S`` seeds: ``correct [S, X, J]`` bool, ``zeta [S, X, J]``, ``phi [S, X, D]``."""

    correct: Tensor
    zeta: Tensor
    phi: Tensor

    @property
    def n_paths(self) -> int:
        return int(self.correct.shape[-1])

    @property
    def n_features(self) -> int:
        return int(self.phi.shape[-1])

    def logits(self, params: BanditParams, idx: Tensor | None = None) -> Tensor:
        r"""Logits ``[S, (P,) X, J]`` of $b + W\phi + \zeta$ on all prompts or ``idx [S, X']``.

        ``params`` tensors are ``[S, J]`` / ``[S, J, D]`` or with a member axis ``[S, P, J]`` /
        ``[S, P, J, D]``.
        """
        zeta, phi = self._rows(idx)
        b, w = params["b"], params["W"]
        if b.ndim == 2:
            return b[:, None, :] + torch.einsum("sjd,sxd->sxj", w, phi) + zeta
        return b[:, :, None, :] + torch.einsum("spjd,sxd->spxj", w, phi) + zeta[:, None]

    def success(self, params: BanditParams, *, temperature: float, idx: Tensor | None = None) -> Tensor:
        r"""Exact success probability $p(x) = \sum_{j\in C(x)}\mathrm{softmax}(z/T)_j$, ``[S, (P,) X]``."""
        probs = torch.softmax(self.logits(params, idx) / temperature, dim=-1)
        return (probs * self._correct(idx, probs.ndim).to(probs.dtype)).sum(-1)

    def greedy_accuracy(self, params: BanditParams, idx: Tensor | None = None) -> Tensor:
        """Accuracy of the argmax path, averaged over prompts: ``[S, (P,)]``."""
        logits = self.logits(params, idx)
        hit = self._correct(idx, logits.ndim).expand(logits.shape).gather(-1, logits.argmax(-1, keepdim=True))
        return hit.squeeze(-1).to(logits.dtype).mean(-1)

    def _rows(self, idx: Tensor | None) -> tuple[Tensor, Tensor]:
        if idx is None:
            return self.zeta, self.phi
        return _take(self.zeta, idx), _take(self.phi, idx)

    def _correct(self, idx: Tensor | None, ndim: int) -> Tensor:
        c = self.correct if idx is None else _take(self.correct, idx)
        return c[:, None] if ndim == 4 else c


def _take(x: Tensor, idx: Tensor) -> Tensor:
    """Rows ``idx [S, X']`` of ``x [S, X, ...]`` per seed."""
    return x.gather(1, idx.reshape(idx.shape + (1,) * (x.ndim - 2)).expand(idx.shape + x.shape[2:]))


def make_bandit(
    seeds: list[int],
    *,
    n_prompts: int,
    n_paths: int = 8,
    n_features: int = 16,
    p_type_a: float = 0.8,
    q: float = 0.6,
    tau: float = 1.0,
    dtype: torch.dtype = torch.float64,
) -> MultiPathBandit:
    """Draw a prompt pool per seed (each seed has its own generator) and stack on a leading axis."""
    if n_paths < 2 or n_paths % 2:
        raise DomainError(f"n_paths: expected an even number >= 2, got {n_paths}")
    rows = []
    for s in seeds:
        gen = torch.Generator().manual_seed(int(s))
        type_a = torch.rand(n_prompts, generator=gen) < p_type_a
        first_half = torch.arange(n_paths) < n_paths // 2
        right_type = first_half[None, :] == type_a[:, None]
        correct = right_type & (torch.rand(n_prompts, n_paths, generator=gen) < q)
        zeta = tau * torch.randn(n_prompts, n_paths, generator=gen, dtype=dtype)
        phi = torch.randn(n_prompts, n_features, generator=gen, dtype=dtype) / n_features**0.5
        rows.append((correct, zeta, phi))
    return MultiPathBandit(*(torch.stack(t) for t in zip(*rows, strict=True)))


def init_params(env: MultiPathBandit) -> BanditParams:
    """Zero parameters ``{"b": [S, J], "W": [S, J, D]}`` (the base policy is softmax(zeta))."""
    s, j, d = env.correct.shape[0], env.n_paths, env.n_features
    return {"b": torch.zeros(s, j, dtype=env.zeta.dtype), "W": torch.zeros(s, j, d, dtype=env.zeta.dtype)}


def _batches(gens: list[torch.Generator], n_prompts: int, batch: int) -> Tensor:
    return torch.stack([torch.randint(0, n_prompts, (batch,), generator=g) for g in gens])


def train_grpo(
    env: MultiPathBandit,
    params: BanditParams,
    gens: list[torch.Generator],
    *,
    steps: int,
    batch: int = 32,
    group: int = 8,
    lr: float = 0.1,
) -> BanditParams:
    """GRPO with Adam from ``params`` (a fresh optimiser); one generator per seed in ``gens``."""
    p = {n: t.detach().clone().requires_grad_(True) for n, t in params.items()}
    opt = torch.optim.Adam(list(p.values()), lr=lr, betas=(0.9, 0.999), eps=1e-8)
    n_seeds, n_prompts = env.correct.shape[0], env.correct.shape[1]
    for _ in range(steps):
        idx = _batches(gens, n_prompts, batch)  # [S, B]
        logp_all = torch.log_softmax(env.logits(p, idx), dim=-1)  # [S, B, J]
        with torch.no_grad():
            actions = torch.stack(
                [torch.multinomial(logp_all[s].exp(), group, replacement=True, generator=g) for s, g in enumerate(gens)]
            )  # [S, B, G]
            rewards = _take(env.correct, idx).gather(-1, actions).to(logp_all.dtype)  # [S, B, G]
        logp = logp_all.gather(-1, actions).reshape(n_seeds, batch * group)
        loss = grpo_surrogate(logp, rewards.reshape(n_seeds, batch * group), group=group)
        opt.zero_grad()
        # token mean per seed, summed over seeds: seeds share nothing (Adam is elementwise)
        loss.mean(-1).sum().backward()
        opt.step()
    return {n: t.detach() for n, t in p.items()}


def train_es(
    env: MultiPathBandit,
    params: BanditParams,
    keys: list[int],
    gens: list[torch.Generator],
    *,
    steps: int,
    start_step: int = 0,
    batch: int = 32,
    population: int = 32,
    sigma: float = 0.5,
    lr: float = 0.1,
    fitness: str = "greedy",
    antithetic: bool = False,
) -> BanditParams:
    r"""One-point ES (z-scored fitness): all members of all seeds evaluated in one batched matmul.

    ``keys`` are the per-seed ES keys; ``fitness`` is ``"greedy"`` (argmax accuracy on the batch)
    or ``"expected"`` (exact expected accuracy at temperature 1).
    """
    if fitness not in ("greedy", "expected"):
        raise DomainError(f"fitness: expected 'greedy' or 'expected', got {fitness!r}")
    es = evolution_strategy(population=population, sigma=sigma, lr=lr, antithetic=antithetic)
    n_prompts = env.correct.shape[1]
    states = [es.init(k)._replace(step=start_step) for k in keys]
    cur = [{n: t[s] for n, t in params.items()} for s in range(len(keys))]
    for _ in range(steps):
        idx = _batches(gens, n_prompts, batch)
        pops = [es.ask(st) for st in states]
        caches = [NoiseCache() for _ in keys]  # the step's noise of every member: a few KiB per seed
        members = [perturbed_params(c, pop, sigma=sigma, cache=k) for c, pop, k in zip(cur, pops, caches, strict=True)]
        batched = {n: torch.stack([m[n] for m in members]) for n in ("b", "W")}  # [S, P, ...]
        if fitness == "greedy":
            rewards = env.greedy_accuracy(batched, idx)  # [S, P]
        else:
            rewards = env.success(batched, temperature=1.0, idx=idx).mean(-1)
        for s in range(len(keys)):
            cur[s], states[s] = es.update(cur[s], pops[s], rewards[s], states[s], caches[s])
    return {n: torch.stack([c[n] for c in cur]) for n in ("b", "W")}


@dataclass(frozen=True)
class BanditArms:
    """Train/test pools and the trained parameters of each arm (``base``, ``grpo``, ``es``, ...)."""

    train: MultiPathBandit
    test: MultiPathBandit
    arms: dict[str, BanditParams]


ARMS = ("base", "grpo", "es", "es_expected", "es_then_grpo", "grpo_then_es")


def run_bandit_arms(
    seeds: list[int],
    *,
    arms: tuple[str, ...],
    n_train: int = 4096,
    n_test: int = 2048,
    steps: int = 200,
    batch: int = 32,
    group: int = 8,
    grpo_lr: float = 0.1,
    population: int = 32,
    sigma: float = 0.5,
    es_lr: float = 0.1,
    substitute: Sequence[tuple[str, str]] = (),
) -> BanditArms:
    """Train the requested arms on pools drawn from ``seeds`` (test pools from ``seed + 1000``).

    Every arm gets its own generators derived from ``(seed, arm name)``; sequential arms split
    ``steps`` into two halves (the second phase starts a fresh Adam / continues the ES key).
    ``substitute`` pairs ``(arm, stand_in)`` train ``arm`` exactly as ``stand_in`` (same generators:
    the stand-in's own parameters), the paper checks' mutants.
    """
    stand_in = dict(substitute)
    unknown = (set(arms) | set(stand_in) | set(stand_in.values())) - set(ARMS)
    if unknown:
        raise DomainError(f"arms/substitute: unknown {sorted(unknown)}; valid: {ARMS}")
    train = make_bandit(seeds, n_prompts=n_train)
    test = make_bandit([s + 1000 for s in seeds], n_prompts=n_test)
    base = init_params(train)

    def gens(tag: str) -> list[torch.Generator]:
        return [torch.Generator().manual_seed(tensor_seed(s, tag)) for s in seeds]

    def keys(tag: str) -> list[int]:
        return [tensor_seed(s, tag) >> 2 for s in seeds]

    def grpo(p: BanditParams, tag: str, n: int) -> BanditParams:
        return train_grpo(train, p, gens(tag), steps=n, batch=batch, group=group, lr=grpo_lr)

    def es(p: BanditParams, tag: str, n: int, fitness: str = "greedy") -> BanditParams:
        return train_es(
            train, p, keys(tag), gens(tag + "-batch"), steps=n, batch=batch, population=population,
            sigma=sigma, lr=es_lr, fitness=fitness,
        )  # fmt: skip

    half = steps // 2

    def train_arm(arm: str) -> BanditParams:
        if arm == "base":
            return base
        if arm == "grpo":
            return grpo(base, "grpo", steps)
        if arm == "es":
            return es(base, "es", steps)
        if arm == "es_expected":
            return es(base, "es-expected", steps, fitness="expected")
        if arm == "es_then_grpo":
            return grpo(es(base, "seq-es1", half), "seq-grpo2", steps - half)
        return es(grpo(base, "seq-grpo1", half), "seq-es2", steps - half)

    trained: dict[str, BanditParams] = {}  # by training rule: a stand-in is trained once
    out: dict[str, BanditParams] = {}
    for name in arms:
        arm = stand_in.get(name, name)
        if arm not in trained:
            trained[arm] = train_arm(arm)
        out[name] = trained[arm]
    return BanditArms(train, test, out)


@dataclass(frozen=True)
class BanditSetup:
    """The shared settings of the bandit arms (docs: methods/es_coverage.md, methods/es_solution_coverage.md); paper-check configs extend it."""

    seeds: int = 10
    n_train: int = 4096  # spec 7: train pool
    n_test: int = 2048  # spec 7: test pool
    steps: int = 200  # spec 7
    batch: int = 32  # spec 7: B prompts per step
    group: int = 8  # spec 7: G
    grpo_lr: float = 0.1  # spec 7: Adam
    population: int = 32  # spec 7: N = 4G (matched compute)
    sigma: float = 0.5  # spec 7
    es_lr: float = 0.1  # spec 7: alpha
    first_seed: int = 0  # seeds first_seed .. first_seed + seeds - 1 (pilots: 10_000 ..)
    substitute: tuple[tuple[str, str], ...] = ()  # mutants: (arm, stand-in) trains an arm as another one

    def train_arms(self, arms: tuple[str, ...]) -> BanditArms:
        """`run_bandit_arms` on seeds ``first_seed .. first_seed + seeds - 1`` with these settings."""
        return run_bandit_arms(
            list(range(self.first_seed, self.first_seed + self.seeds)), arms=arms, n_train=self.n_train,
            n_test=self.n_test, steps=self.steps, batch=self.batch, group=self.group, grpo_lr=self.grpo_lr,
            population=self.population, sigma=self.sigma, es_lr=self.es_lr, substitute=self.substitute,
        )  # fmt: skip
