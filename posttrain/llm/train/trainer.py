"""The RL trainer: one loop, generate -> score -> advantages -> log-probs -> loss -> step -> log.

Everything method-specific lives in the `Algorithm` bundle; the loop only fills what the bundle declares
it needs (``Algorithm.needs``, in the order and from the sources of the table
`posttrain.llm.methods.needs.NEEDS`) and calls its callables. The sampling temperature of the training
forward, the stages and the hooks is the run's one `SamplingConfig` (``sampling``), the engine's. The bundle
of step ``s`` is ``algorithm.at(s, scores)``, a pure function of the step and of the validation scores
logged so far (``logging.eval_metric`` every ``logging.eval_every`` steps). The bundle's own trainable
modules (``Algorithm.modules``) join the optimizer; its ``before_update`` hook (e.g. SIS) runs before
every optimizer step with explicit state threaded through the step's updates. Rollout stages
(`posttrain.llm.rollout.stages`: HDR replay, RAIL branching) are called at fixed points of every step.

Off-policy (docs: off_policy.md): a step's batch comes from a `RolloutSource` (`posttrain.llm.train.pending`):
generated now, by the policy of ``rollout.staleness`` steps earlier, or by an asynchronous worker. What a method
reads from the behaviour policy's own forward (`NEEDS` rows marked ``behaviour``) is filled when the batch is
generated; the stages, the other needs and the advantages when its step runs.

Simplifications (stated, not hidden):

- ``logp_old`` is the engine's behaviour log-prob; the trainer recomputes it (``logp_prox``) only for
  ``algorithm.rollout_correction`` (`posttrain.llm.methods.correction`). With the HF engine the two agree to
  ~1e-6 in float32, with vLLM to its kernels' precision. No critic.
- A step is: one rollout batch of G prompts x K samples, then ``updates_per_batch`` optimizer
  steps on the whole batch, each accumulating gradients over micro-batches of whole groups.
  Its metrics are listed in `posttrain.llm.train.step_log`.
- A reward that could not be computed (NaN from a verifier: no verdict within its budget) is never
  scored 0: its group is left out of the loss (``RolloutBatch.judged`` / ``loss_mask``; the group's K
  rewards become a placeholder 0 so its advantages are finite) and counted in the step's
  ``unjudged`` / ``excluded_groups`` metrics; a step with no judged group makes no optimizer update.
  Rewards computed by rollout stages (RAIL branches) that come back NaN are scored 0 and counted in
  ``unjudged_stage``; stages that rebuild the batch (replay, RAIL) do not carry ``judged`` over.
- Data-parallel (``torch.distributed``, DDP or FSDP2, `posttrain.llm.train.parallel`): every rank samples
  the same G problems and keeps its contiguous share of the groups; the aggregation normaliser is
  all-reduced so the loss and the averaged gradient equal one process on the global batch.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import aggregate, masked_mean
from posttrain.estimators.aggregation import normaliser
from posttrain.llm.config import RunConfig
from posttrain.llm.methods.algorithm import Algorithm, UpdateContext, update_seed
from posttrain.llm.methods.needs import NEEDS, Filler, Need, Source, read, write
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.engine import RolloutEngine, SamplingConfig
from posttrain.llm.rollout.shared_prefix import recorded_groups
from posttrain.llm.rollout.stages import RolloutStage, StepContext
from posttrain.llm.rollout.tasks import Problem, Task
from posttrain.llm.rollout.text import decode_responses, score_responses
from posttrain.llm.train import checkpoint
from posttrain.llm.train.optim import module_parameters, optimization
from posttrain.llm.train.parallel import (
    average_gradients,
    clip_gradients,
    gradient_sync,
    rank_and_world,
    synced_engine,
)
from posttrain.llm.train.pending import Generated, RolloutMaker, rollout_source
from posttrain.llm.train.rundir import CHECKSUMS
from posttrain.llm.train.step_log import policy_cost, step_flops, step_metrics

__all__ = ["Filler", "Trainer", "policy_cost"]


class Trainer:
    """Owns the model, optimizer, data stream and run directory; `fit` runs the loop.

    Args:
        cfg: the run configuration. model: the policy (an HF causal LM, possibly wrapped in DDP or sharded
            with FSDP2's ``fully_shard``). tokenizer: its tokenizer. task: samples problems, scores completions.
        engine: the rollout engine. algorithm: the method's callables.
        sampling: the run's sampling settings (the engine's): the training forward, the stages, the hooks
            and the evaluation use its temperature.
        out_dir: run directory (``metrics.jsonl``, ``checkpoints/``); None writes nothing.
        fillers: the filler of each need of the algorithm that a filler provides (`NEEDS`), by `Need`
            (or its name).
        stages: rollout stages, called in order (`posttrain.llm.rollout.stages`).
    """

    def __init__(
        self,
        cfg: RunConfig,
        *,
        model: Any,
        tokenizer: Any,
        task: Task,
        engine: RolloutEngine,
        algorithm: Algorithm,
        sampling: SamplingConfig,
        out_dir: str | Path | None = None,
        fillers: Mapping[Need, Filler] | Mapping[str, Filler] | None = None,
        stages: Sequence[RolloutStage] = (),
    ) -> None:
        self.cfg, self.model, self.tokenizer = cfg, model, tokenizer
        self.engine, self.algorithm, self.stages = engine, algorithm, tuple(stages)
        self.sampling = sampling
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.fillers: dict[Need, Filler] = {Need(k): f for k, f in (fillers or {}).items()}
        self.policy_cost = policy_cost(model)
        filled = [n for n in algorithm.needs if NEEDS[n].source is Source.FILLER]
        missing = sorted(str(n) for n in filled if n not in self.fillers)
        if missing:
            raise ValueError(
                f"algorithm needs {missing} but the trainer has no way to compute them (e.g. set model.teacher)"
            )
        self.optimizer, self.scheduler = optimization(cfg.optim, model, modules=algorithm.modules)  # + its modules
        self.val_scores: list[float] = []
        self.data_rng = random.Random(cfg.seed)
        self.step = 0
        self.rank, self.world = rank_and_world()
        if cfg.data.prompts_per_step % self.world:
            raise ValueError(
                f"data.prompts_per_step={cfg.data.prompts_per_step} must be a multiple of the world size {self.world}"
            )
        self.prompt_format = cfg.model.prompt_format()
        self.maker = RolloutMaker(
            tokenizer, task, engine, cfg.data.prompts_per_step, cfg.seed, self.rank, self.world,
            **self.prompt_format.options(),
        )  # fmt: skip
        self.rollouts = rollout_source(
            cfg.rollout, policy=self.policy, tokenizer=tokenizer, task=task, sampling=sampling,
            n=self.fresh_samples(), maker=self.maker,
        )  # fmt: skip
        self.generated: Generated | None = None  # the current step's batch as generated
        self.context: StepContext | None = None  # the current step's, for the stages' hooks
        self.stage_logs: dict[str, float] = {}
        self.stage_unjudged = 0
        self.resumed_with: dict[str, list[Any]] | None = None
        """The resumable config keys a resume changed (``{key: [old, new]}``), logged on the next step's row."""

    @property
    def task(self) -> Task:
        """The task the rollouts are drawn from and scored by (the one `RolloutMaker` holds)."""
        return self.maker.task

    @task.setter
    def task(self, task: Task) -> None:
        self.maker = dataclasses.replace(self.maker, task=task)

    @property
    def current_algorithm(self) -> Algorithm:
        """The bundle of the step being run (``step + 1``, counted from 1): a pure function of the step counter
        and the validation scores so far."""
        return self.algorithm.at(self.step + 1, tuple(self.val_scores))

    @property
    def policy(self) -> Any:
        """The bare HF model (unwrapped from DDP; an FSDP2-sharded model is its own policy) for generation."""
        return getattr(self.model, "module", self.model)

    # ---------------------------------------------------------------- generate + score
    def fresh_samples(self) -> int:
        """Responses per prompt the engine samples for the stages to hand on ``rollout.group_size``."""
        return functools.reduce(
            lambda m, stage: stage.fresh_samples(m), reversed(self.stages), self.cfg.rollout.group_size
        )

    def generate(self, step: int) -> Generated:
        """The scored batch of training step ``step`` from the current policy, with the needs of the behaviour
        policy's forward (`NEEDS` rows marked ``behaviour``) filled now."""
        gen = self.maker(self.data_rng, step, self.step, self.fresh_samples())
        behaviour = {n for n in self.algorithm.needs if NEEDS[n].behaviour and n in self.fillers}
        return dataclasses.replace(gen, batch=self.fill(gen.batch, behaviour))

    def rollout(self) -> tuple[RolloutBatch, list[str]]:
        """This rank's share of G prompts x K scored responses of the current step (from the rollout source:
        generated now, ``rollout.staleness`` steps ago or by the worker), shaped by the stages, with needs and
        advantages."""
        gen = self.generated = self.rollouts.next(self.step, self.generate, self.data_rng)
        k = self.cfg.rollout.group_size
        self.stage_unjudged = 0
        self.context = StepContext(
            gen.step, self.cfg.optim.steps, gen.seed, self.policy, self.engine, gen.prompts,
            lambda ids, mask, m: self._stage_score(list(gen.problems), ids, mask, m), self.tokenizer.pad_token_id,
            self.sampling.temperature, gen.problems,
        )  # fmt: skip
        batch, self.stage_logs = gen.batch, {}
        for stage in self.stages:  # e.g. RAIL branches, replayed groups
            batch, logs = stage.after_rollout(batch, self.context)
            self.stage_logs.update(logs)
        if batch.group_size != k:
            raise ValueError(f"rollout stages returned groups of {batch.group_size}, expected rollout.group_size={k}")
        texts = (
            list(gen.texts) if batch is gen.batch else decode_responses(self.tokenizer, batch.response_ids, batch.mask)
        )
        return self.prepare(batch), texts

    def _stage_score(self, problems: list[Problem], ids: Tensor, mask: Tensor, n: int) -> Tensor:
        """A stage's rewards of group-major responses, ``n`` per problem: an unjudged one (NaN) is scored 0 and
        counted in ``unjudged_stage``."""
        rewards = torch.tensor(
            score_responses(self.tokenizer, self.task, problems, ids, mask, n)[0], dtype=torch.float32
        )
        bad = ~torch.isfinite(rewards)
        self.stage_unjudged += int(bad.sum())
        return torch.where(bad, torch.zeros(()), rewards)

    def fill(self, batch: RolloutBatch, needs: set[Need] | frozenset[Need], *, lagged: bool = False) -> RolloutBatch:
        """``batch`` with each need of ``needs`` it lacks filled (table order); one that no filler provides raises,
        and so does a behaviour need of a batch generated at a lag (``lagged``): the policy is no longer its own."""
        for need, row in NEEDS.items():
            if need not in needs or read(batch, need) is not None:
                continue
            if row.source is not Source.FILLER:
                hint = f"; set {' or '.join(row.requires)}" if row.requires else ""
                raise DomainError(
                    f"{need}: the method reads it ({row.doc}) but {row.source.value} did not set it{hint}"
                )
            if row.behaviour and lagged:
                raise DomainError(f"{need}: the batch lost it ({row.doc}) after it was generated, at a lag")
            with torch.no_grad():
                batch = write(batch, need, self.fillers[need](batch))
        return batch

    def prepare(self, batch: RolloutBatch) -> RolloutBatch:
        """Fill the needs of this step's bundle that fillers provide (reference/teacher log-probs, ...), in
        table order; check the ones the rollout and its stages provide; then the advantages."""
        alg = self.current_algorithm
        batch = self.fill(batch, alg.needs, lagged=self.generated is not None and self.generated.lag > 0)
        return batch.replace(advantages=alg.advantage(batch))

    # ---------------------------------------------------------------- log-probs + loss
    def micro_batches(self, batch: RolloutBatch) -> list[RolloutBatch]:
        """Whole-group slices of at most ``optim.micro_batch_size`` rows (the whole batch when unset)."""
        size = self.cfg.optim.micro_batch_size or batch.batch_size
        return [batch.rows(i, min(i + size, batch.batch_size)) for i in range(0, batch.batch_size, size)]

    def accumulate_gradients(self, batch: RolloutBatch) -> dict[str, float]:
        """Backward the aggregated loss over micro-batches; gradients equal those of the full batch.

        Each micro-batch's ``aggregate`` is rescaled by ``Z_micro / Z_global`` (see
        `normaliser`); ``Z_global`` is summed over data-parallel
        ranks and the loss multiplied by the world size, undoing DDP's gradient averaging.
        """
        alg = self.current_algorithm
        z = normaliser(
            batch.loss_mask(), alg.aggregation, horizon=alg.horizon
        )  # groups with an unjudged reward left out
        if self.world > 1:
            dist.all_reduce(z)
        parts = self.micro_batches(batch)
        sums: dict[str, float] = {"loss": 0.0, "entropy": 0.0}  # loss, then token-weighted means
        tokens = max(float(batch.loss_mask().sum()), 1.0)
        for i, mb in enumerate(parts):
            lm = mb.loss_mask()
            with gradient_sync(self.model, i == len(parts) - 1):  # reduce gradients after the last micro-batch
                logp, entropy, live = alg.log_probs(self.model, mb, temperature=self.sampling.temperature)
                tok_loss, diag = alg.token_loss(logp, entropy if alg.wants_entropy else None, mb, live)
                if not bool(lm.any()):  # every group here unjudged: no loss, but join the gradient all-reduce
                    (tok_loss.sum() * 0.0).backward()
                    continue
                scale = float(normaliser(lm, alg.aggregation, horizon=alg.horizon) / z) * self.world
                loss = aggregate(tok_loss, lm, alg.aggregation, horizon=alg.horizon) * scale
                loss.backward()
            share = float(lm.sum()) / tokens
            sums["loss"] += float(loss.detach()) / self.world
            sums["entropy"] += float(masked_mean(entropy.detach(), lm)) * share
            if mb.logp_old is not None:
                diag = {**diag, "logp_gap": masked_mean((logp.detach() - mb.logp_old).abs(), lm)}
            for key, value in diag.items():
                sums[key] = sums.get(key, 0.0) + float(value) * share
        return sums

    # ---------------------------------------------------------------- step
    def train_step(self) -> dict[str, Any]:
        """One rollout batch and ``updates_per_batch`` optimizer steps; returns the step's metrics."""
        t0 = time.perf_counter()
        batch, _ = self.rollout()  # generate, score, stages, needs, advantages
        t_gen = time.perf_counter() - t0
        self.model.train()
        alg, hook_state = self.current_algorithm, None
        hook_logs: dict[str, list[float]] = {}
        judged_groups = batch.judged_groups().sum()
        if self.world > 1:
            dist.all_reduce(judged_groups)
        stats: dict[str, Any] = {"loss": None, "entropy": None}  # a step with no judged group: no update
        logp_gap = grad_norm = shared = None  # shared: per group, its prompt computed once (the FLOP count)
        for update in range(self.cfg.optim.updates_per_batch if int(judged_groups) else 0):
            self.optimizer.zero_grad(set_to_none=True)
            update_batch = batch
            if alg.before_update is not None:  # e.g. SIS: the effective logp_old of this update
                seed = update_seed(self.cfg.seed, self.step, update, self.rank)
                ctx = UpdateContext(self.policy, update, seed, self.sampling.temperature)
                update_batch, hook_state, extra = alg.before_update(batch, hook_state, ctx)
                for key, value in extra.items():
                    hook_logs.setdefault(key, []).append(float(value))
            with recorded_groups() as groups:
                stats = self.accumulate_gradients(update_batch)  # log-probs + loss + backward
            shared = groups if shared is None else shared
            average_gradients(module_parameters(alg.modules), self.world)  # DDP/FSDP do not wrap them
            if update == 0:  # on-policy: the engine's behaviour log-probs vs the trainer's recomputation
                logp_gap = stats.get("logp_gap")
            grad_norm = clip_gradients(  # the policy's and the method's own modules' together
                list(self.model.parameters()), module_parameters(alg.modules), self.cfg.optim.max_grad_norm
            )
            self.optimizer.step()
            self.scheduler.step()
        assert self.context is not None
        for stage in self.stages:  # e.g. replay ingress of the fresh groups
            stage.after_update(batch, self.context)
        self.engine.sync_weights(self.policy)
        self.step += 1
        self.rollouts.after_step(self.policy, self.step)  # e.g. the asynchronous worker's weights
        epochs, ref_forward = self.cfg.optim.updates_per_batch, Need.LOGP_REF in alg.needs  # log
        flops = step_flops(
            batch, self.policy_cost, epochs=epochs, ref_forward=ref_forward, world=self.world, shared=shared
        )
        stage_logs = {**self.stage_logs, **({"unjudged_stage": self.stage_unjudged} if self.stage_unjudged else {})}
        assert self.generated is not None
        stage_logs |= {"rollout/version": self.generated.version, "rollout/lag": self.generated.lag}
        return step_metrics(
            self.step, batch, stats, logp_gap=logp_gap, grad_norm=grad_norm,
            lr=float(self.scheduler.get_last_lr()[0]), gen_time_s=t_gen, step_time_s=time.perf_counter() - t0, flops=flops,
            extra={**{key: sum(v) / len(v) for key, v in hook_logs.items()}, **stage_logs},
        )  # fmt: skip

    # ---------------------------------------------------------------- checkpoints
    def state(self) -> dict[str, Any]:
        """Everything besides the weights and optimizer that a resumed run needs to continue identically."""
        return {
            "step": self.step,
            "scheduler": self.scheduler.state_dict(),
            "data_rng": self.data_rng.getstate(),
            "torch_rng": torch.get_rng_state(),
            "val_scores": list(self.val_scores),
            "stages": [s.state_dict() for s in self.stages],
            "pending": self.rollouts.state_dict(),
        }

    def save(self) -> Path | None:
        """Write a checkpoint from rank 0 (under FSDP2 every rank first joins the gathering of the full state)."""
        if self.out_dir is None:
            return None
        return checkpoint.save_training_state(
            self.out_dir / "checkpoints", self.step, model=self.model, tokenizer=self.tokenizer,
            optimizer=self.optimizer, state=self.state(), keep=self.cfg.checkpoint.keep, rank=self.rank,
            modules=self.algorithm.modules,
        )  # fmt: skip

    def resume(self) -> bool:
        """Load the newest intact checkpoint of ``out_dir`` (weights, modules, optimizer, RNG, step, stages); False if none.

        Corrupt checkpoints (checksum mismatch; for one written without checksums, a load error) are set
        aside with a warning and the previous one is used. ``metrics.jsonl`` keeps the rows up to the
        loaded step (none without a checkpoint), torn lines dropped.
        """
        if self.out_dir is None:
            return False
        metrics = self.out_dir / "metrics.jsonl"
        s = None
        while s is None:
            ckpt = checkpoint.intact_checkpoint(self.out_dir / "checkpoints", set_aside_corrupt=self.rank == 0)
            if ckpt is None:
                if self.rank == 0:
                    checkpoint.truncate_metrics(metrics, 0)  # no checkpoint: the run restarts from step 0
                return False
            try:
                s = checkpoint.load_training_state(
                    ckpt, model=self.model, optimizer=self.optimizer, modules=self.algorithm.modules
                )
            except (OSError, RuntimeError, ValueError, EOFError, KeyError) as exc:
                if (ckpt / CHECKSUMS).is_file():
                    raise  # the bytes are the ones written: not corruption
                checkpoint.set_aside(ckpt, f"{type(exc).__name__}: {exc}")  # written before checksums existed
        self.scheduler.load_state_dict(s["scheduler"])
        self.data_rng.setstate(checkpoint.as_tuple(s["data_rng"]))
        torch.set_rng_state(s["torch_rng"])
        self.step = int(s["step"])
        self.val_scores = [float(v) for v in s.get("val_scores", [])]
        for stage, stage_state in zip(self.stages, s.get("stages", []), strict=True):
            stage.load_state_dict(stage_state)
        self.rollouts.load_state_dict(s.get("pending", []))
        self.engine.sync_weights(self.policy)
        if self.rank == 0:
            checkpoint.truncate_metrics(metrics, self.step)  # drop steps after the checkpoint
        return True

    # ---------------------------------------------------------------- loop + log
    def fit(
        self, *, stop_after: int | None = None, on_step: Callable[[dict[str, Any]], None] | None = None
    ) -> list[dict[str, Any]]:
        """Run until ``optim.steps`` (or ``stop_after`` more steps); checkpoint and log every step. The rollout
        source is closed when it returns or raises (the asynchronous worker stopped)."""
        try:
            return self._fit(stop_after, on_step)
        finally:
            self.rollouts.close()

    def _fit(self, stop_after: int | None, on_step: Callable[[dict[str, Any]], None] | None) -> list[dict[str, Any]]:
        history = []
        last = self.cfg.optim.steps if stop_after is None else min(self.cfg.optim.steps, self.step + stop_after)
        every = self.cfg.checkpoint.every
        while self.step < last:
            metrics = self.train_step()
            log = self.cfg.logging
            if log.eval_every and self.step % log.eval_every == 0:  # validation scores (schedules read them)
                scores = self.evaluate()
                if log.eval_metric not in scores:
                    raise ValueError(f"logging.eval_metric: expected one of {sorted(scores)}, got {log.eval_metric!r}")
                self.val_scores.append(float(scores[log.eval_metric]))
                metrics.update({f"eval/{k}": v for k, v in scores.items()})
            if self.resumed_with:
                metrics["resumed_with"], self.resumed_with = self.resumed_with, None
            history.append(metrics)
            if self.out_dir is not None and self.rank == 0:
                with open(self.out_dir / "metrics.jsonl", "a") as f:
                    f.write(json.dumps(metrics) + "\n")
            if every and self.step % every == 0:
                self.save()
            if on_step is not None:
                on_step(metrics)
        if self.step == self.cfg.optim.steps and (not every or self.step % every):
            self.save()
        return history

    def evaluate(self, ks: tuple[int, ...] = (1,)) -> dict[str, float]:
        """Held-out metrics of the current policy (see `posttrain.llm.train.evaluate.evaluate`)."""
        from posttrain.llm.train.evaluate import evaluate

        sampling = self.sampling
        return evaluate(
            self.policy, self.tokenizer, self.task, n_prompts=self.cfg.data.eval_prompts,
            n_samples=self.cfg.logging.eval_samples, ks=ks, seed=self.cfg.seed, sampling=sampling,
            **self.prompt_format.options(), engine=synced_engine(self.model, self.tokenizer, sampling),
        )  # fmt: skip
