"""The DPO training loop: a non-RL mode beside the SFT warm-up, on labelled pairs from a file.

One step: ``dpo.batch_size`` pairs (reshuffled epochs over the file, ``random.Random(seed)``),
their policy sequence log-probs (gradient accumulated over ``dpo.micro_batch_size`` pairs), the
reference log-probs (computed once for every pair before the first step: the reference is
frozen), `dpo_pair_loss` averaged over the pairs, gradient clipping (``optim.max_grad_norm``),
the ``optim`` optimizer and schedule, a ``metrics.jsonl`` row, a checkpoint every
``checkpoint.every`` steps and at the end.

Metrics per step: ``step``, ``loss``, ``reward_accuracy`` (share of the labelled, non-tied pairs
with implicit-reward margin ``u > 0``), ``margin``, ``chosen_reward``, ``rejected_reward`` (means of
the implicit rewards), ``ties`` (tied pairs in the batch), ``grad_norm``, ``lr``, ``step_time_s``,
``epoch``; every ``logging.eval_every`` steps ``eval/pairs_loss``, ``eval/pairs_accuracy`` on
``dpo.eval_pairs`` and the held-out task metrics ``eval/...`` of `posttrain.llm.train.evaluate`.

Simplifications: single process (no data parallel), no resume (a checkpoint holds the weights and
the optimizer state, not the data position), no padding-free packing of chosen and rejected rows.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from posttrain.llm.methods.dpo import dpo_pair_loss, encode_pairs, sequence_logprobs
from posttrain.llm.methods.pairs import PreferencePair
from posttrain.llm.train import checkpoint
from posttrain.llm.train.optim import optimization
from posttrain.llm.train.parallel import clip_gradients
from posttrain.llm.train.rundir import append_jsonl

if TYPE_CHECKING:
    from posttrain.llm.config import RunConfig

__all__ = ["pair_logprobs", "pair_metrics", "train_dpo"]


def _chunks(n: int, size: int) -> Iterator[slice]:
    for i in range(0, n, size):
        yield slice(i, min(i + size, n))


def pair_logprobs(
    model: Any, tokenizer: Any, pairs: Sequence[PreferencePair], cfg: RunConfig, *, chunk: int = 64
) -> Tensor:
    """``[2N]`` sequence log-probs (chosen rows first) of ``pairs`` under ``model``, no gradient, ``chunk`` pairs a forward."""
    device = next(model.parameters()).device
    chosen, rejected = [], []
    with torch.no_grad():
        for s in _chunks(len(pairs), chunk):
            enc = encode_pairs(tokenizer, pairs[s], **cfg.model.prompt_format().options())
            lp = sequence_logprobs(model, enc.to(device))
            chosen.append(lp[: enc.num_pairs])
            rejected.append(lp[enc.num_pairs :])
    return torch.cat(chosen + rejected)


def pair_metrics(
    model: Any, tokenizer: Any, pairs: Sequence[PreferencePair], logp_ref: Tensor, cfg: RunConfig
) -> dict[str, float]:
    """DPO loss and implicit-reward accuracy (non-tied pairs, ``u > 0``) of ``model`` on ``pairs``, no gradient."""
    logp = pair_logprobs(model, tokenizer, pairs, cfg)
    tie = torch.tensor([p.tie for p in pairs], device=logp.device)
    loss, diag = dpo_pair_loss(logp, logp_ref, tie, beta=cfg.dpo.beta, label_smoothing=cfg.dpo.label_smoothing)
    strict = ~tie
    acc = float(diag.accuracy[strict].mean()) if bool(strict.any()) else float("nan")
    return {"pairs_loss": float(loss.mean()), "pairs_accuracy": acc, "pairs_margin": float(diag.margin.mean())}


def _order(n: int, rng: random.Random) -> Iterator[tuple[int, int]]:
    """``(epoch, index)`` forever: a fresh permutation of ``range(n)`` per epoch."""
    epoch = 0
    while True:
        perm = list(range(n))
        rng.shuffle(perm)
        for i in perm:
            yield epoch, i
        epoch += 1


def train_dpo(
    cfg: RunConfig,
    *,
    model: Any,
    reference: Any,
    tokenizer: Any,
    pairs: Sequence[PreferencePair],
    out_dir: str | Path | None = None,
    eval_pairs: Sequence[PreferencePair] = (),
    evaluate: Callable[[Any], dict[str, float]] | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Train ``model`` in place for ``optim.steps`` DPO steps against the frozen ``reference``; returns the metric rows.

    ``evaluate(model)``: held-out task metrics (logged as ``eval/<key>`` every ``logging.eval_every`` steps).
    """
    d, out = cfg.dpo, Path(out_dir) if out_dir is not None else None
    device = next(model.parameters()).device
    reference.eval().requires_grad_(False)
    ref_logp = pair_logprobs(reference, tokenizer, pairs, cfg)  # [2N], once: the reference is frozen
    ref_eval = pair_logprobs(reference, tokenizer, eval_pairs, cfg) if eval_pairs else None
    n = len(pairs)
    optimizer, scheduler = optimization(cfg.optim, model)
    stream = _order(n, random.Random(cfg.seed))
    history: list[dict[str, Any]] = []
    every = cfg.checkpoint.every
    for step in range(1, cfg.optim.steps + 1):
        t0 = time.perf_counter()
        drawn = [next(stream) for _ in range(d.batch_size)]
        idx = [i for _, i in drawn]
        model.train()
        optimizer.zero_grad(set_to_none=True)
        losses, margins, accs, chosen_r, rejected_r, ties = [], [], [], [], [], []
        for s in _chunks(len(idx), d.micro_batch_size or len(idx)):
            part = [pairs[i] for i in idx[s]]
            enc = encode_pairs(tokenizer, part, **cfg.model.prompt_format().options())
            enc = enc.to(device)
            rows = torch.tensor(idx[s], device=device)
            ref = torch.cat([ref_logp[rows], ref_logp[rows + n]])
            loss, diag = dpo_pair_loss(
                sequence_logprobs(model, enc), ref, enc.tie, beta=d.beta, label_smoothing=d.label_smoothing
            )
            (loss.sum() / len(idx)).backward()  # the batch mean, accumulated over micro-batches
            losses.append(loss.detach())
            margins.append(diag.margin)
            accs.append(diag.accuracy[~enc.tie])
            chosen_r.append(diag.chosen_rewards)
            rejected_r.append(diag.rejected_rewards)
            ties.append(enc.tie)
        grad_norm = clip_gradients([p for p in model.parameters() if p.requires_grad], [], cfg.optim.max_grad_norm)
        optimizer.step()
        scheduler.step()
        acc = torch.cat(accs)
        row: dict[str, Any] = {
            "step": step,
            "loss": float(torch.cat(losses).mean()),
            "reward_accuracy": float(acc.mean()) if acc.numel() else None,
            "margin": float(torch.cat(margins).mean()),
            "chosen_reward": float(torch.cat(chosen_r).mean()),
            "rejected_reward": float(torch.cat(rejected_r).mean()),
            "ties": int(torch.cat(ties).sum()),
            "grad_norm": grad_norm,
            "lr": float(scheduler.get_last_lr()[0]),
            "step_time_s": time.perf_counter() - t0,
            "epoch": drawn[-1][0],
        }
        if cfg.logging.eval_every and step % cfg.logging.eval_every == 0:
            model.eval()
            if ref_eval is not None:
                row.update(
                    {f"eval/{k}": v for k, v in pair_metrics(model, tokenizer, eval_pairs, ref_eval, cfg).items()}
                )
            if evaluate is not None:
                row.update({f"eval/{k}": v for k, v in evaluate(model).items()})
        history.append(row)
        if out is not None:
            append_jsonl(out / "metrics.jsonl", row)
            if (every and step % every == 0) or step == cfg.optim.steps:
                state = {"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
                checkpoint.save_checkpoint(out / "checkpoints", step, model=model, tokenizer=tokenizer, state=state,
                                           keep=cfg.checkpoint.keep)  # fmt: skip
        if on_step is not None:
            on_step(row)
    return history
