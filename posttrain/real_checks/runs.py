"""Running an arm for one seed, once: train (or resume), evaluate, keep a record; cached by the run's content key.

A run lives in ``<root>/<key>/`` (`posttrain.real_checks.arms.run_key`; arms with equal configs share it): ``run/`` is the
trainer's directory (``config.yaml``, ``metrics.jsonl``, ``checkpoints/``), ``record.json`` the finished
run (training log, first-update RMS, timings, the held-out samples), written atomically last. A run
whose ``record.json`` exists is not run again; a run killed mid-training resumes from its newest
checkpoint (the trainer's resume, bit-exact on CPU); ES, DPO and edits restart. After evaluation the
checkpoints are removed unless the arm is read by another (a teacher, an edited checkpoint): its final
weights stay in ``final/``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from posttrain.errors import DomainError
from posttrain.llm.train.rundir import atomic_write_text
from posttrain.real_checks.arms import TEACHER_SEED, Arm, Kind, Profile, arm_config, run_key
from posttrain.real_checks.evaluation import evaluate_model

__all__ = ["Runner"]


def _config(tree: Mapping[str, Any]) -> Any:
    from posttrain.llm.config import config_from_dict

    return config_from_dict(tree)


def _hidden(model: Any) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.ndim == 2 and p.requires_grad]


def _rms(deltas: list[torch.Tensor]) -> float:
    sq = sum(float(d.double().pow(2).sum()) for d in deltas)
    return (sq / max(sum(d.numel() for d in deltas), 1)) ** 0.5


class Runner:
    """Runs and caches the arms of a suite under ``root`` for ``profile`` (module docstring).

    ``samples`` maps an arm to its held-out samples per prompt (default: the profile's); ``log`` gets one
    line per run started, resumed or read from the cache.
    """

    def __init__(
        self,
        profile: Profile,
        arms: Mapping[str, Arm],
        root: str | Path,
        *,
        samples: Mapping[str, int] | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.profile, self.arms, self.root = profile, dict(arms), Path(root)
        self.samples, self.log = dict(samples or {}), log
        self._keys: dict[tuple[str, int], str] = {}

    # ------------------------------------------------------------ identity
    def seed_of(self, arm: str, seed: int) -> int:
        return TEACHER_SEED if self.arms[arm].fixed_seed else int(seed)

    def evaluation(self, arm: str) -> dict[str, int]:
        return {"prompts": self.profile.eval_prompts, "samples": self.samples.get(arm, self.profile.eval_samples)}

    def key(self, arm: str, seed: int) -> str:
        seed = self.seed_of(arm, seed)
        if (arm, seed) not in self._keys:
            a = self.arms[arm]
            depends = {d: self.key(d, seed) for d in a.dependencies()}
            self._keys[(arm, seed)] = run_key(arm_config(self.profile, a, seed), a, depends=depends,
                                              evaluation=self.evaluation(arm))  # fmt: skip
        return self._keys[(arm, seed)]

    def folder(self, arm: str, seed: int) -> Path:
        """The run's directory, named by its content key only: two arms with one config share one run."""
        return self.root / self.key(arm, seed)

    def cached(self, arm: str, seed: int) -> dict[str, Any] | None:
        path = self.folder(arm, seed) / "record.json"
        return json.loads(path.read_text()) if path.is_file() else None

    # ------------------------------------------------------------ running
    def record(self, arm: str, seed: int) -> dict[str, Any]:
        """The finished run of ``arm`` at ``seed``: from the cache, or run now (its dependencies first)."""
        found = self.cached(arm, seed)
        if found is not None:
            return found
        a = self.arms[arm]
        for dep in a.dependencies():
            self.record(dep, seed)
        seed = self.seed_of(arm, seed)
        folder = self.folder(arm, seed)
        folder.mkdir(parents=True, exist_ok=True)
        models = {d: str(self.final_model(d, seed)) for d in a.dependencies()}
        tree = arm_config(self.profile, a, seed, models)
        cfg = _config(tree)
        start, cpu = time.perf_counter(), time.process_time()
        history, extra = self._produce(a, cfg, folder, seed)
        train_s, train_cpu = time.perf_counter() - start, time.process_time() - cpu
        model_dir = self._model_dir(a, folder)
        ev = self.evaluation(arm)
        cpu = time.process_time()
        scores = evaluate_model(model_dir, cfg, prompts=ev["prompts"], samples=ev["samples"], seed=seed)
        record = {
            "arm": arm, "seed": seed, "key": self.key(arm, seed), "kind": a.kind.value, "config": tree,
            "history": history, **extra, "train_s": train_s, "train_cpu_s": train_cpu,
            "eval_cpu_s": time.process_time() - cpu, "eval": scores,
        }  # fmt: skip
        if a.keep_model:  # read by other arms: the final weights, and the base an edit starts from
            for src, dst in ((model_dir, folder / "final"), (folder / "run" / "initial", folder / "base")):
                if src.is_dir() and src.resolve() != dst.resolve():
                    shutil.rmtree(dst, ignore_errors=True)
                    shutil.copytree(src, dst)
        for heavy in ("run/checkpoints", "run/initial", "run/es", "dpo", "design/initial", "edit"):
            shutil.rmtree(folder / heavy, ignore_errors=True)
        atomic_write_text(folder / "record.json", json.dumps(record, default=float) + "\n")
        return record

    def final_model(self, arm: str, seed: int) -> Path:
        """The kept final weights of ``arm`` (run on demand).

        Raises:
            DomainError: the arm does not keep its model (``keep_model``).
        """
        if not self.arms[arm].keep_model:
            raise DomainError(f"arm {arm!r}: its model is read by another arm; declare it with keep_model=True")
        self.record(arm, seed)
        return self.folder(arm, seed) / "final"

    def _model_dir(self, a: Arm, folder: Path) -> Path:
        from posttrain.llm.tools.models import resolve_model_path
        from posttrain.llm.train.checkpoint import latest_checkpoint

        if a.kind is Kind.BASE:
            path = self.profile.base["model"].get("path")
            if path and not a.overrides.get("data.sft_steps"):
                return Path(str(resolve_model_path(path) or path))
            return folder / "run" / "initial"
        if a.kind is Kind.ES:
            return folder / "run" / "es"
        if a.kind is Kind.EDIT:
            return folder / "edit"
        ckpt = latest_checkpoint(folder / ("dpo" if a.kind is Kind.DPO else "run") / "checkpoints")
        if ckpt is None:
            raise DomainError(f"{folder}: the run left no checkpoint")
        return ckpt / "model"

    def _produce(self, a: Arm, cfg: Any, folder: Path, seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Train / build the arm's model in ``folder``; returns its per-step log and extra fields."""
        from posttrain.llm import run as llm_run

        run = folder / "run"
        if a.kind is Kind.BASE:
            if not cfg.model.path or cfg.data.sft_steps:  # built (tiny) or warmed up (SFT) for this seed
                shutil.rmtree(run, ignore_errors=True)
                run.mkdir(parents=True)
                llm_run.build_initial(cfg, run, llm_run.training_task(llm_run.as_plan(cfg)))
            return [], {}
        if a.kind is Kind.ES:
            _, es_logs = llm_run.es_from_config(cfg, run, overwrite=True)
            return [{"step": e.step + 1, "reward_mean": float(e.reward_mean)} for e in es_logs], {}
        if a.kind is Kind.DPO:
            return self._dpo(cfg, folder)
        if a.kind is Kind.EDIT:
            from posttrain.real_checks.edits import edit_model

            assert a.source is not None
            src = self.folder(a.source, seed)
            report = edit_model(src / "base", src / "final", folder / "edit", seed=seed, **dict(a.edit))
            return [], {"edit_report": report}
        return self._train(cfg, run)

    def _train(self, cfg: Any, run: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        from posttrain.llm.run import build_trainer
        from posttrain.llm.train.checkpoint import intact_checkpoint

        resume = intact_checkpoint(run / "checkpoints") is not None
        self.log(
            f"{'resume' if resume else 'train'} {cfg.algorithm.method} on {cfg.data.task}, seed {cfg.seed}: {run.parent.name}"
        )
        cpu = time.process_time()
        trainer = build_trainer(cfg, run, resume=resume, overwrite=not resume)
        build_cpu = time.process_time() - cpu
        side = run / "first_update_rms.json"
        before = [p.detach().clone() for p in _hidden(trainer.policy)] if trainer.step == 0 else None

        def on_step(metrics: dict[str, Any]) -> None:
            nonlocal before
            if before is not None:
                rms = _rms([p.detach() - b for p, b in zip(_hidden(trainer.policy), before, strict=True)])
                atomic_write_text(side, json.dumps({"first_update_rms": rms}))
                before = None

        trainer.fit(on_step=on_step)
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        extra = json.loads(side.read_text()) if side.is_file() else {"first_update_rms": None}
        return rows, {**extra, "build_cpu_s": build_cpu}

    def _dpo(self, cfg: Any, folder: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        import dataclasses

        from posttrain.llm.run_pairs import design_from_config, dpo_from_config

        design = design_from_config(cfg, folder / "design", overwrite=True)
        pairs = folder / "design" / "pairs.jsonl"
        dpo_cfg = dataclasses.replace(cfg, dpo=dataclasses.replace(cfg.dpo, pairs=str(pairs)))
        rows = dpo_from_config(dpo_cfg, folder / "dpo", overwrite=True)
        return list(rows), {"design": {k: v for k, v in design.items() if isinstance(v, int | float | str)}}
