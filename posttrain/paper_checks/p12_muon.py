"""Paper 12: When does Muon help agentic RL? (Ruan et al. 2026, arXiv:2607.16169).

Claim: at paired nominal rates (Muon's 30x AdamW's, the paper's 3e-5 vs 1e-6) fan-in Muon on the
hidden matrices reaches a much higher final-window success than AdamW, because it takes a larger
stable step: its hidden update RMS is several times AdamW's, an RMS-matched Muon control (rate /
rho) performs like AdamW, AdamW at Muon's nominal rate is much worse than Muon, and AdamW's success
is non-monotonic in its rate.

Abstract sentence tested (primary): "AdamW responds non-monotonically to rate, whereas fan-in Muon
remains stable at a more aggressive effective step: at 3e-5 it improves late success over an AdamW
1e-6 baseline after correction across rate-metric tests."

Toy (docs: methods/muon.md): the sparse-reward contextual bandit of `posttrain.simulators.mlp_bandit`
(64 contexts, 16 actions, 2 correct per context, MLP 32-64-64, SGD "pretraining" to a partial-
knowledge base), then GRPO with ``group_normalized_advantages`` and ``clipped_ratio_loss`` (a
single on-policy step, ratio 1, so the vanilla policy gradient) aggregated by token mean; hidden
matrices {W1, W2} on Muon or AdamW, fallback {E, W_o} always on AdamW 1e-4.

Simplifications (stated): the group std is Bessel-corrected with eps 1e-6 (the package's GRPO
convention; the spec's toy uses the population std, a constant factor sqrt(K/(K-1)) that Muon
ignores and Adam almost ignores); Newton-Schulz runs in float32 rather than bf16; every run of a
seed shares that seed's sampling noise (common random numbers), so comparisons are paired; actions
are drawn by inverse CDF from one uniform each (the simulators' ``sample_categorical``) instead of
Gumbel-max, the same distribution.

Primary endpoint: S(Muon 3e-2) - S(AdamW 1e-3) > 0.10 (the spec's margin) in most seeds, a quantile
claim with share 1/2 judged by the exact Clopper-Pearson bound (the spec's "every seed" read as
"in a typical seed"). Secondary: rho >= 3; the RMS-matched control within min(0.07, 0.35 gap) of
AdamW and its RMS ratio within [0.9, 1.1]; AdamW at Muon's rate 0.10 below Muon; AdamW
non-monotonic. Reported: tuned AdamW, and the primary with Newton-Schulz replaced by Frobenius
normalisation (``Hidden.MUON_FROBENIUS``).

Power plan: pilot seeds 10000-10015 (16 seeds): the primary's difference cleared 0.10 in 16/16
(mean 0.207, sd 0.041, min 0.120). The spec claims every seed (share ~1); we plan at the pilot
share's one-sided 97.5% Clopper-Pearson lower bound, P(d > 0.10) = 0.79 (taken as 0.8): 20 seeds
give 80% power (exact binomial; 12 seeds would give 56%).

Mutants: ``adamw-for-muon`` (AdamW, the baseline, in Muon's place at Muon's rate: contradicted on
the pilot seeds, mean difference +0.018, 3/16 seeds clear) and ``muon-at-adamw-rate`` (Muon without
its aggressive step: contradicted, -0.19). Replacing Newton-Schulz by Frobenius normalisation is NOT
a mutant: it still takes a step ~1.9x AdamW's RMS and clears the primary (pilot: 15/16 seeds, mean
+0.14), which agrees with the paper's reading that the effective step, not orthogonalisation,
carries the gain; it is reported beside the primary.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch
from torch import Tensor

from posttrain.estimators.optim import adamw_init, adamw_update, group_update_rms, muon_init, muon_update
from posttrain.paper_checks import register_check
from posttrain.paper_checks.cli import main_for
from posttrain.paper_checks.model import (
    MEDIAN,
    Metric,
    Mutant,
    PaperCheck,
    Result,
    Role,
    mean_criterion,
    quantile_criterion,
)
from posttrain.simulators._base import sample_categorical
from posttrain.simulators.loop import grpo_surrogate
from posttrain.simulators.mlp_bandit import MLPParams, exact_success, forward_logits, init_params, make_task, pretrain


class Hidden(StrEnum):
    """The update rule of the hidden matrices {W1, W2} (`_hidden_step`)."""

    MUON = "muon"  # momentum, Newton-Schulz-5 orthogonalisation, fan-in scale
    ADAMW = "adamw"
    MUON_FROBENIUS = "muon_frobenius"  # Muon with NS-5 replaced by U / ||U||_F (Newton-Schulz with 0 steps)


@dataclass(frozen=True)
class Config:
    seeds: int = 20  # power plan (module docstring): pilot 10000-10015, 16/16 clear; P = 0.8 -> 20 seeds, 80% power
    first_seed: int = 0  # evaluation seeds first_seed .. first_seed + seeds - 1; the pilot used 10_000 ..
    updates: int = 150  # spec toy (150 GRPO updates)
    pretrain_steps: int = 150  # spec toy (SGD pretraining to a partial-knowledge base)
    batch_contexts: int = 16  # spec toy (B = 16 contexts)
    group_size: int = 8  # spec toy (G = 8)
    window: int = 20  # spec toy (final window of 20 updates)
    fallback_lr: float = 1e-4  # spec toy (AdamW on E and W_o)
    adamw_lo: float = 1e-3  # spec toy: AdamW's rate, Muon's / 30 (the paper's 1e-6 vs 3e-5)
    muon_hi: float = 3e-2  # spec toy: Muon's rate, 30 x AdamW's (the paper's 3e-5 vs 1e-6)
    adamw_grid: tuple[float, ...] = (1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)  # spec toy (AdamW rate screen)
    tuned_grid: tuple[float, ...] = (3e-3, 1e-2)  # spec toy (tuned AdamW)
    weight_decay: float = 0.01  # paper (decoupled weight decay 0.01)
    rho_min: float = 3.0  # spec pass criterion 1 (the paper's 3.53 at Qwen's shapes)
    gain_margin: float = 0.10  # spec pass criterion 2 (Muon beats AdamW by >= 0.10 success)
    match_abs: float = 0.07  # spec pass criterion 3
    match_rel: float = 0.35  # spec pass criterion 3
    hi_adamw_gap: float = 0.10  # spec pass criterion 4
    nonmono_gap: float = 0.3  # spec pass criterion 5
    tuned_soft: float = 0.12  # spec criterion 6 (reported)
    margin_reason: str = "docs: methods/muon.md pass criteria (calibrated on our pilot; not tuned here)"
    substitute: tuple[tuple[Hidden, Hidden], ...] = ()  # mutants: (rule, stand-in) trains that rule's runs with another

    @classmethod
    def smoke(cls) -> Config:
        return cls(seeds=6)  # 6 seeds: the fewest at which "in most seeds" can hold (0.5^6 < 0.025)


def _train(
    base: MLPParams, correct: Tensor, seed_of_run: Tensor, hidden_lr: Tensor, *, rule: Hidden, cfg: Config
) -> tuple[Tensor, Tensor]:
    """GRPO on ``R`` runs at once; returns (success per update ``[R, U]``, hidden update RMS per update ``[R, U]``)."""
    rule = dict(cfg.substitute).get(rule, rule)
    muon = rule is not Hidden.ADAMW
    ns_steps = 0 if rule is Hidden.MUON_FROBENIUS else 5  # newton_schulz5 with 0 steps is U / ||U||_F
    params = list(base)
    r, contexts, actions = correct.shape
    # Common random numbers: each seed's draws for all updates, shared by that seed's runs.
    uniq = seed_of_run.unique()
    gens = [torch.Generator().manual_seed(int(s) + 30_000) for s in uniq.tolist()]
    n = cfg.batch_contexts * cfg.group_size
    ctx_all = torch.stack([torch.randint(contexts, (cfg.updates, cfg.batch_contexts), generator=g) for g in gens])
    u_all = torch.stack([torch.rand(cfg.updates, n, 1, generator=g) for g in gens])
    row = torch.searchsorted(uniq, seed_of_run)
    ctx_all = ctx_all[row].repeat_interleave(cfg.group_size, dim=-1)  # [R, U, n]
    u_all = u_all[row]  # [R, U, n, 1]: one uniform per sampled action
    hidden_state: Any = muon_init(params[1:3]) if muon else adamw_init(params[1:3])
    fallback_state = adamw_init([params[0], params[3]])
    success, rms = [], []
    for step in range(cfg.updates):
        ctx, u = ctx_all[:, step], u_all[:, step]
        leaf = [t.detach().requires_grad_(True) for t in params]
        logits = forward_logits(MLPParams(*leaf), ctx)  # [R, n, V]
        act = sample_categorical(logits, u).squeeze(-1)  # [R, n]
        logp = torch.log_softmax(logits, -1).gather(-1, act.unsqueeze(-1)).squeeze(-1)  # [R, n]
        reward = torch.gather(correct, 1, ctx.unsqueeze(-1).expand(r, n, actions)).gather(-1, act.unsqueeze(-1))
        loss = grpo_surrogate(logp, reward.squeeze(-1), group=cfg.group_size)
        grads = torch.autograd.grad(loss.mean(-1).sum(), leaf)
        with torch.no_grad():
            if muon:
                h_up, hidden_state = muon_update(
                    grads[1:3],
                    hidden_state,
                    params[1:3],
                    lr=hidden_lr,
                    weight_decay=cfg.weight_decay,
                    ns_steps=ns_steps,
                    compute_dtype=None,
                )
            else:
                h_up, hidden_state = adamw_update(
                    grads[1:3], hidden_state, params[1:3], lr=hidden_lr, weight_decay=cfg.weight_decay
                )
            f_up, fallback_state = adamw_update(
                (grads[0], grads[3]),
                fallback_state,
                (params[0], params[3]),
                lr=cfg.fallback_lr,
                weight_decay=cfg.weight_decay,
            )
            params = [params[0] + f_up[0], params[1] + h_up[0], params[2] + h_up[1], params[3] + f_up[1]]
            rms.append(group_update_rms(h_up))
            success.append(exact_success(MLPParams(*params), correct))
    return torch.stack(success, 1), torch.stack(rms, 1)


def _replicate(
    base: MLPParams, task_correct: Tensor, seeds: Tensor, lrs: Tensor
) -> tuple[MLPParams, Tensor, Tensor, Tensor]:
    """Runs = seeds x lrs (seed-major): replicated base weights, tasks, seed ids and rates ``[R]``."""
    k = lrs.shape[-1]
    rep = MLPParams(*(t.repeat_interleave(k, dim=0) for t in base))
    lr = lrs.reshape(-1) if lrs.ndim == 2 else lrs.repeat(seeds.shape[0])
    return rep, task_correct.repeat_interleave(k, dim=0), seeds.repeat_interleave(k), lr


def run(cfg: Config) -> Result:
    seeds = torch.arange(cfg.first_seed, cfg.first_seed + cfg.seeds)
    task = make_task(seeds)
    base = pretrain(init_params(seeds), task.prior_labels, seeds, steps=cfg.pretrain_steps)
    s_base = exact_success(base, task.correct)
    grid = torch.tensor(cfg.adamw_grid)
    p, c, sid, lr = _replicate(base, task.correct, seeds, grid)
    s_adam, rms_adam = _train(p, c, sid, lr, rule=Hidden.ADAMW, cfg=cfg)
    p, c, sid, lr = _replicate(base, task.correct, seeds, torch.tensor([cfg.muon_hi]))
    s_mhi, rms_mhi = _train(p, c, sid, lr, rule=Hidden.MUON, cfg=cfg)
    s_fhi, rms_fhi = _train(p, c, sid, lr, rule=Hidden.MUON_FROBENIUS, cfg=cfg)  # reported ablation

    final = lambda s: s[:, -cfg.window :].mean(-1)  # noqa: E731
    fa = final(s_adam).reshape(cfg.seeds, len(cfg.adamw_grid))
    ra = rms_adam.mean(-1).reshape(cfg.seeds, len(cfg.adamw_grid))
    col = {v: i for i, v in enumerate(cfg.adamw_grid)}
    s_alo, s_ahi = fa[:, col[cfg.adamw_lo]], fa[:, col[cfg.muon_hi]]
    s_m = final(s_mhi)
    rho = rms_mhi.mean(-1) / ra[:, col[cfg.adamw_lo]]
    s_f, rho_f = final(s_fhi), rms_fhi.mean(-1) / ra[:, col[cfg.adamw_lo]]

    p, c, sid, lr = _replicate(base, task.correct, seeds, (cfg.muon_hi / rho).unsqueeze(-1))
    s_match_t, rms_match = _train(p, c, sid, lr, rule=Hidden.MUON, cfg=cfg)
    s_match = final(s_match_t)
    match_rms_ratio = rms_match.mean(-1) / ra[:, col[cfg.adamw_lo]]
    s_tuned = fa[:, [col[v] for v in cfg.tuned_grid]].max(-1).values
    gap = s_m - s_alo
    dev = (s_match - s_alo).abs()

    t = lambda x: tuple(float(v) for v in x)  # noqa: E731
    metrics = (
        Metric("base success (exact)", t(s_base), note="calibration 0.35-0.41"),
        Metric(f"S(AdamW {cfg.adamw_lo:g})", t(s_alo)),
        Metric(f"S(Muon {cfg.muon_hi:g})", t(s_m)),
        Metric("S(Muon matched)", t(s_match)),
        Metric(f"S(AdamW {cfg.muon_hi:g}, Muon's rate)", t(s_ahi)),
        Metric("S(AdamW tuned)", t(s_tuned)),
        Metric("S(AdamW 1e-1)", t(fa[:, col[1e-1]])),
        Metric("rho = RMS(Muon)/RMS(AdamW)", t(rho), paper_value=3.53, note="toy shapes give ~10 (from the paper)"),
        Metric("matched RMS ratio", t(match_rms_ratio)),
        Metric(f"S(Muon-Frobenius {cfg.muon_hi:g})", t(s_f), note="NS-5 replaced by U / ||U||_F (reported)"),
        Metric("rho(Muon-Frobenius)", t(rho_f)),
    )
    why = cfg.margin_reason

    def every(name: str, d: Tensor, m: float, role: Role = Role.SECONDARY) -> Any:
        """The paper's "every seed" as the quantile claim "in most seeds" (share 1/2)."""
        return quantile_criterion(name, t(d), share=MEDIAN, margin=m, reason=why, role=role)

    comparisons = (
        every("rho - 3", rho - cfg.rho_min, 0.0),
        every("S(Muon hi) - S(AdamW lo)", gap, cfg.gain_margin, Role.PRIMARY),
        every("matched control within min(0.07, 0.35 gap) of AdamW", torch.minimum(cfg.match_abs - dev, cfg.match_rel * gap - dev), 0.0),
        every("matched RMS ratio within [0.9, 1.1]", 0.1 - (match_rms_ratio - 1).abs(), 0.0),
        every("S(Muon hi) - S(AdamW hi) > 0.10", s_m - s_ahi, cfg.hi_adamw_gap),
        every("AdamW non-monotonic: max grid - S(1e-1)", fa.max(-1).values - fa[:, col[1e-1]], cfg.nonmono_gap),
        quantile_criterion("S(Muon-Frobenius hi) - S(AdamW lo) (reported)", t(s_f - s_alo), share=MEDIAN,
                           margin=cfg.gain_margin, reason="the primary with Newton-Schulz replaced by Frobenius "
                           "normalisation: a larger normalised step without orthogonalisation", role=Role.CONTEXT),
        mean_criterion("tuned AdamW close: 0.12 - (S(Muon hi) - S(tuned)) (reported)", t(cfg.tuned_soft - (s_m - s_tuned)),
                       margin=0.0, reason=why, bounds=(cfg.tuned_soft - 1.0, cfg.tuned_soft + 1.0), role=Role.CONTEXT),
    )  # fmt: skip
    return Result(
        metrics, comparisons, extra={"success_curves_adamw": s_adam.tolist(), "success_curves_muon": s_mhi.tolist()}
    )


CHECK = register_check(
    PaperCheck(
        id="12",
        paper="Ruan et al. 2026, When does Muon help agentic RL?, arXiv:2607.16169",
        claim="Fan-in Muon beats AdamW at paired nominal rates through a larger update RMS; an RMS-matched control loses the gain",
        abstract=(
            "AdamW responds non-monotonically to rate, whereas fan-in Muon remains stable at a more aggressive "
            "effective step: at $3 \\times 10^{-5}$ it improves late success over an AdamW $10^{-6}$ baseline "
            "after correction across rate-metric tests."
        ),
        config_type=Config,
        run=run,
        mutants=(
            Mutant(
                "adamw-for-muon",
                "AdamW (the baseline) in Muon's place on the hidden matrices, at Muon's rate",
                lambda c: dataclasses.replace(c, substitute=((Hidden.MUON, Hidden.ADAMW),)),
            ),
            Mutant(
                "muon-at-adamw-rate",
                "Muon without its aggressive step: Muon at AdamW's rate (its update RMS then ~1/3 of AdamW's)",
                lambda c: dataclasses.replace(c, muon_hi=c.adamw_lo),
            ),
        ),
    )
)

if __name__ == "__main__":
    raise SystemExit(main_for(CHECK))
