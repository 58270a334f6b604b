"""Paper 16: Selective importance sampling keeps stale tokens useful (Li et al. 2026, arXiv:2607.04728).

Claim (abstract): "Experiments on dense and MoE LLMs across math and agent benchmarks show that SIS
consistently improves all objectives, while providing substantially stronger robustness under
off-policy data." SIS replaces the clipped token-level importance ratio of GRPO by a token-level
rejection test against the behaviour policy: accepted tokens are trained on-policy (weight 1,
unclipped), rejected ones keep the clipped ratio. The paper's baseline is clipped token IS (PPO clip).

Toy (docs: methods/sis.md): 16 prompts, a tabular autoregressive policy over sequences of length 2
from 8 tokens (9 context nodes x 8 logits per prompt). Per position the prompt's target token
scores 1, one wrong *decoy* token scores 1/2, the rest 0; reward = mean over the 2 positions, exact
E[r] by enumerating the 64 sequences. The policy starts sharp on the decoy (logit +3 at every node:
mu(decoy) = 0.74, mu(target) = 0.037), a partial-credit mode to escape. GRPO advantages (group
z-score, G = 8); plain SGD (lr 3 on the token-mean surrogate, scaled by 32), a fixed budget of 128
gradient steps. Off-policy degree N: each outer iteration samples N groups per prompt from the
current policy mu, then makes N sequential updates, each on one group of every prompt (so every
prompt's update n sees data n updates stale, as shared parameters make it in an LLM). Methods:
PPO clip 0.2 (the paper's baseline), SIS with K = V (exact envelope) and K = 4 (reported), and the
two corrections SIS sits between: no correction (ratio 1) and unclipped token IS (ratio rho).
Paired seeds: same targets, decoys and sampling noise across methods; the rejection uniforms come
from their own stream, so at N = 1 SIS and PPO are bit-identical.

Why this regime (the earlier toy, dense Hamming reward from a uniform start, let no correction
(+0.153) and unclipped IS (+0.186) beat SIS (+0.127) over PPO at N = 16: stale gradients were
harmless there, so the check could not tell SIS from either). Here stale data hurt: with the
group baseline frozen at mu's mean, uncorrected updates keep pushing the decoy (positive stale
advantage, weight 1 whatever pi has become) and keep squeezing the suppressed tokens' mass onto it
(the decoy's share of the final policy shows it); unclipped IS weights the target by rho up to
1/mu(target) ~ 27, a high-variance step; PPO clip stops both after a 20% ratio move and wastes the
rest of the stale batch. SIS accepts the token pi moved toward (rho at the envelope, weight 1) and
rejects, with probability 1 - rho/M, the tokens pi moved away from, which then get PPO's clip. The
regime was chosen on pilot seeds only (10000-10015, never the evaluation seeds) from a grid (decoy
reward 0.3/0.5, decoy logit 2/3, lr 2/3/4, N 16/32) as one where both no correction and unclipped
IS fall below PPO at N = 16 (docs: methods/sis.md, "Regime map", seeds 10000-10007). Where they do,
SIS's margin over PPO is modest (+0.00 to +0.09) and shrinks as lr grows; at lr 2 all three beat
PPO, and then only PPO's waste is shown.

SIS is the released form (`posttrain.estimators.importance.acceptance`): no top-K membership rule;
with K = V the acceptance test is exact rejection sampling.

Simplifications: none beyond the toy; SIS is applied through
`posttrain.estimators.losses.offpolicy.sis_loss` exactly as in an LLM trainer.

Primary endpoint: SIS - PPO at N = 16 > 0 in most seeds (quantile, share 1/2, Clopper-Pearson):
the abstract's "consistently improves ... under off-policy data" as a per-seed claim. With SIS and
PPO bit-identical at N = 1, the robustness gap [PPO(1) - PPO(16)] - [SIS(1) - SIS(16)] is the same
number, so one criterion tests both halves of the sentence.
Power plan: the paper reports no effect size (numbers not available). Pilot (this module, seeds
10000-10015): at N = 16 PPO 0.771, SIS 0.805, SIS - PPO +0.034 (sd 0.030), 15/16 seeds positive;
no correction -0.107 (0/16), unclipped IS -0.011 (5/16); at N = 8 SIS - PPO -0.020 (7/16). Planned
per-seed share 0.8 (below the pilot's 15/16, against its winner's curse): `seeds_for_share` gives 80%
power from 23 seeds on (exact binomial): 23 evaluation seeds (0-22).
Secondary: SIS - PPO at N = 16, paired mean > 0 on [-1, 1] (a reward difference; the mean claim,
underpowered at these seeds: reported with its bound); SIS - PPO at N = 8 in most seeds; SIS == PPO
bit-identical at N = 1. Reported: K = 4, no correction, unclipped IS (each - PPO at N = 16), accept
rates, D_orig and D_sis (the released diagnostics; D_sis <= D_orig holds for any loss, so it is no
criterion), the decoy's and the target's share of every final policy.

Mutants (SIS's loss replaced in its arm): PPO clip; no correction; unclipped token IS. Each must not
be called reproduced: the first is the baseline itself, the other two are the corrections the toy
must tell SIS from.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import torch
from torch import Tensor

from posttrain.estimators import (
    clipped_ratio_loss,
    group_normalized_advantages,
    masked_mean,
    no_correction_loss,
    sis_accept,
    sis_acceptance_prob,
    sis_loss,
    truncated_is_loss,
)
from posttrain.estimators.importance import sis_divergence
from posttrain.paper_checks import register_check
from posttrain.paper_checks.cli import main_for
from posttrain.paper_checks.model import (
    MEDIAN,
    Metric,
    Mutant,
    PaperCheck,
    Result,
    Role,
    exact_criterion,
    mean_criterion,
    quantile_criterion,
)
from posttrain.simulators import SeedRNG, TabularSpec, enumerate_sequences, sample_sequences, sequence_logp, token_logp
from posttrain.simulators.tabular import visited_logit_rows

__all__ = ["CHECK", "Config", "Method", "run"]


class Method(StrEnum):
    """The compared policy losses; the SIS variants differ in the rejection test's top-K (`Method.top_k`)."""

    PPO = "ppo"
    SIS = "sis"
    SIS_K4 = "sis_k4"
    NO_CORRECTION = "no_correction"
    UNCLIPPED_IS = "unclipped_is"

    @property
    def is_sis(self) -> bool:
        return self in (Method.SIS, Method.SIS_K4)

    def top_k(self, vocab: int) -> int:
        """The rejection test's K: 4 for SIS_K4, the whole vocabulary (the exact envelope) otherwise."""
        return 4 if self is Method.SIS_K4 else vocab


M = Method
REWARD = (-1.0, 1.0)  # a difference of two expected rewards in [0, 1]
PILOT = "pilot seeds 10000-10015: SIS - PPO at N = 16 +0.034 (sd 0.030), 15/16 seeds positive"


@dataclass(frozen=True)
class Config:
    seeds: int = 23  # power plan (pilot seeds 10000-10015, 15/16 positive; planned share 0.8 -> 23 seeds)
    first_seed: int = 0  # evaluation seeds first_seed .. first_seed + seeds - 1; the pilot used 10_000 ..
    num_prompts: int = 16  # toy; every update holds one group of every prompt
    vocab: int = 8  # spec
    horizon: int = 2  # toy (spec 3: with 2 positions each position's credit is less confounded)
    group: int = 8  # paper (8 responses per prompt)
    decoy_reward: float = 0.5  # regime map (docs: methods/sis.md): partial credit of the decoy token
    decoy_logit: float = 3.0  # regime map: initial logit of the decoy at every node (sharp behaviour policy)
    lr: float = 3.0  # regime map (spec 0.5): a step size at which stale gradients hurt
    grad_steps: int = 128  # spec (120), rounded to a multiple of every N
    grad_scale: float = 32.0  # spec
    clip: float = 0.2  # paper baseline (PPO clip 0.2)
    degrees: tuple[int, ...] = (1, 8, 16)  # paper N in {4, 8, 16}; N = 1 for the on-policy identity
    context: tuple[Method, ...] = (M.SIS_K4, M.NO_CORRECTION, M.UNCLIPPED_IS)  # reported at the largest N
    margin_reason: str = "the abstract: SIS improves on clipped token IS under off-policy data (no size claimed)"
    substitute: tuple[tuple[Method, Method], ...] = ()  # mutants: (arm, loss) trains the arm with another loss

    @classmethod
    def smoke(cls) -> Config:
        return cls(seeds=6, degrees=(1, 16), context=(), grad_steps=64)

    @classmethod
    def mutant_test(cls) -> Config:
        """The smallest config at which SIS is reproduced (the mutant test runs each mutant beside it)."""
        return cls(degrees=(16,), context=())

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))


def _policy_loss(method: Method, config: Config) -> Callable[..., Tensor]:
    """``(logp, logp_old, adv, mask, accepted) -> loss [B, T]`` for each compared method."""
    eps = config.clip
    table: dict[Method, Callable[..., Tensor]] = {
        M.PPO: lambda lp, lo, a, m, acc: clipped_ratio_loss(lp, lo, a, m, clip_low=eps, clip_high=eps)[0],
        M.SIS: lambda lp, lo, a, m, acc: sis_loss(lp, lo, a, m, acc, clip_low=eps, clip_high=eps, divergence=False)[0],
        M.NO_CORRECTION: lambda lp, lo, a, m, acc: no_correction_loss(lp, lo, a, m),
        M.UNCLIPPED_IS: lambda lp, lo, a, m, acc: truncated_is_loss(lp, lo, a, m, cap=math.inf),
    }
    table[M.SIS_K4] = table[M.SIS]
    return table[method]


@dataclass(frozen=True)
class _Env:
    """Targets and decoys ``[S, P, L]`` of every seed, the decoy-sharp initial table, exact position scores."""

    spec: TabularSpec
    targets: Tensor
    decoys: Tensor
    init: Tensor
    decoy_reward: float

    @classmethod
    def make(cls, config: Config) -> _Env:
        spec = TabularSpec(vocab=config.vocab, horizon=config.horizon)
        u = SeedRNG.from_seeds(config.seed_list, stream=16).rand(config.num_prompts, 2, config.horizon)
        v = config.vocab
        targets = (u[:, :, 0] * v).long().clamp(max=v - 1)
        decoys = (targets + 1 + (u[:, :, 1] * (v - 1)).long().clamp(max=v - 2)) % v  # a wrong token per position
        depth = torch.zeros(spec.num_nodes, dtype=torch.long)
        for t in range(1, config.horizon):  # tree nodes of depth t start at (V^t - 1) / (V - 1)
            depth[(v**t - 1) // (v - 1) :] = t
        init = torch.zeros(config.seeds, config.num_prompts, spec.num_nodes, v, dtype=torch.float64)
        init.scatter_(-1, decoys[..., depth].unsqueeze(-1), config.decoy_logit)
        return cls(spec, targets, decoys, init, config.decoy_reward)

    def scores(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """``tokens [S, P, K, L]`` -> (target hits, decoy hits) per position, ``[S, P, K, L]`` floats."""
        hit = (tokens == self.targets.unsqueeze(-2)).to(torch.float64)
        return hit, (tokens == self.decoys.unsqueeze(-2)).to(torch.float64)

    def reward(self, tokens: Tensor) -> Tensor:
        hit, decoy = self.scores(tokens)
        return (hit + self.decoy_reward * decoy).mean(-1)

    def exact(self, theta: Tensor) -> dict[str, Tensor]:
        """``[S]`` exact E[r] and the expected shares of target and decoy positions, averaged over prompts."""
        seqs, _ = enumerate_sequences(self.spec)
        hit, decoy = self.scores(seqs.expand(*self.targets.shape[:2], *seqs.shape))
        prob = sequence_logp(self.spec, theta).exp()  # [S, P, N_seq]
        ev = {"reward": (hit + self.decoy_reward * decoy).mean(-1), "target": hit.mean(-1), "decoy": decoy.mean(-1)}
        return {k: (prob * x).sum(-1).mean(-1) for k, x in ev.items()}


def _acceptance(env: _Env, mu: Tensor, theta: Tensor, tok: Tensor, logp: Tensor, logp_old: Tensor, k: int) -> Tensor:
    """``[B, L]`` SIS acceptance probabilities against the behaviour's top-``k`` at each visited node (no grad)."""
    spec, shape = env.spec, (-1, env.spec.horizon, env.spec.vocab)
    old_rows = torch.log_softmax(visited_logit_rows(spec, mu, tok), -1).reshape(shape)
    cur_rows = torch.log_softmax(visited_logit_rows(spec, theta.detach(), tok), -1).reshape(shape)
    if k < spec.vocab:
        idx = old_rows.topk(k, dim=-1).indices
        old_rows, cur_rows = old_rows.gather(-1, idx), cur_rows.gather(-1, idx)
    return sis_acceptance_prob(logp.detach(), logp_old, cur_rows, old_rows)


def _train(config: Config, method: Method, degree: int, env: _Env) -> dict[str, Tensor]:
    """One method at one off-policy degree for all seeds at once; returns exact final metrics and diagnostics."""
    spec, s, p, k = env.spec, config.seeds, config.num_prompts, config.group
    loss_fn = _policy_loss(method, config)
    sample_rng = SeedRNG.from_seeds(config.seed_list, stream=0)
    u_rng = SeedRNG.from_seeds(config.seed_list, stream=2)
    theta = env.init.clone().requires_grad_(True)  # [S, P, nodes, V]
    accept, d_orig, d_sis = [], [], []
    for _ in range(config.grad_steps // degree):
        with torch.no_grad():  # rollout: N groups of every prompt from the current policy mu
            mu = theta.detach().clone()
            tokens, mask, _ = sample_sequences(spec, mu, k * degree, sample_rng)  # [S, P, N*G, L]
            logp_old_all = token_logp(spec, mu, tokens)
            rewards = env.reward(tokens).reshape(s, p, degree, k)
            adv = group_normalized_advantages(rewards.reshape(-1, k)).reshape(s, p, degree, k)
        for n in range(degree):  # N sequential updates, update n on every prompt's n-th group
            rows = slice(n * k, (n + 1) * k)
            tok, flat_mask = tokens[:, :, rows], mask[:, :, rows].reshape(-1, spec.horizon)
            logp = token_logp(spec, theta, tok).reshape(-1, spec.horizon)
            logp_old = logp_old_all[:, :, rows].reshape(-1, spec.horizon)
            acc = None
            if method.is_sis:  # the rejection test against mu's top-K at each visited node (no grad)
                a = _acceptance(env, mu, theta, tok, logp, logp_old, method.top_k(spec.vocab))
                acc = sis_accept(a, u_rng.rand(p * k, spec.horizon).reshape(-1, spec.horizon))
                with torch.no_grad():
                    d_o, d_s = sis_divergence(
                        logp, logp_old, acc, flat_mask, clip_low=config.clip, clip_high=config.clip
                    )
                    accept.append(masked_mean(acc.to(torch.float64).reshape(s, -1), flat_mask.reshape(s, -1), dim=-1))
                    d_orig.append(d_o.reshape(s, -1).mean(-1))
                    d_sis.append(d_s.reshape(s, -1).mean(-1))
            loss = loss_fn(logp, logp_old, adv[:, :, n].reshape(-1), flat_mask, acc)
            per_seed = masked_mean(loss.reshape(s, -1), flat_mask.reshape(s, -1), dim=-1)
            (grad,) = torch.autograd.grad(per_seed.sum(), theta)
            with torch.no_grad():
                theta -= config.lr * config.grad_scale * grad
    with torch.no_grad():
        out = env.exact(theta.detach())
    if accept:
        out |= {"accept": torch.stack(accept).mean(0), "d_orig": torch.stack(d_orig).mean(0),
                "d_sis": torch.stack(d_sis).mean(0)}  # fmt: skip
    return out


def run(config: Config) -> Result:
    env = _Env.make(config)
    stand_in = dict(config.substitute)
    n_max = max(config.degrees)
    arms = [(m, n) for n in config.degrees for m in (M.PPO, M.SIS)] + [(m, n_max) for m in config.context]
    out: dict[tuple[Method, int], dict[str, Tensor]] = {}
    metrics = []
    for method, degree in arms:
        out[method, degree] = r = _train(config, stand_in.get(method, method), degree, env)
        note = PILOT if (method, degree) in ((M.PPO, 16), (M.SIS, 16)) else ""
        metrics.append(Metric(f"reward {method} N={degree}", tuple(r["reward"].tolist()), note=note))
        if degree == n_max:
            metrics += [
                Metric(f"{key} share {method} N={degree}", tuple(r[key].tolist())) for key in ("decoy", "target")
            ]
        metrics += [Metric(f"{key} {method} N={degree}", tuple(r[key].tolist())) for key in ("accept", "d_orig", "d_sis")
                    if key in r]  # fmt: skip

    def diff(a: Method, b: Method, n: int) -> np.ndarray:
        return (out[a, n]["reward"] - out[b, n]["reward"]).numpy()

    reason, comps = config.margin_reason, []
    if 1 in config.degrees:
        same = float(torch.equal(out[M.SIS, 1]["reward"], out[M.PPO, 1]["reward"]))
        comps.append(
            exact_criterion(
                "SIS == PPO bit-identical at N=1 (1 = yes)",
                (same,),
                margin=0.5,
                reason="a bit-identity flag of the whole run (every update on-policy, u from its own stream)",
            )
        )
    for degree in (n for n in config.degrees if n > 1):
        primary = degree == n_max
        gain = diff(M.SIS, M.PPO, degree)
        comps.append(quantile_criterion(f"SIS - PPO, N={degree}", gain, margin=0.0, share=MEDIAN, reason=reason,
                                        role=Role.PRIMARY if primary else Role.SECONDARY))  # fmt: skip
        if primary:
            comps.append(mean_criterion(f"SIS - PPO, N={degree} (paired mean)", gain, margin=0.0, bounds=REWARD,
                                        reason=reason))  # fmt: skip
    for other in config.context:
        comps.append(mean_criterion(f"{other} - PPO, N={n_max}", diff(other, M.PPO, n_max), margin=0.0,
                                    reason="context, reported", bounds=REWARD, role=Role.CONTEXT))  # fmt: skip
    return Result(tuple(metrics), tuple(comps), notes=PILOT)


def _replace_sis(loss: Method) -> Callable[[Config], Config]:
    return lambda c: dataclasses.replace(c, substitute=((M.SIS, loss),))


CHECK = register_check(
    PaperCheck(
        id="16",
        paper="Li et al. 2026, Selective Importance Sampling, arXiv:2607.04728",
        claim="SIS beats clipped token IS when updates are off-policy (N = 16) and equals it on-policy",
        abstract=(
            "Experiments on dense and MoE LLMs across math and agent benchmarks show that SIS consistently improves "
            "all objectives, while providing substantially stronger robustness under off-policy data."
        ),
        config_type=Config,
        run=run,
        mutants=(
            Mutant("ppo-for-sis", "the clipped token-level ratio (the baseline PPO loss) in SIS's place",
                   _replace_sis(M.PPO), test_config=Config.mutant_test),
            Mutant("no-correction-for-sis", "no off-policy correction at all (ratio 1 for every token) in SIS's place",
                   _replace_sis(M.NO_CORRECTION), test_config=Config.mutant_test),
            Mutant("unclipped-is-for-sis", "unclipped token-level IS (weight rho, no clip) in SIS's place",
                   _replace_sis(M.UNCLIPPED_IS), test_config=Config.mutant_test),
        ),
    )
)  # fmt: skip

if __name__ == "__main__":
    raise SystemExit(main_for(CHECK))
