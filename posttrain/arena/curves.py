r"""Learning curves on an exact tabular toy, over seeds side by side, judged with the paper checks' statistics.

The task (`CurveConfig`): 8 prompts, a tabular autoregressive policy over 3 tokens (one of them EOS)
and 3 positions, one correct sequence per prompt among 15, initial logits $\mathcal N(0, 0.5^2)$ drawn
per seed; Adam (as LLM trainers use; an estimator that only rescales the gradient gets nearly the
same curve under Adam, its scale shows in the gradient section). Each step samples ``k`` responses
per prompt. By kind, the function under test takes the place of one part of a GRPO step:

- advantage: its advantages, with the clipped-ratio loss, one update per batch (ratio 1);
- loss: its loss, with GRPO advantages and ``epochs`` updates per batch (ratios leave 1, so
  clipping matters); the exact KL between consecutive policies is recorded;
- kl: its per-token estimate as a loss term $\beta\,k(\log\pi, \log\pi_{ref})$ beside the clipped-ratio
  loss with RLOO advantages, against $\pi_{ref}$ = the initial policy; the exact regularised objective
  $J_\beta = E[r] - \beta\,\mathrm{KL}(\pi\|\pi_{ref})$ has the known optimum
  $J^*_\beta = \beta \log E_{\pi_{ref}}[e^{r/\beta}]$.

Every method runs on the same seeds (same initial policy, same random streams): paired differences.
Endpoints, fixed here before any run (`ENDPOINTS`; the first of each kind is the primary):

- **final reward** (exact expected reward after the last step, in [0, 1]; differences in [-1, 1]:
  the betting bound, valid for every distribution on the range);
- **steps to threshold** (first step with exact success >= ``threshold``, ``steps + 1`` when never;
  baseline minus yours, divided by ``steps + 1``: in [-1, 1], bounded mean);
- **final pass@k** (exact, in [0, 1]; bounded mean);
- loss: **update KL** (mean exact KL between consecutive policies; unbounded: median bounds);
- kl: **objective gap** $J^*_\beta - J_\beta$ at the end (baseline minus yours; unbounded: median bounds).

Each comparison is judged by `posttrain.paper_checks.stats.compare` at one-sided level 0.025:
*better* (the lower bound clears 0), *worse* (the upper bound is at or below 0), else
*indistinguishable*, with the minimum detectable effect at this seed count and the observed spread
for bounded ones (`posttrain.paper_checks.bounds.min_detectable_effect` at power 0.8, `MDE_REPS`
repetitions per power estimate). The
share of seeds reaching the threshold is shown per method with Clopper-Pearson bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.arena.kinds import Kind, Subject, advantage_tokens, kl_values, loss_values
from posttrain.estimators import clipped_ratio_loss, group_normalized_advantages, rloo_advantages, zero_off_mask
from posttrain.paper_checks import bounds
from posttrain.paper_checks.model import ALPHA, Role, mean_criterion
from posttrain.paper_checks.stats import POWER, Outcome, compare
from posttrain.simulators import SeedRNG, TabularEnv, TabularSpec, TargetVerifier
from posttrain.simulators.loop import aggregate_per_seed
from posttrain.simulators.tabular import sequence_logp

__all__ = ["ENDPOINTS", "CurveConfig", "Curves", "EndpointResult", "judge_curves", "reached_bounds", "run_curves"]

ENDPOINTS: dict[Kind, tuple[str, ...]] = {
    Kind.ADVANTAGE: ("final reward", "steps to threshold", "final pass@k"),
    Kind.LOSS: ("final reward", "steps to threshold", "final pass@k", "update KL"),
    Kind.KL: ("objective gap", "final reward", "final pass@k"),
}
"""The endpoints of each kind, primary first (module docstring)."""
WORDS = {Outcome.HOLDS: "better", Outcome.EXCLUDED: "worse", Outcome.UNDECIDED: "indistinguishable"}
MDE_REPS = 400
"""Monte Carlo repetitions per power evaluation of the minimum detectable effect (its SE is about 0.02 in power)."""


@dataclass(frozen=True)
class CurveConfig:
    """The learning-curve task; ``epochs`` defaults to 4 for losses and 1 otherwise."""

    seeds: int = 64
    steps: int = 60
    k: int = 8
    prompts: int = 8
    lr: float = 0.05
    epochs: int | None = None
    threshold: float = 0.5
    pass_k: int = 8
    beta: float = 0.5
    init_scale: float = 0.5
    first_seed: int = 1000


@dataclass(frozen=True)
class Curves:
    """Per method: ``reward [steps + 1, S]``, ``final`` endpoint values ``[S]`` by name, threshold hits."""

    reward: Tensor
    final: dict[str, Tensor]
    reached: int


@dataclass(frozen=True)
class EndpointResult:
    """One endpoint of the function against one baseline."""

    endpoint: str
    baseline: str
    estimate: float
    lower: float
    upper: float
    verdict: str
    method: str
    mde: float = math.nan
    note: str = ""


def _env(cfg: CurveConfig) -> TabularEnv:
    spec = TabularSpec(vocab=3, horizon=3, eos=2)
    verifier = TargetVerifier.random(
        spec, num_prompts=cfg.prompts, num_correct=1, generator=torch.Generator().manual_seed(0)
    )
    return TabularEnv(spec, verifier, pass_ks=(cfg.pass_k,))


def _init(env: TabularEnv, cfg: CurveConfig) -> Tensor:
    tables = []
    for s in range(cfg.first_seed, cfg.first_seed + cfg.seeds):
        g = torch.Generator().manual_seed(s)
        tables.append(
            cfg.init_scale
            * torch.randn(cfg.prompts, env.spec.num_nodes, env.spec.vocab, generator=g, dtype=torch.float64)
        )
    return torch.stack(tables)


def _optimum(env: TabularEnv, ref: Tensor, beta: float) -> Tensor:
    """``[S]`` exact $J^*_\\beta$, mean over prompts."""
    logp = sequence_logp(env.spec, ref)
    return (beta * torch.logsumexp(logp + env.sequence_rewards / beta, -1)).mean(-1)


def _split(fn: Callable[..., Tensor], independent: bool, s: int, *xs: Tensor) -> Tensor:
    """``fn`` on all seeds' rows at once, or seed by seed (``xs`` carry a leading seed axis)."""
    if independent:
        return fn(*(x.reshape(-1, *x.shape[2:]) for x in xs))
    return torch.cat([fn(*(x[i] for x in xs)) for i in range(s)])


def _step_loss(subject: Subject, kind: Kind, independent: bool, cfg: CurveConfig) -> Callable[..., Tensor]:
    """``(logp, logp_old, logp_ref, rewards, mask) -> [S]`` per-seed losses for one update."""

    def step(lp: Tensor, lp_old: Tensor, lp_ref: Tensor, rewards: Tensor, mask: Tensor) -> Tensor:
        s, t = rewards.shape[0], lp.shape[-1]
        rows = mask.reshape(s, -1, t)
        if kind is Kind.ADVANTAGE:
            with torch.no_grad():
                adv = _split(lambda r, m: advantage_tokens(subject, r, m), independent, s, rewards, rows)
            tok, _ = clipped_ratio_loss(lp, lp_old, adv, mask.reshape(-1, t))
            mode = "token-mean"
        elif kind is Kind.LOSS:
            adv = group_normalized_advantages(rewards.reshape(-1, cfg.k)).reshape(s, -1)
            args = (lp.reshape(s, -1, t), lp_old.reshape(s, -1, t), adv, rows)
            tok = _split(lambda *a: zero_off_mask(loss_values(subject, *a), a[3]), independent, s, *args)
            mode = "token-mean"
        else:
            adv = rloo_advantages(rewards.reshape(-1, cfg.k)).reshape(-1)
            pg, _ = clipped_ratio_loss(lp, lp_old, adv, mask.reshape(-1, t))
            kl = zero_off_mask(kl_values(subject, lp, lp_ref), mask.reshape(-1, t))
            tok, mode = pg + cfg.beta * kl, "seq-mean-token-sum"
        return aggregate_per_seed(tok.reshape(s, -1, t), rows, mode)

    return step


def run_curves(subject: Subject, *, independent: bool, cfg: CurveConfig = CurveConfig()) -> Curves:
    """Train the task with ``subject`` in its place; every seed side by side."""
    env, kind = _env(cfg), subject.kind
    epochs = cfg.epochs if cfg.epochs is not None else (4 if kind is Kind.LOSS else 1)
    start = _init(env, cfg)
    theta = start.clone().requires_grad_(True)
    opt = torch.optim.Adam([theta], lr=cfg.lr)
    rng = SeedRNG.from_seeds(range(cfg.first_seed, cfg.first_seed + cfg.seeds))
    step_loss = _step_loss(subject, kind, independent, cfg)
    s, t = cfg.seeds, env.spec.horizon
    first_hit = torch.full((s,), cfg.steps + 1, dtype=torch.float64)
    rewards, update_kl = [env.exact_metrics(start)["reward"]], []
    for step in range(1, cfg.steps + 1):
        before = theta.detach().clone()
        with torch.no_grad():
            roll = env.sample(before, cfg.k, rng)
            lp_ref = env.token_logp(start, roll.tokens).reshape(-1, t)
        for _ in range(epochs):
            lp = env.token_logp(theta, roll.tokens).reshape(-1, t)
            old = lp.detach() if epochs == 1 else roll.logp.reshape(-1, t)
            per_seed = step_loss(lp, old, lp_ref, roll.rewards, roll.mask)
            opt.zero_grad(set_to_none=True)
            per_seed.sum().backward()
            opt.step()
        with torch.no_grad():
            m = env.exact_metrics(theta.detach())
            rewards.append(m["reward"])
            first_hit = torch.where((m["success"] >= cfg.threshold) & (first_hit > cfg.steps), float(step), first_hit)
            if kind is Kind.LOSS:
                update_kl.append(env.kl(theta.detach(), before).mean(-1))
    final = {"final reward": rewards[-1], "steps to threshold": first_hit, "final pass@k": m[f"pass@{cfg.pass_k}"]}
    if kind is Kind.LOSS:
        final["update KL"] = torch.stack(update_kl).mean(0)
    if kind is Kind.KL:
        with torch.no_grad():
            j = rewards[-1] - cfg.beta * env.kl(theta.detach(), start).mean(-1)
            final["objective gap"] = _optimum(env, start, cfg.beta) - j
    return Curves(torch.stack(rewards), final, int((first_hit <= cfg.steps).sum()))


def _difference(name: str, mine: Tensor, theirs: Tensor, cfg: CurveConfig) -> tuple[Tensor, tuple[float, float] | None]:
    """Paired differences oriented so that positive favours the function, and their declared range."""
    if name == "steps to threshold":
        return (theirs - mine) / (cfg.steps + 1), (-1.0, 1.0)
    if name == "objective gap":
        return theirs - mine, None
    if name == "update KL":
        return mine - theirs, None
    return mine - theirs, (-1.0, 1.0)


def judge_curves(mine: Curves, baselines: dict[str, Curves], kind: Kind, cfg: CurveConfig) -> list[EndpointResult]:
    """Every endpoint of ``kind`` against every baseline (module docstring)."""
    out = []
    for base, theirs in baselines.items():
        for name in ENDPOINTS[kind]:
            d, rng = _difference(name, mine.final[name], theirs.final[name], cfg)
            crit = mean_criterion(
                name, d.numpy(), margin=0.0, reason="difference from the baseline", role=Role.SECONDARY,
                **({"bounds": rng} if rng is not None else {"assumption": bounds.LOCATION_ASSUMPTION}),
            )  # fmt: skip
            st = compare(crit)
            mde = math.nan
            if st.outcome is Outcome.UNDECIDED and rng is not None and math.isfinite(st.estimate):
                sd = float(d.double().clamp(*rng).std())
                mde = bounds.min_detectable_effect(
                    cfg.seeds, lo=rng[0], hi=rng[1], margin=0.0, alpha=ALPHA, sd=sd, power=POWER, reps=MDE_REPS
                )
            words = ("larger", "smaller", "indistinguishable") if name == "update KL" else tuple(WORDS.values())
            verdict = dict(zip(WORDS, words, strict=True))[st.outcome]
            note = "" if st.method != "non-finite values" else "non-finite values (a run diverged)"
            out.append(EndpointResult(name, base, st.estimate, st.lower, st.upper, verdict, st.method, mde, note))
    return out


def reached_bounds(curves: Curves, cfg: CurveConfig) -> tuple[float, float]:
    """Clopper-Pearson bounds (level `ALPHA` each side) on the share of seeds reaching the threshold."""
    low, high = bounds.proportion_bounds(curves.reached, cfg.seeds, alpha=ALPHA)
    return float(low), float(high)
