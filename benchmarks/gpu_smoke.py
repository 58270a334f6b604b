"""GPU smoke benchmark on one accelerator, with nothing but torch and transformers (no vLLM, no downloads).

A randomly initialised bf16 model of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV
heads, MLP 4864, vocabulary 151,936, tied embeddings) with SDPA attention is built from a config written
here, then, on the shared-prompt path (each prompt computed once for its K samples):

1. generation: our :class:`~posttrain.llm.rollout.engine.HFEngine`, ``--prompts`` prompts of
   ``--prompt-len`` random tokens x ``--k`` samples each (each prompt prefilled once), against
   transformers' ``model.generate`` on the same rows with every prompt repeated K times; ``--new-tokens``
   sampled at temperature 1 with no top-k/top-p cut and no end-of-sequence token (every row runs to the
   end); tokens/s for each and the peak memory of our call;
2. one training step (the policy-gradient surrogate on :func:`token_logprobs` with ``group_size=K``,
   backward, AdamW) on ``--train-groups`` groups of the generated rows, timed with CUDA events after one
   warm-up step; its MFU: ``6 N`` per token computed (N non-embedding parameters; each prompt once, each
   response token but the last) plus the LM head's ``6 V d`` at each position predicting a response token
   (attention scores are not counted), over the step time, divided by a measured bf16 matmul ceiling
   (``--matmul`` square); its peak memory; and the same step with every prompt computed K times
   (``group_size=None``), timed alike, for the ratio;
3. host syncs of the timed training step and of one short engine call, counted with
   ``torch.cuda.set_sync_debug_mode("warn")`` (each synchronising call warns once);
4. with ``--compile-decode``: the engine with ``compile_decode`` (the decode step through
   ``torch.compile``, static KV cache): the compile's wall time, tokens/s against the eager engine,
   and the number of calls at this shape after which the compile has paid for itself.

On a machine without CUDA the same code runs in float32 with ``perf_counter`` timing and reports host
syncs and peak memory as "n/a on CPU"; ``--tiny`` shrinks the model and sizes so that this takes seconds
(the CPU test runs it; the shared path is forced there, which a model that small would not take). Prints one line per result and, with ``--json PATH``, writes them.

    python -m benchmarks.gpu_smoke --compile-decode   # on the GPU machine (budget: under 8 minutes)
    python -m benchmarks.gpu_smoke --tiny     # anywhere
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from posttrain.llm.rollout import shared_prefix
from posttrain.llm.rollout.engine import HFEngine, SamplingConfig
from posttrain.llm.rollout.logprobs import token_logprobs

QWEN25_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1_000_000.0,
    "tie_word_embeddings": True,
}
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
}


def build_model(shape: dict[str, Any], *, device: torch.device, dtype: torch.dtype, seed: int) -> Any:
    """A random Qwen2 causal LM of ``shape`` (no end-of-sequence token, SDPA attention), on ``device`` in ``dtype``."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(**shape, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.to(device)


def peak_memory(fn: Callable[[], Any], device: torch.device) -> tuple[int | str, Any]:
    """Peak bytes allocated on the accelerator while ``fn`` runs, or ``"n/a on CPU"``."""
    if device.type != "cuda":
        return "n/a on CPU", fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated()), out


class Timer:
    """Elapsed seconds of a callable: CUDA events on a GPU, ``perf_counter`` otherwise."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            out = fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3, out
        t0 = time.perf_counter()
        out = fn()
        return time.perf_counter() - t0, out


def count_syncs(fn: Callable[[], Any], device: torch.device) -> tuple[int | str, Any]:
    """Host synchronisations during ``fn`` (CUDA sync debug mode ``warn``), or ``"n/a on CPU"``."""
    if device.type != "cuda":
        return "n/a on CPU", fn()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught), out


def matmul_ceiling(n: int, *, device: torch.device, dtype: torch.dtype, repeats: int = 10) -> float:
    """Measured FLOP/s of an ``n x n`` by ``n x n`` matmul in ``dtype`` (best of ``repeats``)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    timer = Timer(device)
    timer(lambda: a @ b)  # warm-up
    best = min(timer(lambda: a @ b)[0] for _ in range(repeats))
    return 2.0 * n**3 / best


def non_embedding_params(model: Any) -> int:
    emb = model.get_input_embeddings().weight
    return sum(p.numel() for p in model.parameters() if p is not emb)


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.tiny:  # the tiny model's prompts are cheaper than the prompt pass's call: share them anyway
        shared_prefix.SHARE_MIN_FLOPS = 0.0
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = TINY if args.tiny else QWEN25_05B
    model = build_model(shape, device=device, dtype=dtype, seed=args.seed)
    v = int(shape["vocab_size"])
    g = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(1, v, (args.prompts, args.prompt_len), generator=g)
    timer = Timer(device)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    res.update(dtype=str(dtype).removeprefix("torch."), prompts=args.prompts, k=args.k, new_tokens=args.new_tokens)

    # 1. generation: ours (each prompt prefilled once) vs model.generate on the repeated prompts
    engine = HFEngine(model, pad_id=0, eos_id=v, sampling=SamplingConfig(max_new_tokens=args.new_tokens))
    rows, k = prompts.tolist(), args.k
    engine.generate(rows[:2], n=2, seed=0)  # warm-up (kernels, allocator)
    peak, (secs, rollouts) = peak_memory(lambda: timer(lambda: engine.generate(rows, n=k, seed=args.seed)), device)
    res.update(engine_tokens_per_s=int(rollouts.mask.sum()) / secs, engine_peak_bytes=peak)

    def reference() -> Any:
        ids = prompts.repeat_interleave(k, dim=0).to(device)
        with torch.no_grad():
            return model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens, do_sample=True, temperature=1.0, top_k=None, top_p=None,
                pad_token_id=0,
            )  # fmt: skip

    secs, out = timer(reference)
    res["generate_tokens_per_s"] = (out.shape[1] - args.prompt_len) * out.shape[0] / secs
    res["engine_over_generate"] = res["engine_tokens_per_s"] / res["generate_tokens_per_s"]

    # 2. one training step on the shared-prompt path, timed after a warm-up step; the unshared step beside it
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    tb = min(args.train_groups * k, rollouts.mask.shape[0])
    p_ids, r_ids = rollouts.prompt_ids[:tb], rollouts.response_ids[:tb]
    p_mask, r_mask = rollouts.prompt_mask[:tb], rollouts.mask[:tb]
    adv = torch.randn(tb, 1, generator=g).to(device)

    def step(group_size: int | None) -> None:
        opt.zero_grad(set_to_none=True)
        logp, _ = token_logprobs(model, p_ids, p_mask, r_ids, r_mask, with_entropy=True, group_size=group_size)
        (-(logp * adv).sum() / r_mask.sum()).backward()  # logp is 0 off the mask; no boolean indexing (a sync)
        opt.step()

    step(k)
    syncs, _ = count_syncs(lambda: step(k), device)
    peak, (secs, _) = peak_memory(lambda: timer(lambda: step(k)), device)
    step(None)
    unshared, _ = timer(lambda: step(None))
    fed = int(p_mask[::k].sum()) + int((r_mask.sum(-1) - 1).clamp(min=0).sum())  # each prompt once, no last token
    head_positions = tb // k + int((r_mask.sum(-1) - 1).clamp(min=0).sum())  # the positions predicting a token
    flops = 6.0 * non_embedding_params(model) * fed + 6.0 * v * int(shape["hidden_size"]) * head_positions
    ceiling = matmul_ceiling(args.matmul, device=device, dtype=dtype)
    res.update(train_rows=tb, train_tokens=fed, train_step_s=secs, train_flops_per_s=flops / secs)
    res.update(matmul_ceiling_flops_per_s=ceiling, mfu=flops / secs / ceiling, train_step_host_syncs=syncs)
    res.update(train_peak_bytes=peak, train_step_unshared_s=unshared, shared_over_unshared=secs / unshared)

    # 3. host syncs of a short engine call (one per token is the end-of-batch check)
    short = HFEngine(model, pad_id=0, eos_id=v, sampling=SamplingConfig(max_new_tokens=8))
    res["engine_8_tokens_host_syncs"], _ = count_syncs(lambda: short.generate(rows[:2], n=2, seed=1), device)
    if args.compile_decode:
        res.update(compiled_decode(model, rows, v, args, timer, eager_tokens_per_s=res["engine_tokens_per_s"]))
    return res


def compiled_decode(
    model: Any, rows: list[list[int]], v: int, args: argparse.Namespace, timer: Timer, *, eager_tokens_per_s: float
) -> dict[str, Any]:
    """4. the engine with ``compile_decode``: the compile's wall time, tokens/s, and the calls it takes to pay back.

    A failed compile is reported (``compiled_error``), not raised: the other numbers stand.
    """
    model.eval()
    engine = HFEngine(
        model, pad_id=0, eos_id=v, sampling=SamplingConfig(max_new_tokens=args.new_tokens), compile_decode=True
    )
    try:
        start = time.perf_counter()
        engine.generate(rows, n=args.k, seed=args.seed)  # compiles (the first call at this shape)
        first = time.perf_counter() - start
        secs, rollouts = timer(lambda: engine.generate(rows, n=args.k, seed=args.seed))
    except Exception as exc:  # the measurement reports what went wrong
        return {"compiled_error": f"{type(exc).__name__}: {exc}"[:300]}
    tokens = int(rollouts.mask.sum())
    saved = tokens / eager_tokens_per_s - secs  # seconds a call saves against the eager engine
    return {
        "compiled_engine_tokens_per_s": tokens / secs,
        "compiled_over_eager": tokens / secs / eager_tokens_per_s,
        "compile_s": first - secs,
        "compile_payback_calls": (first - secs) / saved if saved > 0 else "never (no saving)",
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_smoke", description=__doc__)
    p.add_argument("--tiny", action="store_true", help="tiny model and sizes (CPU test)")
    p.add_argument("--prompts", type=int, default=None, help="prompts G (default 32; tiny 2)")
    p.add_argument("--k", type=int, default=None, help="samples per prompt K (default 8; tiny 2)")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens per row (default 512; tiny 8)")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default 64; tiny 6)")
    p.add_argument("--train-groups", type=int, default=None, help="groups in the training step (default 2; tiny 1)")
    p.add_argument("--matmul", type=int, default=None, help="matmul ceiling size (default 8192; tiny 128)")
    p.add_argument(
        "--compile-decode",
        action="store_true",
        help="also time the engine with compile_decode (torch.compile, static KV cache) and its compile",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args(argv)
    defaults = (2, 2, 8, 6, 1, 128) if args.tiny else (32, 8, 512, 64, 2, 8192)
    names = ("prompts", "k", "new_tokens", "prompt_len", "train_groups", "matmul")
    for name, default in zip(names, defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    res = run(args)
    for key, value in res.items():
        print(f"{key:>28}: {value:.4g}" if isinstance(value, float) else f"{key:>28}: {value}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=2)
    return res


if __name__ == "__main__":
    main()
