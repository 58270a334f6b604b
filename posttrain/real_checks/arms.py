"""Arms, profiles and the content key of a run: what is trained, on which model and task, and how it is cached.

An `Arm` is one way of training (a method, its options, a task), declared once and shared: the same
arm named by several experiments runs once per seed (one GRPO baseline per seed serves every claim
that compares against GRPO). Its config is the profile's base config with the arm's ``overrides``
(dotted keys) and the task the profile maps the arm's task name to, checked by the trainer's own
config loader.

A `Profile` is the model, the sizes and the task set of a tier: ``full`` (SmolLM2-135M-Instruct,
the suite), ``measure`` (SmolLM2 with 2 steps and a small evaluation: per-step costs for the budget)
and ``smoke`` (the tiny model built in code, 1-2 steps: every experiment end to end in minutes).

`run_key` is the cache key: a SHA-256 of the resolved config, the arm's kind and extra options, the
keys of the runs it depends on (teachers, the edited checkpoint), the evaluation protocol, the package
version and a digest of the code that decides a run's numbers (`code_digest` of `RUN_CODE`: the sources of
``posttrain.llm``, ``posttrain.estimators`` and of this package's run, evaluation and edit modules, committed
or not; the git commit is recorded beside it). Editing the judging or report code keeps the cache.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import posttrain
from posttrain.errors import DomainError

__all__ = [
    "PILOT_OFFSET",
    "PROFILES",
    "RUN_CODE",
    "TEACHER_SEED",
    "Arm",
    "Kind",
    "Profile",
    "arm_config",
    "code_digest",
    "git_commit",
    "run_key",
]  # fmt: skip

PILOT_OFFSET = 10_000
"""Pilot seeds are ``PILOT_OFFSET + i``: never evaluation seeds (``0 .. seeds - 1``)."""
TEACHER_SEED = 20_000
"""The one seed of a fixed-seed arm (a teacher is part of the setting, trained once, not per evaluation seed)."""
_ROOT = Path(posttrain.__file__).resolve().parent
RUN_CODE = ("llm", "estimators", "real_checks/runs.py", "real_checks/evaluation.py", "real_checks/edits.py")
"""The sources that decide a run's numbers (trainer, estimators, how a run is produced and scored) under ``posttrain``;
the judging, gate and report modules read stored samples and are not part of a run's key."""


class Kind(StrEnum):
    """How an arm produces its model: none (the base), the RL trainer, ES, DPO on designed pairs, a checkpoint edit."""

    BASE = "base"
    RL = "rl"
    ES = "es"
    DPO = "dpo"
    EDIT = "edit"


@dataclass(frozen=True)
class Arm:
    """One way of training, shared by every experiment that names it.

    Attributes:
        name: unique across the suite.
        task: a task name of the profile (``add``, ``add_partial``, ``mul``, ``cold``, ``mix``).
        overrides: dotted config keys set on the profile's base config (``{"algorithm.method": "sis"}``), in order;
            a callable value is called with the config mapping built so far (sizes that follow the profile).
        kind: how the model is produced (`Kind`).
        teacher: an arm whose final model is ``model.teacher`` (trained at `TEACHER_SEED`).
        teachers: domain -> arm, for ``model.teachers``.
        source: the arm whose checkpoint an ``edit`` arm edits (same seed).
        edit: the edit's options (`posttrain.real_checks.edits.edit_model`).
        fixed_seed: train at `TEACHER_SEED` whatever the evaluation seed (teachers).
        steps_scale: the arm trains ``steps_scale`` times the profile's steps (teachers train longer).
        keep_model: keep the final weights after evaluation (teachers, edit sources); else only the record stays.
    """

    name: str
    task: str = "add"
    overrides: Mapping[str, Any] = field(default_factory=dict)
    kind: Kind = Kind.RL
    teacher: str | None = None
    teachers: Mapping[str, str] | None = None
    source: str | None = None
    edit: Mapping[str, Any] = field(default_factory=dict)
    fixed_seed: bool = False
    steps_scale: int = 1
    keep_model: bool = False

    def dependencies(self) -> tuple[str, ...]:
        """The arms whose models this one reads."""
        deps = [self.teacher] if self.teacher else []
        deps += list((self.teachers or {}).values())
        deps += [self.source] if self.source else []
        return tuple(deps)


@dataclass(frozen=True)
class Profile:
    """A tier: the base config (nested mapping), the task set, the evaluation protocol, the seed plan's cap."""

    name: str
    base: Mapping[str, Any]
    tasks: Mapping[str, tuple[str, Mapping[str, Any]]]
    eval_prompts: int
    eval_samples: int
    coverage_samples: int
    """Samples per held-out prompt for the pass@k experiments (k up to this)."""
    probe_prompts: int
    probe_samples: int
    max_seeds: int | None = None
    """None: each experiment's power plan; else at most this many seeds (smoke: 1)."""


_SYSTEM = "You are a calculator. Reply with only the final number."
_ADD = {"low": 10, "high": 99, "low_b": 1, "high_b": 9}
_REAL_TASKS: dict[str, tuple[str, Mapping[str, Any]]] = {
    "add": ("chat_addition", _ADD),
    "add_partial": ("chat_arithmetic", {"op": "+", "low": 10, "high": 99, "low_last": 1, "high_last": 9, "partial": True}),
    "mul": ("chat_arithmetic", {"op": "*", "low": 10, "high": 99, "low_last": 2, "high_last": 9}),
    "cold": ("chat_arithmetic", {"op": "*", "low": 10, "high": 99}),
    "mix": ("mixture", {"tasks": {
        "add": {"task": "chat_addition", "options": _ADD},
        "mul": {"task": "chat_arithmetic", "options": {"op": "*", "low": 10, "high": 99, "low_last": 2, "high_last": 9}},
    }}),
}  # fmt: skip
_SMOLLM2 = {
    "model": {"path": "smollm2-135m-instruct", "dtype": "float32", "chat_template": True, "system_prompt": _SYSTEM},
    "data": {"prompts_per_step": 4},
    "rollout": {"engine": "hf", "group_size": 8, "max_new_tokens": 16, "temperature": 0.7},
    "optim": {"steps": 16, "lr": 1.0e-5, "max_grad_norm": 1.0},
    "checkpoint": {"every": 4, "keep": 1},
    "logging": {"progress": False, "eval_every": 0},
}
_TINY_TASKS: dict[str, tuple[str, Mapping[str, Any]]] = {
    "add": ("addition", {"digits": 1}),
    "add_partial": ("addition", {"digits": 1}),
    "mul": ("multiple", {}),
    "cold": ("addition", {"digits": 2}),
    "mix": ("mixture", {"tasks": {"add": {"task": "addition", "options": {"digits": 1}}, "mul": "multiple"}}),
}
_TINY = {
    "model": {"path": None},
    "data": {"prompts_per_step": 2, "sft_steps": 2, "sft_batch_size": 8},
    "rollout": {"engine": "hf", "group_size": 4, "max_new_tokens": 4, "temperature": 1.0},
    "optim": {"steps": 2, "lr": 1.0e-3},
    "checkpoint": {"every": 1, "keep": 1},
    "logging": {"progress": False, "eval_every": 0},
    "pairs": {"max_iter": 50, "pca_dim": 16},
}


def _with(base: Mapping[str, Any], **sections: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for name, values in sections.items():
        out[name] = {**out.get(name, {}), **values}
    return out


PROFILES: dict[str, Profile] = {
    "full": Profile("full", _SMOLLM2, _REAL_TASKS, eval_prompts=200, eval_samples=4, coverage_samples=16,
                    probe_prompts=16, probe_samples=8),
    "measure": Profile("measure", _with(_SMOLLM2, optim={"steps": 2}, checkpoint={"every": 1}), _REAL_TASKS,
                       eval_prompts=16, eval_samples=4, coverage_samples=4, probe_prompts=4, probe_samples=8,
                       max_seeds=1),
    "smoke": Profile("smoke", _TINY, _TINY_TASKS, eval_prompts=8, eval_samples=4, coverage_samples=4,
                     probe_prompts=4, probe_samples=4, max_seeds=1),
}  # fmt: skip
"""The tiers (module docstring)."""


def _set(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for key in parents:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise DomainError(f"overrides: {dotted!r} descends into a non-mapping at {key!r}")
    node[leaf] = copy.deepcopy(value)


def arm_config(profile: Profile, arm: Arm, seed: int, models: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The arm's run config as a plain mapping: the profile's base, the task, ``seed``, the overrides, teachers.

    ``models`` maps a dependency arm's name to its final model directory (teachers).
    """
    if arm.task not in profile.tasks:
        raise DomainError(f"arm {arm.name!r}: task {arm.task!r} is not in profile {profile.name!r}")
    tree = copy.deepcopy(dict(profile.base))
    task, options = profile.tasks[arm.task]
    tree["seed"] = int(seed)
    tree["data"] = {**tree.get("data", {}), "task": task, "options": copy.deepcopy(dict(options))}
    if arm.steps_scale != 1:
        tree["optim"] = {**tree.get("optim", {}), "steps": int(tree["optim"]["steps"]) * arm.steps_scale}
    for key, value in arm.overrides.items():  # a callable value is a function of the config built so far
        _set(tree, key, value(tree) if callable(value) else value)
    models = models or {}
    if arm.teacher:
        _set(tree, "model.teacher", models.get(arm.teacher, f"<{arm.teacher}>"))
    if arm.teachers:
        _set(tree, "model.teachers", {d: models.get(a, f"<{a}>") for d, a in arm.teachers.items()})
    return tree


@functools.cache
def code_digest(parts: tuple[str, ...] = RUN_CODE) -> str:
    """SHA-256 of the sources ``parts`` (packages or files under ``posttrain``; default `RUN_CODE`), committed or not."""
    h = hashlib.sha256()
    for part in parts:
        paths = [_ROOT / part] if part.endswith(".py") else sorted((_ROOT / part).rglob("*.py"))
        for path in paths:
            h.update(str(path.relative_to(_ROOT)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


@functools.cache
def git_commit() -> str | None:
    """The checkout's HEAD commit (provenance only; None outside a git checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def run_key(
    config: Mapping[str, Any],
    arm: Arm,
    *,
    depends: Mapping[str, str],
    evaluation: Mapping[str, Any],
    code: tuple[str, ...] = RUN_CODE,
) -> str:
    """The cache key of one run (module docstring): 16 hex digits.

    ``config`` is the resolved config mapping (dependency model paths replaced by ``depends``' keys, so a
    key does not depend on where a teacher was stored).
    """
    payload = {
        "config": config,
        "kind": arm.kind.value,
        "edit": dict(arm.edit),
        "depends": dict(sorted(depends.items())),
        "evaluation": dict(evaluation),
        "version": posttrain.__version__,
        "code": code_digest(code),
    }
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
