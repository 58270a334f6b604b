"""Every method by name: the presets and bundles of ``algorithm.method``, and `build_algorithm`.

This is the one place a method's name meets its parts (``registry("method")``, ``posttrain list
method``): a `MethodPreset` names registry estimators, a `MethodBundle` holds the factory of a method
module (`distill`, `flow`, `sis`, ...) and its typed options class. `build_algorithm` is the config edge of
a method: it checks the options (names, types and limits, by `posttrain.llm.typed`), builds the bundle and,
for a preset, tries its estimators once on a small batch so an option out of an estimator's range fails
here, naming its key (``algorithm.loss_options.clip_high: ...``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from posttrain.errors import DomainError
from posttrain.estimators import get_advantage, get_kl, get_policy_loss
from posttrain.llm.methods.algorithm import (
    ADVANTAGE_INPUTS,
    GRPO,
    LOSS_INPUTS,
    Algorithm,
    Inputs,
    MethodBundle,
    MethodPreset,
    preset_algorithm,
    with_penalties,
)
from posttrain.llm.methods.distill import (
    ExOpdOptions,
    Opd2Options,
    OpdThenRlOptions,
    exopd_algorithm,
    opd2_algorithm,
    opd_then_rl_algorithm,
)
from posttrain.llm.methods.flow import FlowRLOptions, GFlowRLOptions, flowrl_algorithm, gflowrl_algorithm
from posttrain.llm.methods.mopd import OpenMopdOptions, open_mopd_algorithm
from posttrain.llm.methods.needs import example_batch
from posttrain.llm.methods.orarl import OraRLOptions, orarl_algorithm
from posttrain.llm.methods.routing import RoutingOptions, self_routing_algorithm
from posttrain.llm.methods.sis import sis_algorithm
from posttrain.llm.methods.tsallis import GarlOptions, PaftOptions, garl_algorithm, paft_algorithm
from posttrain.llm.typed import Checked, OneOf, Range, check_options, from_mapping
from posttrain.registry import registry

__all__ = ["METHODS", "SisOptions", "build_algorithm", "preset_names"]

METHODS = registry("method")


def preset_names() -> list[str]:
    """The methods that are presets (SIS wraps one)."""
    return sorted(n for n in METHODS.names() if isinstance(METHODS.get(n), MethodPreset))


@dataclass(frozen=True)
class SisOptions(Checked):
    """``algorithm.options`` of ``sis``: the preset it wraps and the behaviour envelope's size."""

    base: Annotated[str, OneOf(preset_names)] = "grpo"
    top_k: Annotated[int, Range(1, 1 << 20)] = 100


def _sis(horizon: int, options: SisOptions | None = None) -> Algorithm:
    """SIS on the ``base`` preset (unscheduled and without its own hook)."""
    o = options or SisOptions()
    return sis_algorithm(build_algorithm(method=o.base, horizon=horizon), base=o.base, top_k=o.top_k)


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
    MethodBundle(gflowrl_algorithm, GFlowRLOptions),
    paper="Liu et al. 2026, GFlowRL, arXiv:2607.13394",
    summary="GFlowRL: whole-group clipped flow gaps vs a reference, IS-corrected trajectory balance.",
)
METHODS.add(
    "flowrl",
    MethodBundle(flowrl_algorithm, FlowRLOptions),
    paper="Zhu et al. 2025, FlowRL, arXiv:2509.15207 (docs: methods/gflowrl.md baseline)",
    summary="FlowRL: trajectory balance with a learned log Z(x), an MLP over the prompt's mean hidden state.",
)

METHODS.add(
    "sis",
    MethodBundle(_sis, SisOptions),
    paper="Li et al. 2026, Selective Importance Sampling, arXiv:2607.04728",
    summary="SIS: a token rejection test vs the behaviour top-K before every update, on any ratio-based preset.",
)
METHODS.add(
    "opd_then_rl",
    MethodBundle(opd_then_rl_algorithm, OpdThenRlOptions),
    paper="Li et al. 2026, Sequential Beats Joint, arXiv:2609.04108",
    summary="OPD-then-RL: OPD advantages (teacher log-probs) up to switch_step or a validation plateau, then GRPO.",
)

METHODS.add(
    "exopd",
    MethodBundle(exopd_algorithm, ExOpdOptions),
    paper="ExOPD / G-OPD reward extrapolation, arXiv:2602.12125 (docs: methods/opd2.md baseline)",
    summary="ExOPD: PPO-clip on lam*(teacher - reference) - (student - reference); reference = model.reference.",
)
METHODS.add(
    "opd2",
    MethodBundle(opd2_algorithm, Opd2Options),
    paper="Heo et al. 2026, On-Policy Delta Distillation, arXiv:2607.15161",
    summary="OPD²: PPO-clip on the centred, sign-gated teacher-minus-teacher-base delta on the student's top-K.",
)


def _named(where: str, exc: Exception, options: Mapping[str, Any]) -> DomainError:
    """An estimator's error (``"clip_high: expected ..."``) under its config key: ``where_options.clip_high`` when
    it names one of the options, else ``where``."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    name = text.split(":", 1)[0].strip()
    if name in options:
        return DomainError(f"{where}_options.{text}")
    return DomainError(f"{where}: {text}")


def _try_preset(alg: Algorithm, loss_options: Mapping[str, Any], advantage_options: Mapping[str, Any]) -> None:
    """Run a preset's advantage and loss once on a small batch (`example_batch`): the estimators check their
    options' ranges themselves, so a value out of range fails at the config edge."""
    import torch

    batch = example_batch(alg.needs | set(alg.loss_needs), group_size=2, rewards=[1.0, 0.0, 0.0, 1.0])
    try:
        advantages = alg.advantage(batch)
    except (DomainError, TypeError, ValueError) as exc:
        raise _named("algorithm.advantage", exc, advantage_options) from None
    try:
        alg.token_loss(torch.zeros(batch.mask.shape), None, batch.replace(advantages=advantages))
    except (DomainError, TypeError, ValueError) as exc:
        raise _named("algorithm.loss", exc, loss_options) from None


def _preset(
    method: str, preset: MethodPreset, horizon: int, names: Mapping[str, Any], options: Mapping[str, Any]
) -> Algorithm:
    """A preset with the config's overrides, its options checked against the estimators' keyword parameters."""
    if options:
        raise DomainError(f"algorithm.options: method {method!r} is a preset; use loss_options / advantage_options")
    loss, advantage = names["loss"] or preset.loss, names["advantage"] or preset.advantage
    l_opts = {**(preset.loss_options if names["loss"] is None else {}), **(names["loss_options"] or {})}
    a_opts = {**(preset.advantage_options if names["advantage"] is None else {}), **(names["advantage_options"] or {})}
    batch_keywords = [need.value for need in LOSS_INPUTS.get(loss, ())]  # filled from the batch, not options
    check_options("algorithm.loss_options", get_policy_loss(loss), l_opts, skip=batch_keywords)
    adv_fn = get_advantage(advantage)
    check_options("algorithm.advantage_options", adv_fn, a_opts)
    spec = ADVANTAGE_INPUTS.get(advantage, Inputs())
    import inspect

    positional = [p for p in inspect.signature(adv_fn).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD
                  and p.default is p.empty]  # fmt: skip
    if len(positional) != len(spec.inputs):
        raise DomainError(
            f"algorithm.advantage: {advantage!r} takes {len(positional)} batch inputs, a preset gives it "
            f"{len(spec.inputs)} ({', '.join(map(str, spec.inputs))}); it is used inside a method (algorithm.method)"
        )
    alg = preset_algorithm(
        preset, horizon=horizon, advantage=names["advantage"], loss=names["loss"], aggregation=names["aggregation"],
        advantage_options=names["advantage_options"], loss_options=names["loss_options"],
    )  # fmt: skip
    _try_preset(alg, l_opts, a_opts)
    return alg


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
    """Resolve a method plus overrides into an `Algorithm`, checking every option on the way.

    ``options`` are the typed options of a `MethodBundle` method (its ``options`` class; an error for a
    preset); the KL term and entropy bonus are added to either. ``group_size`` (``rollout.group_size``)
    reaches a bundle factory that declares it.

    Examples:
        >>> alg = build_algorithm(method="drgrpo", horizon=16, kl="k3", kl_coef=0.01)
        >>> alg.aggregation.value, sorted(map(str, alg.needs))
        ('seq-mean-token-sum-norm', ['logp_old', 'logp_ref'])
    """
    entry = METHODS.get(method)
    names: dict[str, Any] = {"advantage": advantage, "loss": loss, "aggregation": aggregation}
    names |= {"advantage_options": advantage_options, "loss_options": loss_options}
    if isinstance(entry, MethodBundle):
        given = sorted(k for k, v in names.items() if v)
        if given:
            raise DomainError(
                f"algorithm.{', algorithm.'.join(given)}: not used by method {method!r} (use algorithm.options)"
            )
        opts: Any = from_mapping(entry.options, options or {}, "algorithm.options")
        alg = (
            entry.factory(int(horizon), opts, group_size=group_size)
            if entry.group_size
            else entry.factory(int(horizon), opts)
        )
    else:
        assert isinstance(entry, MethodPreset)  # the registry holds presets and bundles only
        alg = _preset(method, entry, int(horizon), names, options or {})
    kl_fn = get_kl(kl) if kl is not None and kl_coef > 0 else None
    return with_penalties(alg, kl_fn, float(kl_coef), float(entropy_coef))


METHODS.add(
    "garl",
    MethodBundle(garl_algorithm, GarlOptions),
    paper="Lin & Ie 2026, Tsallis loss continuum, arXiv:2604.25907 (Algorithm 1, reconstructed)",
    summary="GARL: the RLOO gradient on trace weights w (reward, or the gold answer's likelihood) amplified by w_bar^-q.",
)
METHODS.add(
    "paft",
    MethodBundle(paft_algorithm, PaftOptions),
    paper="Lin & Ie 2026, Tsallis loss continuum, arXiv:2604.25907 (Algorithm 2, reconstructed)",
    summary="PAFT: SFT on traces resampled in proportion to w, attenuated by w_bar^(1-q).",
)
METHODS.add(
    "self_routing",
    MethodBundle(self_routing_algorithm, RoutingOptions),
    paper="Li et al. 2026, From Rollouts to Recipes (Self-Routing), arXiv:2609.01422",
    summary="Self-Routing: each prompt routed to GRPO / self-teacher OPSD / REG (k3 to the reference) / SKIP "
    "from its rollouts' accuracy and entropy confidence; per-queue token means weighted by queue size.",
)

METHODS.add(
    "open_mopd",
    MethodBundle(open_mopd_algorithm, OpenMopdOptions),
    paper="Gao et al. 2026, Open-MOPD, arXiv:2608.19098",
    summary="Open-MOPD: top-K distillation from teachers routed by domain (model.teachers), token-share x "
    "gap-following weights on the advantage, reward refresh before every later update.",
)

METHODS.add(
    "orarl",
    MethodBundle(orarl_algorithm, OraRLOptions, group_size=True),
    paper="Li et al. 2026, Annotations as Rollouts (OraRL), arXiv:2608.20492",
    summary="OraRL: the task's reference solution as one oracle row per group (rollout.oracle); policy-only "
    "baseline, directional gain, detached capped oracle advantage, sign-balanced selection (kept rows).",
)
