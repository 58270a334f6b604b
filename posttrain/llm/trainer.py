"""The RL trainer: one loop, generate -> score -> advantages -> log-probs -> loss -> step -> log.

Everything method-specific lives in the :class:`~posttrain.llm.algorithm.Algorithm` bundle; the
loop only fills what the bundle declares it needs (``Algorithm.needs``) and calls its callables.
The bundle of step ``s`` is ``algorithm.at(s, scores)`` (a schedule such as OPD-then-RL's switch is a
pure function of the step counter and of the validation scores logged so far, ``logging.eval_metric``
of every ``logging.eval_every``-step evaluation; unscheduled bundles return themselves). Trainable
modules the bundle owns (``Algorithm.modules``) join the optimizer as a second parameter group.

Simplifications (stated, not hidden):

- ``logp_old`` is the rollout engine's behaviour log-prob (no recomputation with the trainer's
  forward); with the HF engine the two agree to ~1e-6 in float32, with vLLM to its kernels'
  precision. No mismatch importance weights are applied.
- No critic: PPO-clip uses group-relative advantages.
- A step is: one rollout batch of G prompts x K samples, then ``updates_per_batch`` optimizer
  steps on the whole batch, each accumulating gradients over micro-batches of whole groups.
- Metrics per step (``metrics.jsonl``): ``step``, ``reward_mean``, ``reward_std``, ``kl`` (mean
  estimator value to the reference model, null without a KL term), ``entropy`` (mean token
  entropy of the sampled responses), ``response_len``, ``loss``, ``grad_norm``, ``lr``,
  ``clip_frac`` and ``policy_kl`` (last update), ``logp_gap`` (mean ``|logp_old - logp|`` at the
  first, on-policy update: the engine/trainer mismatch), ``gen_time_s``, ``step_time_s``.
- A bundle's ``before_update`` hook (e.g. SIS) runs before every optimizer step with explicit
  state threaded through the step's updates; its metrics (``sis/accept_rate``, ...) are averaged
  over the updates and logged.
- FLOPs per step (RACE accounting, :func:`posttrain.theory.race_flops.flops_per_step`, arXiv:2607.13389):
  ``flops/search``, ``flops/learning``, ``flops/reward``, ``flops/total``, ``flops/p`` from the step's
  actual prompt and response token counts, every rollout trained ``updates_per_batch`` times, a
  reference forward when the algorithm needs ``logp_ref``, a rule verifier (0 reward FLOPs). ``N``
  is :func:`policy_cost`'s count of the model's non-embedding matrices. Not counted: other filled
  needs (teacher forwards) and extra forwards a subclass adds (SIS, replay re-scoring).
- Data-parallel (``torch.distributed`` initialised, e.g. under ``torchrun``): every rank samples the
  same G problems and keeps its contiguous share of the groups; the aggregation normaliser is
  all-reduced so the loss, and the DDP-averaged gradient, equal one process on the global batch.
  The model may be DDP-wrapped or FSDP2-sharded (:mod:`posttrain.llm.parallel`); both average
  gradients over ranks. Under FSDP2 the HF engine generates with ``synced_gpus``, checkpoints hold
  the gathered full weights (rank 0 writes them) and the full optimizer state.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from posttrain.estimators import aggregate, masked_mean
from posttrain.llm.algorithm import Algorithm, UpdateContext, normaliser
from posttrain.llm.batch import RolloutBatch
from posttrain.llm.checkpoint import latest_checkpoint, load_state, save_checkpoint
from posttrain.llm.config import MODEL_OPTIMIZERS, RunConfig
from posttrain.llm.generate import HFEngine, RolloutEngine, SamplingConfig, token_logprobs
from posttrain.llm.parallel import full_state_dict, full_tensor, is_sharded, set_gradient_sync
from posttrain.llm.tasks import Task
from posttrain.llm.text import decode_responses, encode_prompts
from posttrain.theory.race_flops import FlopSplit, PolicyCost, flops_per_step

__all__ = ["Trainer", "make_optimizer", "make_scheduler", "policy_cost"]

Filler = Callable[[RolloutBatch], torch.Tensor]


def make_optimizer(cfg: RunConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """``torch.optim.<optim.name>(trainable params, lr=optim.lr, **optim.options)`` (AdamW by default), or
    an optimizer of :data:`MODEL_OPTIMIZERS` built from the model, e.g. ``MuonWithAdamW`` (Muon on hidden
    matrices, AdamW on the rest; ``options: {adamw_lr: ...}``)."""
    if cfg.optim.name in MODEL_OPTIMIZERS:
        module = importlib.import_module(MODEL_OPTIMIZERS[cfg.optim.name])
        return getattr(module, cfg.optim.name)(model, lr=cfg.optim.lr, **cfg.optim.options)  # type: ignore[no-any-return]
    params = [p for p in model.parameters() if p.requires_grad]
    opt_cls = getattr(torch.optim, cfg.optim.name)
    return opt_cls(params, lr=cfg.optim.lr, **cfg.optim.options)  # type: ignore[no-any-return]


def module_parameters(modules: tuple[torch.nn.Module, ...]) -> list[torch.nn.Parameter]:
    """The trainable parameters of an algorithm's own modules (e.g. a learned log-partition)."""
    return [p for m in modules for p in m.parameters() if p.requires_grad]


def make_scheduler(cfg: RunConfig, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``warmup_steps`` optimizer steps, then constant, linear or cosine decay to 0."""
    total = cfg.optim.steps * cfg.optim.updates_per_batch
    warm, kind = cfg.optim.warmup_steps, cfg.optim.scheduler
    shapes: dict[str, Callable[[float], float]] = {
        "constant": lambda f: 1.0,
        "linear": lambda f: 1.0 - f,
        "cosine": lambda f: 0.5 * (1.0 + math.cos(math.pi * f)),
    }
    shape = shapes[kind]

    def factor(i: int) -> float:
        if i < warm:
            return (i + 1) / warm
        return shape(min((i - warm) / max(total - warm, 1), 1.0))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def policy_cost(model: torch.nn.Module) -> PolicyCost:
    """RACE size facts of a causal LM: ``N`` = elements of its weight matrices other than the input and
    output embeddings (biases and norms excluded, as in ``posttrain flops``); ``n_layer``, ``d_model``
    from the HF config when present."""
    bare = getattr(model, "module", model)
    skip: set[int] = set()
    for get in ("get_input_embeddings", "get_output_embeddings"):
        emb = getattr(bare, get, lambda: None)()
        if emb is not None:
            skip.update(id(p) for p in emb.parameters())
    n = sum(p.numel() for p in bare.parameters() if p.ndim >= 2 and id(p) not in skip)
    config = getattr(bare, "config", None)
    return PolicyCost(
        float(n),
        n_layer=int(getattr(config, "num_hidden_layers", 0) or 0),
        d_model=int(getattr(config, "hidden_size", 0) or 0),
    )


def _world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)


class Trainer:
    """Owns the model, optimizer, data stream and run directory; :meth:`fit` runs the loop.

    Args:
        cfg: the run configuration.
        model: the policy (an HF causal LM, possibly wrapped in DDP or sharded with FSDP2's ``fully_shard``).
        tokenizer: its tokenizer.
        task: scores completions and samples problems.
        engine: the rollout engine.
        algorithm: the method's callables.
        out_dir: run directory (``metrics.jsonl``, ``checkpoints/``); None writes nothing.
        fillers: how to compute each extra batch field the algorithm may need (``logp_ref``, ...).
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
        out_dir: str | Path | None = None,
        fillers: dict[str, Filler] | None = None,
    ) -> None:
        self.cfg, self.model, self.tokenizer, self.task = cfg, model, tokenizer, task
        self.engine, self.algorithm = engine, algorithm
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.fillers = fillers or {}
        self.policy_cost = policy_cost(model)
        missing = sorted(n for n in algorithm.needs if n != "logp_old" and n not in self.fillers)
        if missing:
            raise ValueError(
                f"algorithm needs {missing} but the trainer has no way to compute them (e.g. set model.teacher)"
            )
        self.optimizer = make_optimizer(cfg, model)
        extra = module_parameters(algorithm.modules)
        if extra:
            self.optimizer.add_param_group({"params": extra})
        self.scheduler = make_scheduler(cfg, self.optimizer)
        self.val_scores: list[float] = []
        self.data_rng = random.Random(cfg.seed)
        self.step = 0
        self.rank, self.world = _world()
        if cfg.data.prompts_per_step % self.world:
            raise ValueError(
                f"data.prompts_per_step={cfg.data.prompts_per_step} must be a multiple of the world size {self.world}"
            )

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
    def rollout(self) -> tuple[RolloutBatch, list[str]]:
        """Sample this rank's share of G prompts x K responses, score them, fill needs and advantages."""
        cfg = self.cfg
        g, k = cfg.data.prompts_per_step, cfg.rollout.group_size
        problems = self.task.sample(self.data_rng, g)  # same problems on every rank
        share = g // self.world
        problems = problems[self.rank * share : (self.rank + 1) * share]
        prompts = encode_prompts(self.tokenizer, [p.prompt for p in problems], chat_template=cfg.model.chat_template)
        seed = cfg.seed * 1_000_003 + self.step * 101 + self.rank
        r = self.engine.generate(prompts, n=k, seed=seed)
        texts = decode_responses(self.tokenizer, r.response_ids, r.mask)
        rewards = torch.tensor(
            [self.task.reward(problems[i // k], t) for i, t in enumerate(texts)], dtype=torch.float32
        )
        batch = RolloutBatch(
            prompt_ids=r.prompt_ids,
            prompt_mask=r.prompt_mask,
            response_ids=r.response_ids,
            mask=r.mask,
            rewards=rewards.to(r.mask.device),
            group_size=k,
            logp_old=r.logp,
        )
        return self.prepare(batch), texts

    def prepare(self, batch: RolloutBatch) -> RolloutBatch:
        """Fill the fields this step's bundle needs (reference/teacher log-probs), then the advantages."""
        alg = self.current_algorithm
        for need in sorted(alg.needs):
            if getattr(batch, need) is None:
                with torch.no_grad():
                    batch = batch.replace(**{need: self.fillers[need](batch)})
        return batch.replace(advantages=alg.advantages(batch))

    # ---------------------------------------------------------------- log-probs + loss
    def micro_batches(self, batch: RolloutBatch) -> list[RolloutBatch]:
        """Whole-group slices of at most ``optim.micro_batch_size`` rows (the whole batch when unset)."""
        size = self.cfg.optim.micro_batch_size or batch.batch_size
        return [batch.rows(i, min(i + size, batch.batch_size)) for i in range(0, batch.batch_size, size)]

    def accumulate_gradients(self, batch: RolloutBatch) -> dict[str, float]:
        """Backward the aggregated loss over micro-batches; gradients equal those of the full batch.

        Each micro-batch's ``aggregate`` is rescaled by ``Z_micro / Z_global`` (see
        :func:`~posttrain.llm.algorithm.normaliser`); ``Z_global`` is summed over data-parallel
        ranks and the loss multiplied by the world size, undoing DDP's gradient averaging.
        """
        alg = self.current_algorithm
        z = normaliser(batch.mask, alg.aggregation, alg.horizon)
        if self.world > 1:
            dist.all_reduce(z)
        parts = self.micro_batches(batch)
        totals: dict[str, float] = {"loss": 0.0, "entropy": 0.0}
        diag_sums: dict[str, float] = {}
        tokens = float(batch.mask.sum())
        sharded = is_sharded(self.model)
        for i, mb in enumerate(parts):
            last = i == len(parts) - 1
            sync = contextlib.nullcontext() if last or not hasattr(self.model, "no_sync") else self.model.no_sync()
            if sharded:  # FSDP2: reduce-scatter only after the last micro-batch
                set_gradient_sync(self.model, last)
            with sync:
                logp, entropy = token_logprobs(
                    self.model,
                    mb.prompt_ids,
                    mb.prompt_mask,
                    mb.response_ids,
                    mb.mask,
                    temperature=self.cfg.rollout.temperature,
                    with_entropy=True,
                )
                assert entropy is not None
                tok_loss, diag = alg.token_loss(logp, entropy if alg.wants_entropy else None, mb)
                scale = float(normaliser(mb.mask, alg.aggregation, alg.horizon) / z) * self.world
                loss = aggregate(tok_loss, mb.mask, alg.aggregation, horizon=alg.horizon) * scale
                loss.backward()
            share = float(mb.mask.sum()) / tokens  # token-weighted means of the diagnostics
            totals["loss"] += float(loss.detach()) / self.world
            totals["entropy"] += float(masked_mean(entropy.detach(), mb.mask)) * share
            if mb.logp_old is not None:
                totals["logp_gap"] = (
                    totals.get("logp_gap", 0.0)
                    + float(masked_mean((logp.detach() - mb.logp_old).abs(), mb.mask)) * share
                )
            for key, value in diag.items():
                diag_sums[key] = diag_sums.get(key, 0.0) + float(value) * share
        return {**totals, **diag_sums}

    # ---------------------------------------------------------------- step
    def step_flops(self, batch: RolloutBatch) -> FlopSplit:
        """The RACE FLOP split of one step on ``batch`` (summed over data-parallel ranks)."""
        g, k = batch.num_groups, batch.group_size
        split = flops_per_step(
            batch.prompt_mask.sum(-1).reshape(g, k)[:, 0].cpu().numpy(),  # [G] (the K rows share the prompt)
            batch.mask.sum(-1).reshape(g, k).cpu().numpy(),  # [G, K]
            policy=self.policy_cost,
            epochs=self.cfg.optim.updates_per_batch,
            ref_forward="logp_ref" in self.current_algorithm.needs,
        )
        if self.world == 1:
            return split
        parts = torch.tensor([split.search, split.learning, split.reward], dtype=torch.float64)
        dist.all_reduce(parts)
        return FlopSplit(*(float(x) for x in parts))

    def train_step(self) -> dict[str, Any]:
        """One rollout batch and ``updates_per_batch`` optimizer steps; returns the step's metrics."""
        t0 = time.perf_counter()
        batch, _ = self.rollout()
        t_gen = time.perf_counter() - t0
        self.model.train()
        alg, hook_state = self.current_algorithm, None
        hook_logs: dict[str, list[float]] = {}
        for update in range(self.cfg.optim.updates_per_batch):
            self.optimizer.zero_grad(set_to_none=True)
            update_batch = batch
            if alg.before_update is not None:  # e.g. SIS: the effective logp_old of this update
                ctx = UpdateContext(
                    self.policy,
                    update,
                    self.cfg.seed * 1_000_003 + self.step * 101 + update,
                    self.cfg.rollout.temperature,
                )
                update_batch, hook_state, extra = alg.before_update(batch, hook_state, ctx)
                for key, value in extra.items():
                    hook_logs.setdefault(key, []).append(float(value))
            stats = self.accumulate_gradients(update_batch)
            self._average_module_grads(alg)
            if update == 0:  # on-policy: the engine's behaviour log-probs vs the trainer's recomputation
                logp_gap = stats.get("logp_gap")
            grad_norm = (
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.max_grad_norm)
                if self.cfg.optim.max_grad_norm is not None
                else torch.tensor(float("nan"))
            )
            self.optimizer.step()
            self.scheduler.step()
        self.engine.sync_weights(self.policy)
        self.step += 1
        kl = stats.get("kl")
        return {
            "step": self.step,
            "reward_mean": float(batch.rewards.mean()),
            "reward_std": float(batch.rewards.std()) if batch.batch_size > 1 else 0.0,
            "kl": kl,
            "entropy": stats["entropy"],
            "response_len": float(batch.mask.sum(dim=1).float().mean()),
            "loss": stats["loss"],
            "grad_norm": float(full_tensor(grad_norm)),
            "lr": self.scheduler.get_last_lr()[0],
            "clip_frac": stats.get("pg/clip_frac"),
            "policy_kl": stats.get("pg/approx_kl"),
            "logp_gap": logp_gap,
            "gen_time_s": t_gen,
            "step_time_s": time.perf_counter() - t0,
            **self.step_flops(batch).as_dict(),
            **{key: sum(values) / len(values) for key, values in hook_logs.items()},
        }

    def _average_module_grads(self, alg: Algorithm) -> None:
        """All-reduce (mean) the gradients of the algorithm's own modules, which DDP/FSDP do not wrap."""
        if self.world == 1:
            return
        for p in module_parameters(alg.modules):
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= self.world

    # ---------------------------------------------------------------- checkpoints
    def state(self) -> dict[str, Any]:
        """Everything besides the weights that a resumed run needs to continue identically."""
        return {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "data_rng": self.data_rng.getstate(),
            "torch_rng": torch.get_rng_state(),
            "val_scores": list(self.val_scores),
            "modules": [m.state_dict() for m in self.algorithm.modules],
        }

    def save(self) -> Path | None:
        """Write a checkpoint from rank 0 (under FSDP2 every rank first joins the gathering of the full state)."""
        if self.out_dir is None:
            return None
        weights, state = None, None
        if is_sharded(self.model):  # collectives: every rank gathers, rank 0 writes
            weights, state = full_state_dict(self.model), {**self.state(), "optimizer": self._full_optim_state()}
        if self.rank != 0:
            return None
        return save_checkpoint(
            self.out_dir / "checkpoints",
            self.step,
            model=self.policy,
            tokenizer=self.tokenizer,
            state=state if state is not None else self.state(),
            keep=self.cfg.checkpoint.keep,
            weights=weights,
        )

    def _full_optim_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_optimizer_state_dict(self.model, self.optimizer, options=options)  # type: ignore[no-any-return]

    def resume(self) -> bool:
        """Load the latest complete checkpoint of ``out_dir`` (weights, optimizer, RNG, step); False if none."""
        ckpt = latest_checkpoint(self.out_dir / "checkpoints") if self.out_dir is not None else None
        if ckpt is None:
            return False
        from safetensors.torch import load_file

        weights: dict[str, Any] = {}
        for shard in sorted((ckpt / "model").glob("*.safetensors")):
            weights.update(load_file(str(shard)))
        sharded = is_sharded(self.model)
        if sharded:  # every rank reads the full weights and keeps its shards
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            result = set_model_state_dict(
                self.model, weights, options=StateDictOptions(full_state_dict=True, strict=False)
            )
        else:
            result = self.policy.load_state_dict(weights, strict=False)
        tied = {"lm_head.weight"} if getattr(self.policy.config, "tie_word_embeddings", False) else set()
        if result.unexpected_keys or set(result.missing_keys) - tied:
            raise ValueError(f"checkpoint {ckpt} does not match the model: {result}")
        s = load_state(ckpt)
        if sharded:
            set_optimizer_state_dict(
                self.model, self.optimizer, s["optimizer"], options=StateDictOptions(full_state_dict=True)
            )
        else:
            self.optimizer.load_state_dict(s["optimizer"])
        self.scheduler.load_state_dict(s["scheduler"])
        self.data_rng.setstate(_as_tuple(s["data_rng"]))
        torch.set_rng_state(s["torch_rng"])
        self.step = int(s["step"])
        self.val_scores = [float(v) for v in s.get("val_scores", [])]
        for module, module_state in zip(self.algorithm.modules, s.get("modules", []), strict=True):
            module.load_state_dict(module_state)
        self.engine.sync_weights(self.policy)
        if self.out_dir is not None and (self.out_dir / "metrics.jsonl").exists():  # drop steps after the checkpoint
            lines = (self.out_dir / "metrics.jsonl").read_text().splitlines()
            kept = [ln for ln in lines if json.loads(ln).get("step", 0) <= self.step]
            (self.out_dir / "metrics.jsonl").write_text("".join(f"{ln}\n" for ln in kept))
        return True

    # ---------------------------------------------------------------- loop + log
    def fit(
        self, *, stop_after: int | None = None, on_step: Callable[[dict[str, Any]], None] | None = None
    ) -> list[dict[str, Any]]:
        """Run until ``optim.steps`` (or ``stop_after`` more steps); checkpoint and log every step."""
        history = []
        last = self.cfg.optim.steps if stop_after is None else min(self.cfg.optim.steps, self.step + stop_after)
        every = self.cfg.checkpoint.every
        while self.step < last:
            metrics = self.train_step()
            if self.cfg.logging.eval_every and self.step % self.cfg.logging.eval_every == 0:
                scores = self.evaluate()
                if self.cfg.logging.eval_metric not in scores:
                    raise ValueError(
                        f"logging.eval_metric: expected one of {sorted(scores)}, got {self.cfg.logging.eval_metric!r}"
                    )
                self.val_scores.append(float(scores[self.cfg.logging.eval_metric]))
                metrics.update({f"eval/{k}": v for k, v in scores.items()})
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
        """Held-out metrics of the current policy (see :func:`posttrain.llm.evaluate.evaluate`)."""
        from posttrain.llm.evaluate import evaluate

        r = self.cfg.rollout
        sampling = SamplingConfig(r.max_new_tokens, r.temperature, r.top_p, r.top_k)
        return evaluate(
            self.policy,
            self.tokenizer,
            self.task,
            n_prompts=self.cfg.data.eval_prompts,
            n_samples=self.cfg.logging.eval_samples,
            ks=ks,
            seed=self.cfg.seed,
            sampling=sampling,
            chat_template=self.cfg.model.chat_template,
            engine=self._synced_engine(sampling),
        )

    def _synced_engine(self, sampling: SamplingConfig) -> HFEngine | None:
        """Under FSDP2 an HF engine that keeps ranks in step (every forward is a collective); else None (the default)."""
        if not is_sharded(self.model):
            return None
        tok = self.tokenizer
        return HFEngine(
            self.policy, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, sampling=sampling, synced_gpus=True
        )


def _as_tuple(x: Any) -> Any:
    """``random.Random.setstate`` wants nested tuples (torch.load may return lists)."""
    return tuple(_as_tuple(v) for v in x) if isinstance(x, list | tuple) else x
