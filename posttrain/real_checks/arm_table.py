"""The suite's arms, each declared once (an experiment names the arms it compares; shared arms run once per seed).

Sizes are the profile's (``full``: SmolLM2-135M-Instruct, G = 4 prompts x K = 8 samples a step, 16 steps,
lr 1e-5); an arm states only what differs. Equal budgets are kept by construction: the oracle arms
sample ``K = 8`` rows and append the oracle row (``group_size: 9``); RAIL's 4 fresh samples plus 4
branches equal GRPO's 8 rollouts; ES's ``population x prompts x steps`` = 8 x 4 x 16 = 512 answers equal
GRPO's 4 x 8 x 16 (matched samples); the off-policy arms train every step at ``STALENESS``.
"""

from __future__ import annotations

from typing import Any

from posttrain.real_checks.arms import Arm, Kind

__all__ = ["ARMS", "BUDGETS", "SPLITS", "STALENESS", "arm"]

STALENESS = 4
"""``rollout.staleness`` of the off-policy arms (16 and 02): a quarter of the run's 16 steps."""


BUDGETS = (50, 100, 200)
"""03's annotation budgets, in percent of the profile's RL budget (steps x G problems: 64 in ``full``)."""
SPLITS = (0, 50, 100)
"""03's shares of a budget given to SFT, in percent (the rest is RL prompts)."""


def _half_steps(tree: dict[str, Any]) -> int:
    return int(tree["optim"]["steps"]) // 2


def _split(budget: int, share: int) -> dict[str, Any]:
    """03's overrides: ``share``% of ``budget``% of the profile's RL problems as SFT examples, the rest as RL prompts."""

    def problems(t: dict[str, Any]) -> float:
        return budget / 100 * int(t["optim"]["steps"]) * int(t["data"]["prompts_per_step"])

    def sft_steps(t: dict[str, Any]) -> int:
        return max(1, round(problems(t) * share / 100 / int(t["data"]["sft_batch_size"]))) if share else 0

    def rl_steps(t: dict[str, Any]) -> int:
        return max(1, round(problems(t) * (100 - share) / 100 / int(t["data"]["prompts_per_step"])))

    return {"data.sft_batch_size": 8, "data.sft_lr": 1e-5, "data.sft_steps": sft_steps, "optim.steps": rl_steps}


def _branching(tree: dict[str, Any]) -> dict[str, Any]:
    return {"branches": int(tree["rollout"]["group_size"]) // 2, "shadow_steps": 2}


_RAW: tuple[Arm, ...] = (
    # the base model and the shared GRPO baseline (also SAR's edit source)
    Arm("base", kind=Kind.BASE),
    Arm("grpo", keep_model=True),
    # teachers: GRPO at twice the steps, one fixed seed (part of the setting)
    Arm("teacher_add", fixed_seed=True, steps_scale=2, keep_model=True),
    Arm("teacher_mul", task="mul", fixed_seed=True, steps_scale=2, keep_model=True),
    # 01 / 13: distillation from the GRPO teacher
    Arm("opd_then_rl", teacher="teacher_add",
        overrides={"algorithm.method": "opd_then_rl", "algorithm.options": lambda t: {"switch_step": _half_steps(t)}}),
    Arm("opd", teacher="teacher_add",
        overrides={"algorithm.method": "opd_then_rl", "algorithm.options": lambda t: {"switch_step": t["optim"]["steps"]}}),
    Arm("opd2", teacher="teacher_add", overrides={"algorithm.method": "opd2", "algorithm.topk": 64}),
    Arm("opd2_no_delta", teacher="teacher_add",
        overrides={"algorithm.method": "opd2", "algorithm.topk": 64, "algorithm.options": {"use_delta": False}}),
    # 04: Self-Routing with the gold answer as the self-teacher's context
    Arm("self_routing", overrides={"algorithm.method": "self_routing"}),
    # 05 / 10 / 14: coverage at matched samples
    Arm("es", kind=Kind.ES,
        overrides={"es.population": 8, "es.prompts_per_step": 4, "es.sigma": 1e-3, "es.lr": 5e-4,
                   "es.steps": lambda t: t["optim"]["steps"]}),
    Arm("gflowrl", overrides={"algorithm.method": "gflowrl"}),
    # 16: stale rollouts, three corrections
    Arm("grpo_stale", overrides={"rollout.staleness": STALENESS}),
    Arm("sis_stale", overrides={"rollout.staleness": STALENESS, "algorithm.method": "sis"}),
    Arm("tis_stale", overrides={"rollout.staleness": STALENESS, "algorithm.rollout_correction": {"mode": "token_truncate"}}),
    # 02: replay of stored groups at equal fresh rollouts
    Arm("hdr", overrides={"rollout.replay": {"rule": "hdr", "k_rep": 2, "capacity": 8}}),
    Arm("naive_replay", overrides={"rollout.replay": {"rule": "naive_recency", "k_rep": 2, "capacity": 8}}),
    # 07: oracle rows (8 samples + the gold answer), partial credit and binary
    Arm("grpo_partial", task="add_partial"),
    Arm("orarl", task="add_partial",
        overrides={"algorithm.method": "orarl", "rollout.oracle": {}, "rollout.group_size": 9}),
    Arm("naive_oracle", task="add_partial", overrides={"rollout.oracle": {}, "rollout.group_size": 9}),
    Arm("orarl_binary", overrides={"algorithm.method": "orarl", "rollout.oracle": {}, "rollout.group_size": 9}),
    Arm("naive_oracle_binary", overrides={"rollout.oracle": {}, "rollout.group_size": 9}),
    # 08: two domains, a teacher each
    Arm("base_mix", task="mix", kind=Kind.BASE),
    Arm("open_mopd", task="mix", teachers={"add": "teacher_add", "mul": "teacher_mul"},
        overrides={"algorithm.method": "open_mopd", "algorithm.topk": 64}),
    Arm("naive_mopd", task="mix", teachers={"add": "teacher_add", "mul": "teacher_mul"},
        overrides={"algorithm.method": "open_mopd", "algorithm.topk": 64, "algorithm.options": {"balance": False}}),
    # 11: RAIL, 4 fresh samples + 4 branches = GRPO's 8 rollouts
    Arm("rail", overrides={"rollout.branching": _branching}),
    # 12: the paper's rates (Muon 3e-5 fan-in vs AdamW 1e-6) and the RMS-matched Muon
    Arm("adamw_lo", overrides={"optim.lr": 1e-6}),
    Arm("muon_hi", overrides={"optim.name": "MuonWithAdamW", "optim.lr": 3e-5, "optim.options": {"adamw_lr": 1e-6}}),
    Arm("muon_matched", overrides={"optim.name": "MuonWithAdamW", "optim.lr": 5e-6,
                                   "optim.options": {"adamw_lr": 1e-6, "scale": "match_rms_adamw"}}),
    # 17: the GRPO update kept at ~1% of parameters in three frames (edits of "grpo", evaluation only)
    Arm("sar", kind=Kind.EDIT, source="grpo", edit={"frame": "base", "delta_fraction": 0.01}),
    Arm("sar_random", kind=Kind.EDIT, source="grpo", edit={"frame": "random", "delta_fraction": 0.01}),
    Arm("low_rank", kind=Kind.EDIT, source="grpo", edit={"frame": "none", "delta_fraction": 0.01}),
    # 18: DPO on designed vs uniform pairs, equal labels, partial-credit labels (fewer ties)
    *(
        Arm(f"dpo_{name}", task="add_partial", kind=Kind.DPO,
            overrides={"pairs.prompts": 16, "pairs.completions": 8, "pairs.n_pairs": 64, "pairs.design": design,
                       "dpo.batch_size": 16})
        for name, design in (("design", "optimal"), ("uniform", "uniform"))
    ),
    # 20 / 06: a cold start (two-digit x two-digit products)
    Arm("base_cold", task="cold", kind=Kind.BASE),
    Arm("grpo_cold", task="cold"),
    Arm("garl_cold", task="cold", overrides={"algorithm.method": "garl", "algorithm.options": {"q": 0.75}}),
    # 03: an annotation budget of B labelled problems split between SFT (solutions) and RL (answers)
    *(
        Arm(f"split_b{b}_r{r}", kind=Kind.BASE if r == 100 else Kind.RL, overrides=_split(b, r))
        for b in BUDGETS for r in SPLITS
    ),
)  # fmt: skip

ARMS: dict[str, Arm] = {a.name: a for a in _RAW}
"""Every arm of the suite by name."""


def arm(name: str) -> Arm:
    """The arm called ``name``.

    Raises:
        KeyError: no such arm (the message lists them).
    """
    if name not in ARMS:
        raise KeyError(f"unknown arm {name!r}; arms: {', '.join(ARMS)}")
    return ARMS[name]
