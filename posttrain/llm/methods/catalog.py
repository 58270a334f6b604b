"""Every method by name: the presets and bundles of ``algorithm.method``, and `build_algorithm`.

This is the one place a method's name meets its parts (``registry("method")``, ``posttrain list
method``): a `MethodPreset` names registry estimators, a
`MethodBundle` holds the factory of a method module
(`distill`, `flow`,
`sis`). The run's edge calls `build_algorithm` once.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from posttrain.errors import DomainError
from posttrain.estimators import get_kl
from posttrain.llm.methods.algorithm import (
    GRPO,
    Algorithm,
    MethodBundle,
    MethodPreset,
    check_options,
    preset_algorithm,
    with_penalties,
)
from posttrain.llm.methods.distill import exopd_algorithm, opd2_algorithm, opd_then_rl_algorithm
from posttrain.llm.methods.flow import flowrl_algorithm, gflowrl_algorithm
from posttrain.llm.methods.mopd import open_mopd_algorithm
from posttrain.llm.methods.orarl import orarl_algorithm
from posttrain.llm.methods.routing import self_routing_algorithm
from posttrain.llm.methods.sis import sis_algorithm
from posttrain.llm.methods.tsallis import garl_algorithm, paft_algorithm
from posttrain.registry import registry

__all__ = ["METHODS", "build_algorithm"]

METHODS = registry("method")


def _sis(horizon: int, *, base: str = "grpo", top_k: int = 100) -> Algorithm:
    """SIS on the ``base`` method (a preset by name, unscheduled and without its own hook)."""
    return sis_algorithm(build_algorithm(method=base, horizon=horizon), base=base, top_k=top_k)


METHODS.add(
    "grpo",
    GRPO,
    paper="Shao et al. 2024, DeepSeekMath, arXiv:2402.03300",
    summary="GRPO: group-normalised advantages, PPO-clip, sequence mean of token means.",
)
METHODS.add(
    "drgrpo",
    MethodPreset("drgrpo", "ppo_clip", "seq-mean-token-sum-norm"),
    paper="Liu et al. 2025, Understanding R1-Zero-like training, arXiv:2503.20783",
    summary="Dr.GRPO: mean-centred advantages, PPO-clip, constant normaliser B * max_new_tokens.",
)
METHODS.add(
    "rloo",
    MethodPreset("rloo", "ppo_clip", "seq-mean-token-sum"),
    paper="Ahmadian et al. 2024, Back to Basics, arXiv:2402.14740",
    summary="RLOO: leave-one-out baseline, sequence log-prob (token sum) per sample.",
)
METHODS.add(
    "gspo",
    MethodPreset("grpo", "gspo", "seq-mean-token-mean"),
    paper="Zheng et al. 2025, GSPO, arXiv:2507.18071",
    summary="GSPO: group-normalised advantages, sequence-level clipped ratio.",
)
METHODS.add(
    "ppo_clip",
    MethodPreset("grpo", "ppo_clip", "token-mean", loss_options={"dual_clip": 3.0}),
    paper="Schulman et al. 2017 arXiv:1707.06347; Ye et al. 2020 arXiv:1912.09729",
    summary="PPO-clip with dual clip c=3 on group-normalised advantages (no critic), token mean.",
)
METHODS.add(
    "cispo",
    MethodPreset("grpo", "cispo", "token-mean"),
    paper="MiniMax 2025, MiniMax-M1 (CISPO), arXiv:2506.13585",
    summary="CISPO: group-normalised advantages, REINFORCE weighted by the clipped stop-gradient ratio, token mean.",
)

METHODS.add(
    "gflowrl",
    MethodBundle(gflowrl_algorithm),
    paper="Liu et al. 2026, GFlowRL, arXiv:2607.13394",
    summary="GFlowRL: whole-group clipped flow gaps vs a reference, IS-corrected trajectory balance.",
)
METHODS.add(
    "flowrl",
    MethodBundle(flowrl_algorithm),
    paper="Zhu et al. 2025, FlowRL, arXiv:2509.15207 (docs: methods/gflowrl.md baseline)",
    summary="FlowRL: trajectory balance with a learned log Z(x), an MLP over the prompt's mean hidden state.",
)

METHODS.add(
    "sis",
    MethodBundle(_sis),
    paper="Li et al. 2026, Selective Importance Sampling, arXiv:2607.04728",
    summary="SIS: a token rejection test vs the behaviour top-K before every update, on any ratio-based preset.",
)
METHODS.add(
    "opd_then_rl",
    MethodBundle(opd_then_rl_algorithm),
    paper="Li et al. 2026, Sequential Beats Joint, arXiv:2609.04108",
    summary="OPD-then-RL: OPD advantages (teacher log-probs) up to switch_step or a validation plateau, then GRPO.",
)

METHODS.add(
    "exopd",
    MethodBundle(exopd_algorithm),
    paper="ExOPD / G-OPD reward extrapolation, arXiv:2602.12125 (docs: methods/opd2.md baseline)",
    summary="ExOPD: PPO-clip on lam*(teacher - reference) - (student - reference); reference = model.reference.",
)
METHODS.add(
    "opd2",
    MethodBundle(opd2_algorithm),
    paper="Heo et al. 2026, On-Policy Delta Distillation, arXiv:2607.15161",
    summary="OPD²: PPO-clip on the centred, sign-gated teacher-minus-teacher-base delta on the student's top-K.",
)


def _from_bundle(
    method: str,
    entry: MethodBundle,
    horizon: int,
    options: Mapping[str, Any],
    overrides: Mapping[str, Any],
    group_size: int | None = None,
) -> Algorithm:
    """Call a `MethodBundle`'s factory; advantage/loss/aggregation overrides do not apply to it. A factory
    with a keyword ``group_size`` (rows per group, e.g. OraRL's kept-row count) gets ``rollout.group_size``."""
    given = sorted(k for k, v in overrides.items() if v)
    if given:
        raise DomainError(
            f"algorithm.{', algorithm.'.join(given)}: not used by method {method!r} (use algorithm.options)"
        )
    wants_k = "group_size" in inspect.signature(entry.factory).parameters
    if wants_k and "group_size" in options:
        raise DomainError("algorithm.options.group_size: set rollout.group_size instead")
    check_options("options", entry.factory, options)
    if wants_k:
        return entry.factory(int(horizon), group_size=group_size, **options)
    return entry.factory(int(horizon), **options)


def build_algorithm(
    *,
    method: str,
    horizon: int,
    advantage: str | None = None,
    loss: str | None = None,
    aggregation: str | None = None,
    advantage_options: Mapping[str, Any] | None = None,
    loss_options: Mapping[str, Any] | None = None,
    kl: str | None = None,
    kl_coef: float = 0.0,
    entropy_coef: float = 0.0,
    options: Mapping[str, Any] | None = None,
    group_size: int | None = None,
) -> Algorithm:
    """Resolve a method plus overrides into an `Algorithm`.

    ``options`` are the keyword options of a `MethodBundle` method (an error for a preset);
    the KL term and entropy bonus are added to either. ``group_size`` (``rollout.group_size``) reaches
    a bundle factory that declares it.

    Examples:
        >>> alg = build_algorithm(method="drgrpo", horizon=16, kl="k3", kl_coef=0.01)
        >>> alg.aggregation.value, sorted(alg.needs)
        ('seq-mean-token-sum-norm', ['logp_old', 'logp_ref'])
    """
    entry = METHODS.get(method)
    kl_fn = get_kl(kl) if kl is not None and kl_coef > 0 else None
    if isinstance(entry, MethodBundle):
        overrides: dict[str, Any] = {"advantage": advantage, "loss": loss, "aggregation": aggregation}
        overrides |= {"advantage_options": advantage_options, "loss_options": loss_options}
        alg = _from_bundle(method, entry, horizon, options or {}, overrides, group_size)
    else:
        if options:
            raise DomainError(f"algorithm.options: method {method!r} is a preset; use loss_options / advantage_options")
        preset: MethodPreset = entry  # type: ignore[assignment]
        alg = preset_algorithm(
            preset, horizon=horizon, advantage=advantage, loss=loss, aggregation=aggregation,
            advantage_options=advantage_options, loss_options=loss_options,
        )  # fmt: skip
    return with_penalties(alg, kl_fn, float(kl_coef), float(entropy_coef))


METHODS.add(
    "garl",
    MethodBundle(garl_algorithm),
    paper="Lin & Ie 2026, Tsallis loss continuum, arXiv:2604.25907 (Algorithm 1, reconstructed)",
    summary="GARL: the RLOO gradient on trace weights w (reward, or the gold answer's likelihood) amplified by w_bar^-q.",
)
METHODS.add(
    "paft",
    MethodBundle(paft_algorithm),
    paper="Lin & Ie 2026, Tsallis loss continuum, arXiv:2604.25907 (Algorithm 2, reconstructed)",
    summary="PAFT: SFT on traces resampled in proportion to w, attenuated by w_bar^(1-q).",
)
METHODS.add(
    "self_routing",
    MethodBundle(self_routing_algorithm),
    paper="Li et al. 2026, From Rollouts to Recipes (Self-Routing), arXiv:2609.01422",
    summary="Self-Routing: each prompt routed to GRPO / self-teacher OPSD / REG (k3 to the reference) / SKIP "
    "from its rollouts' accuracy and entropy confidence; per-queue token means weighted by queue size.",
)

METHODS.add(
    "open_mopd",
    MethodBundle(open_mopd_algorithm),
    paper="Gao et al. 2026, Open-MOPD, arXiv:2608.19098",
    summary="Open-MOPD: top-K distillation from teachers routed by domain (model.teachers), token-share x "
    "gap-following weights on the advantage, reward refresh before every later update.",
)

METHODS.add(
    "orarl",
    MethodBundle(orarl_algorithm),
    paper="Li et al. 2026, Annotations as Rollouts (OraRL), arXiv:2608.20492",
    summary="OraRL: the task's reference solution as one oracle row per group (rollout.oracle); policy-only "
    "baseline, directional gain, detached capped oracle advantage, sign-balanced selection (kept rows).",
)
