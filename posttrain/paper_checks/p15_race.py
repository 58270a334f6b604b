"""Paper 15 — RACE: at a fixed FLOP budget the best search/learning split moves with model size and feedback.

Claim (Wilhelm, Kao 2026, "Where Should RL Post-Training Compute Go?", arXiv:2607.13389): splitting
GRPO compute into search (rollouts), learning (updates) and feedback (reward model) shows a
conditional frontier — both search-heavy and update-heavy allocations lose at equal FLOPs, larger
policies prefer a higher update fraction ``p`` (they buy fewer steps per FLOP), and charging a
reward model's FLOPs moves the best ``p`` down.

Toy (docs: methods/race.md): (a) the hand-computed accounting cases, asserted to 1e-12 relative error;
(b) a simulated GRPO bandit: 128 prompts x 16 answers (answer 0 correct), tabular softmax policy;
"model size" ``N in {1, 3, 14}`` (relative units) sets the FLOPs per token and the prior quality
``z[p, 0] = c_0(N) + N(0, 1)`` (other logits 0); per step 16 prompts, ``G`` rollouts each,
max-variance down-sampling to one correct + one wrong rollout (prompt skipped if all rewards are
equal), update ``z_p += 0.5 lr (e_correct - e_wrong)``. Accounting with one token per rollout via
`posttrain.theory.race_flops.flops_per_step` (full fine-tuning, rule reward or a PRM of size
14); ``U = floor(C / C_step)`` steps at ``C = 4e5``. Metric: mean probability of the correct answer.

Simplifications: model size is only a FLOP multiplier plus a prior-quality offset (no capacity);
the down-sampled pair is charged even when a prompt is skipped (the planned ``k = 2``). Orderings
of argmaxes are single events over seed means, recorded as +1/-1 differences. The RACE fit
(`posttrain.theory.race_fit.race_fit` on the 5-point frontier of each condition) is reported,
not asserted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posttrain.paper_checks import register_check
from posttrain.paper_checks.base import Comparison, Metric, PaperCheck, Result, exact_criterion, mean_criterion
from posttrain.theory.race_fit import race_fit
from posttrain.theory.race_flops import PolicyCost, RewardCost, RewardKind, flops_per_step

SIZES = {"S": (1.0, -3.0), "M": (3.0, -1.5), "L": (14.0, 0.0)}
CONDITIONS = (("S", "rule"), ("M", "rule"), ("L", "rule"), ("M", "prm"), ("L", "prm"))


@dataclass(frozen=True)
class Config:
    prompts: int = 128
    answers: int = 16
    batch_prompts: int = 16
    trained_per_prompt: int = 2
    lr: float = 0.5
    budget: float = 4e5
    prm_params: float = 14.0
    grid: tuple[int, ...] = (2, 4, 8, 16, 32)
    seeds: int = 16
    seed: int = 0

    @classmethod
    def smoke(cls) -> Config:
        return cls(seeds=8, budget=2e5)


def _step_split(config: Config, n: float, group: int, reward: str) -> tuple[float, float]:
    """(FLOPs of one step, update fraction p) from the accounting functions (1 token per rollout)."""
    b, k = config.batch_prompts, group
    trained = np.zeros((b, k), dtype=bool)
    trained[:, : config.trained_per_prompt] = True
    rc = RewardCost(RewardKind.MODEL, n_params=config.prm_params) if reward == "prm" else RewardCost()
    split = flops_per_step(np.zeros(b), np.ones((b, k)), trained, policy=PolicyCost(n), reward=rc)
    return split.total, split.p


def _accounting_errors() -> list[float]:
    """Relative errors of our hand-computed cases (section 7a)."""
    tp, tr = np.full(2, 100.0), np.full((2, 4), 50.0)
    full = flops_per_step(tp, tr, policy=PolicyCost(1e9))
    lora = flops_per_step(tp, tr, policy=PolicyCost(1e9, n_lora=1e7, lora=True), ref_forward=True)
    prm = flops_per_step(tp, tr, policy=PolicyCost(1e9), reward=RewardCost(RewardKind.MODEL, n_params=7e9))
    pairs = [
        (full.search, 1.2e12),
        (full.learning, 7.2e12),
        (full.reward, 0.0),
        (full.p, 7.2 / 8.4),
        (lora.learning, 7.272e12),
        (prm.reward, 1.68e13),
    ]
    return [abs(a - b) / max(abs(b), 1.0) for a, b in pairs]


def _simulate(config: Config, size: str, group: int, steps: int, rng: np.random.Generator) -> np.ndarray:
    """Run ``steps`` GRPO steps for every seed at once; returns ``[seeds]`` mean P(correct)."""
    s, p, m, b = config.seeds, config.prompts, config.answers, config.batch_prompts
    z = np.zeros((s, p, m))
    z[:, :, 0] = SIZES[size][1] + rng.standard_normal((s, p))
    rows = np.arange(s)[:, None]
    for _ in range(steps):
        prompts = np.argsort(rng.random((s, p)), axis=1)[:, :b]  # [S, B] without replacement
        logits = z[rows, prompts]  # [S, B, M]
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        cdf = np.cumsum(probs / probs.sum(axis=-1, keepdims=True), axis=-1)
        u = rng.random((s, b, group))
        answers = np.minimum((u[..., None] > cdf[:, :, None, :]).sum(axis=-1), m - 1)  # [S, B, G]
        correct = answers == 0
        mixed = correct.any(axis=-1) & (~correct).any(axis=-1)  # [S, B]
        pick = np.argmax(np.where(~correct, rng.random((s, b, group)), -1.0), axis=-1)
        wrong = np.take_along_axis(answers, pick[..., None], axis=-1)[..., 0]  # [S, B]
        step = 0.5 * config.lr * mixed
        z[rows, prompts, 0] += step
        z[rows, prompts, wrong] -= step
    probs = np.exp(z - z.max(axis=-1, keepdims=True))
    return np.asarray((probs[..., 0] / probs.sum(axis=-1)).mean(axis=-1))


def run(config: Config) -> Result:
    rng = np.random.default_rng(config.seed)
    grid = list(config.grid)
    acc: dict[tuple[str, str], np.ndarray] = {}
    p_of: dict[tuple[str, str], list[float]] = {}
    steps_of: dict[tuple[str, str], list[int]] = {}
    for size, reward in CONDITIONS:
        rows, ps, us = [], [], []
        for group in grid:
            c_step, p = _step_split(config, SIZES[size][0], group, reward)
            u = int(config.budget // c_step)
            rows.append(_simulate(config, size, group, u, rng))
            ps.append(p)
            us.append(u)
        acc[(size, reward)] = np.stack(rows, axis=1)  # [seeds, |grid|]
        p_of[(size, reward)], steps_of[(size, reward)] = ps, us

    metrics: list[Metric] = []
    comparisons: list[Comparison] = []
    errs = _accounting_errors()
    metrics.append(Metric("accounting max relative error (7a)", (max(errs),)))
    comparisons.append(
        exact_criterion(
            "1e-12 - accounting relative error", (1e-12 - max(errs),), margin=0.0,
            reason="criterion 1: closed-form FLOP accounting against its hand count (deterministic)",
        )
    )  # fmt: skip

    def best(key: tuple[str, str]) -> int:
        return int(np.argmax(acc[key].mean(axis=0)))

    for key in CONDITIONS:
        label = f"{key[0]} {key[1]}"
        for j, group in enumerate(grid):
            metrics.append(Metric(f"P(correct) {label} G={group} (p={p_of[key][j]:.2f})", tuple(acc[key][:, j])))
        metrics.append(Metric(f"best p {label}", (p_of[key][best(key)],)))
        fit = race_fit(np.asarray(p_of[key]), acc[key].mean(axis=0))  # reported only: the RACE diagnostic
        metrics.append(
            Metric(f"RACE quadratic p_opt {label} ({fit.regime}, best fit {fit.best_model.value})", (fit.p_opt,))
        )

    selected = "the grid points are the argmax of the seed-mean curves; the paired rows test them over seeds"

    def order(name: str, gap: float, reason: str) -> Comparison:
        return exact_criterion(name, (gap,), margin=0.0, reason=f"{reason}: {selected}")

    bs, bl = best(("S", "rule")), best(("L", "rule"))
    comparisons.append(order("argmax G of S - argmax G of L", grid[bs] - grid[bl], "criterion 2"))
    a_s, a_l = acc[("S", "rule")], acc[("L", "rule")]
    comparisons.append(
        mean_criterion(
            "S: acc(G*_S) - acc(G*_L)", a_s[:, bs] - a_s[:, bl], margin=0.0,
            reason="criterion 2 (paired over seeds; t interval above 0 instead of 3 SE)",
        )
    )  # fmt: skip
    comparisons.append(
        mean_criterion(
            "L: acc(G*_L) - acc(G*_S)", a_l[:, bl] - a_l[:, bs], margin=0.0,
            reason="criterion 2: the larger policy prefers its own optimum (paired over seeds)",
        )
    )  # fmt: skip
    for size in ("S", "M", "L"):
        a = acc[(size, "rule")]
        worst = int(np.argmin(a.mean(axis=0)))
        comparisons.append(
            Comparison(
                f"{size}: acc(G*) - min_G acc",
                tuple(a[:, best((size, "rule"))] - a[:, worst]),
                margin_reason="criterion 3: non-trivial frontier",
            )
        )
    a_m, bm = acc[("M", "rule")], best(("M", "rule"))
    for end in (0, len(grid) - 1):
        comparisons.append(
            Comparison(
                f"M: acc(G*) - acc(G={grid[end]})",
                tuple(a_m[:, bm] - a_m[:, end]),
                margin_reason="criterion 3: both ends of the grid lose for M",
            )
        )
    p_rule_m, p_prm_m = p_of[("M", "rule")][bm], p_of[("M", "prm")][best(("M", "prm"))]
    p_rule_l, p_prm_l = p_of[("L", "rule")][bl], p_of[("L", "prm")][best(("L", "prm"))]
    comparisons.append(order("p*_rule(M) - p*_PRM(M)", p_rule_m - p_prm_m, "criterion 4"))
    a_mp, bmp = acc[("M", "prm")], best(("M", "prm"))
    comparisons.append(
        mean_criterion(
            "M PRM: acc(G*_PRM) - acc(G*_rule)", a_mp[:, bmp] - a_mp[:, bm], margin=0.0,
            reason="criterion 4: with PRM FLOPs charged, M prefers its lower-p optimum (paired over seeds)",
        )
    )  # fmt: skip
    comparisons.append(
        order("p*_rule(L) - p*_PRM(L) (>= 0)", p_rule_l - p_prm_l + 1e-12, "criterion 4, '<=' only (near tie)")
    )
    u_s, u_l = np.asarray(steps_of[("S", "rule")]), np.asarray(steps_of[("L", "rule")])
    comparisons.append(
        exact_criterion(
            "min over G of U_S - 10 U_L (>= 0)", (float(np.min(u_s - 10 * u_l)) + 0.5,), margin=0.0,
            reason="criterion 5: integer step counts from the closed-form accounting (deterministic)",
        )
    )  # fmt: skip
    series = {
        "P(correct) vs rollouts per prompt at equal FLOPs": {
            "x": grid,
            "lines": {f"{k[0]} {k[1]}": acc[k].mean(axis=0).tolist() for k in CONDITIONS},
            "xlabel": "G (rollouts per prompt)",
            "ylabel": "mean P(correct)",
            "logx": True,
        },
        "update fraction p vs G": {
            "x": grid,
            "lines": {f"{k[0]} {k[1]}": p_of[k] for k in CONDITIONS},
            "xlabel": "G (rollouts per prompt)",
            "ylabel": "p = C_learning / C_total",
            "logx": True,
        },
    }
    return Result(
        tuple(metrics), tuple(comparisons), extra={"series": series, "steps": {str(k): v for k, v in steps_of.items()}}
    )


register_check(
    PaperCheck(
        id="15",
        paper="Wilhelm, Kao 2026, Where Should RL Post-Training Compute Go?, arXiv:2607.13389",
        claim="at equal FLOPs the best search/update split is interior, shifts to higher p for larger "
        "policies and to lower p when reward-model FLOPs are charged",
        config_type=Config,
        run=run,
    )
)
