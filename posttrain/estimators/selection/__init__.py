"""Selection and scheduling: what to train on, and when.

| module | |
| --- | --- |
| `replay` | replay buffers and their selection rules (headroom, drift) |
| `interventions` | where to branch rollouts (recoverability), and the baselines |
| `controller` | the online controller that predicts recoverability gains |
| `routing` | per-prompt routes between recipes, and the random baseline |
| `schedules` | phase and coefficient schedules of the distillation rules |
"""

from __future__ import annotations

from posttrain.estimators.selection.controller import (
    ControllerState,
    controller_fit,
    controller_init,
    controller_predict,
    controller_update,
    huber,
    recency_weights,
)
from posttrain.estimators.selection.interventions import (
    InterventionPlan,
    entropy_heuristic_states,
    plan_interventions,
    random_interventions,
    recoverability_gain,
)
from posttrain.estimators.selection.replay import (
    REPLAY_RULES,
    ReplayBuffer,
    ReplayOrder,
    ReplayRule,
    ReplaySelection,
    headroom,
    mixed_outcome,
    policy_drift,
    replay_add,
    replay_init,
    replay_rule,
    replay_select,
    replay_take,
)
from posttrain.estimators.selection.routing import (
    RECIPES,
    ROUTERS,
    DeltaMode,
    Recipe,
    accuracy_memberships,
    confidence_features,
    random_routes,
    rollout_confidence,
    route_masks,
    router_probabilities,
    router_scores,
    sample_routes,
    self_routing_probabilities,
)
from posttrain.estimators.selection.schedules import SCHEDULES, kdrl_annealed_beta, opd_phase, plateau_switch_step

__all__ = [
    "RECIPES",
    "REPLAY_RULES",
    "ROUTERS",
    "SCHEDULES",
    "ControllerState",
    "DeltaMode",
    "InterventionPlan",
    "Recipe",
    "ReplayBuffer",
    "ReplayOrder",
    "ReplayRule",
    "ReplaySelection",
    "accuracy_memberships",
    "confidence_features",
    "controller_fit",
    "controller_init",
    "controller_predict",
    "controller_update",
    "entropy_heuristic_states",
    "headroom",
    "huber",
    "kdrl_annealed_beta",
    "mixed_outcome",
    "opd_phase",
    "plan_interventions",
    "plateau_switch_step",
    "policy_drift",
    "random_interventions",
    "random_routes",
    "recency_weights",
    "recoverability_gain",
    "replay_add",
    "replay_init",
    "replay_rule",
    "replay_select",
    "replay_take",
    "rollout_confidence",
    "route_masks",
    "router_probabilities",
    "router_scores",
    "sample_routes",
    "self_routing_probabilities",
]
