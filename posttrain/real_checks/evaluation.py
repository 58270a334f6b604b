"""Held-out evaluation that keeps every sample: per prompt, its rewards, final answers and domain.

The prompts are the trainer's held-out stream for the run's seed (`held_out_problems`: an RNG stream
training never uses), so the arms of one seed are scored on the same prompts and their per-seed
difference is paired; each seed draws its own prompts, so differences across seeds are independent
draws over prompts as well as over training. Metrics are functions of the stored samples
(`posttrain.real_checks.metrics`): unbiased pass@k for every k up to the samples per prompt, accuracy,
answer entropy.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from posttrain.llm.rollout.numbers import last_number

__all__ = ["CHUNK_PROMPTS", "evaluate_model"]

CHUNK_PROMPTS = 25
"""Held-out prompts generated per call (bounds the memory of the logits and of the entropy forward)."""
_ENTROPY_ROWS = 32


def _answer(text: str) -> str:
    value = last_number(text)
    return "" if value is None else repr(value)


def evaluate_model(model_dir: str | Path, config: Any, *, prompts: int, samples: int, seed: int) -> dict[str, Any]:
    """Score ``model_dir`` on ``prompts`` held-out problems of ``config``'s task, ``samples`` samples each.

    Returns ``{"rewards": [[...] per prompt], "answers": [[...]], "texts": [[...]], "domains": [...],
    "entropy": mean token entropy (nats), "response_len": mean tokens, "eval_s": wall seconds,
    "generated": samples generated}``; sampling is the run's (``rollout`` section), seeded per chunk.
    """
    from posttrain.llm.rollout.engine import HFEngine
    from posttrain.llm.rollout.logprobs import token_logprobs
    from posttrain.llm.rollout.tasks import make_task
    from posttrain.llm.rollout.text import score_responses
    from posttrain.llm.run import load_model
    from posttrain.llm.train.evaluate import HELD_OUT_OFFSET, held_out_problems

    start = time.perf_counter()
    model, tokenizer = load_model(model_dir, config)
    model.eval()
    task = make_task(config.data.task, **config.data.options)
    problems = held_out_problems(task, seed, prompts)
    sampling = config.rollout.sampling()
    engine = HFEngine(model, pad_id=tokenizer.pad_token_id, eos_id=tokenizer.eos_token_id, sampling=sampling)
    out: dict[str, Any] = {"rewards": [], "answers": [], "texts": [], "domains": []}
    ent_sum, tokens = 0.0, 0
    lengths: list[int] = []
    for c, lo in enumerate(range(0, prompts, CHUNK_PROMPTS)):
        chunk = problems[lo : lo + CHUNK_PROMPTS]
        ids = config.model.prompt_format().encode(tokenizer, [p.prompt for p in chunk])
        r = engine.generate(ids, n=samples, seed=seed + HELD_OUT_OFFSET + c)
        rewards, texts = score_responses(tokenizer, task, chunk, r.response_ids, r.mask, samples)
        for i, p in enumerate(chunk):
            row = slice(i * samples, (i + 1) * samples)
            out["rewards"].append([float(x) for x in rewards[row]])
            out["texts"].append(list(texts[row]))
            out["answers"].append([_answer(t) for t in texts[row]])
            out["domains"].append(p.domain)
        lengths.extend(int(n) for n in r.mask.sum(dim=1))
        with torch.no_grad():
            for s in range(0, r.response_ids.shape[0], _ENTROPY_ROWS):
                rows = slice(s, s + _ENTROPY_ROWS)
                _, ent = token_logprobs(model, r.prompt_ids[rows], r.prompt_mask[rows], r.response_ids[rows],
                                        r.mask[rows], temperature=sampling.temperature, with_entropy=True)  # fmt: skip
                assert ent is not None
                ent_sum += float(ent[r.mask[rows]].double().sum())
                tokens += int(r.mask[rows].sum())
    out["entropy"] = ent_sum / tokens if tokens else float("nan")
    out["response_len"] = sum(lengths) / len(lengths) if lengths else float("nan")
    out["generated"] = prompts * samples
    out["eval_s"] = time.perf_counter() - start
    return out
