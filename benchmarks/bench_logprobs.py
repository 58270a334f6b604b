"""Peak memory and time of the training log-prob path: plain full log-softmax against the chunked one.

Both sides take the same logits ``[B, T + 1, V]`` (what the model returns with ``logits_to_keep``),
compute the sampled-token log-probs and the entropy of ``T`` positions at temperature 0.9, and
backward a weighted sum of the log-probs (the entropy is logged, not in the loss):

- ``plain``: the previous path, ``log_softmax(widened(logits[:, :-1]) / tau)`` over the whole
  ``[B, T, V]`` in float32, then ``gather``, and :func:`posttrain.estimators.token_entropy` on the same
  float32 logits, with gradient tracking;
- ``chunked``: :func:`posttrain.llm.rollout.logprobs.sampled_logprobs` (blocks of positions,
  logsumexp and gather, backward recomputing each block, entropy without gradient).

Each (variant, V) runs in a fresh subprocess. Peak memory is the rise of the process's resident
high-water mark (``ru_maxrss``) over its value once the logits exist, so the logits themselves are
not counted; "saved" is the bytes autograd keeps for backward (distinct storages seen by
``torch.autograd.graph.saved_tensors_hooks``, the logits included). Time is the best of
``--repeats`` forward + backward calls (wall time, one thread). Ratios are chunked / plain.

    python -m benchmarks.bench_logprobs [--b 8] [--t 256] [--vocab 49152 151936] [--dtype bfloat16]

This is a measurement: the exit status is 0 whichever side wins.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from typing import Any

import torch

from benchmarks._timing import load_average
from posttrain.estimators import token_entropy
from posttrain.llm.rollout.logprobs import sampled_logprobs, widened

TAU = 0.9
VARIANTS = ("plain", "chunked")


def _plain(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    z = widened(logits[:, :-1]) / TAU
    logp = torch.log_softmax(z, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp, token_entropy(z)


def _chunked(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logp, entropy = sampled_logprobs(logits, targets, temperature=TAU, with_entropy=True)
    assert entropy is not None
    return logp, entropy


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def worker(variant: str, b: int, t: int, v: int, dtype: str, repeats: int) -> dict[str, Any]:
    """One variant in this process: peak memory rise, bytes saved for backward, best time."""
    torch.set_num_threads(1)
    fn = _plain if variant == "plain" else _chunked
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(b, t + 1, v, generator=g, dtype=getattr(torch, dtype)).requires_grad_(
        True
    )  # no wider temporary
    targets = torch.randint(0, v, (b, t), generator=g)
    weights = torch.randn(b, t, generator=g)
    base = _maxrss_bytes()
    saved: dict[int, int] = {}

    def pack(x: torch.Tensor) -> torch.Tensor:
        saved[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        return x

    best = float("inf")
    for i in range(repeats):
        logits.grad = None
        t0 = time.perf_counter()
        if i == 0:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
                logp, entropy = fn(logits, targets)
        else:
            logp, entropy = fn(logits, targets)
        (logp * weights).sum().backward()
        float(entropy.detach().mean())
        best = min(best, time.perf_counter() - t0)
        del logp, entropy
    return {"peak_bytes": _maxrss_bytes() - base, "saved_bytes": sum(saved.values()), "seconds": best}


def measure(variant: str, b: int, t: int, v: int, dtype: str, repeats: int) -> dict[str, Any]:
    """:func:`worker` in a fresh interpreter (so each peak is that variant's alone)."""
    cmd = [sys.executable, "-m", "benchmarks.bench_logprobs", "--worker", variant, "--b", str(b), "--t", str(t)]
    cmd += ["--vocab", str(v), "--dtype", dtype, "--repeats", str(repeats)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for v in args.vocab:
        res = {name: measure(name, args.b, args.t, v, args.dtype, args.repeats) for name in VARIANTS}
        rows.append({"vocab": v, **{f"{k}_{name}": val for name in VARIANTS for k, val in res[name].items()}})
    return rows


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    mib = 2**20
    lines = [f"log-probs + entropy, B x T = {args.b} x {args.t}, {args.dtype} logits, {load_average()}"]
    lines.append(f"{'V':>8} {'variant':>8} {'peak MiB':>9} {'saved MiB':>10} {'time s':>8}")
    for r in rows:
        for name in VARIANTS:
            lines.append(
                f"{r['vocab']:>8} {name:>8} {r[f'peak_bytes_{name}'] / mib:>9.0f} "
                f"{r[f'saved_bytes_{name}'] / mib:>10.0f} {r[f'seconds_{name}']:>8.3f}"
            )
        peak = r["peak_bytes_chunked"] / max(r["peak_bytes_plain"], 1)
        lines.append(
            f"{r['vocab']:>8} chunked/plain: peak {peak:.3f}, "
            f"saved {r['saved_bytes_chunked'] / max(r['saved_bytes_plain'], 1):.3f}, "
            f"time {r['seconds_chunked'] / r['seconds_plain']:.3f}"
        )
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_logprobs", description=__doc__)
    p.add_argument("--b", type=int, default=8, help="sequences B (default 8)")
    p.add_argument("--t", type=int, default=256, help="response tokens T (default 256)")
    p.add_argument("--vocab", type=int, nargs="+", default=[49152, 151936], help="vocabulary sizes V")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="logits dtype")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per variant (best is kept)")
    p.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.worker:
        res = worker(args.worker, args.b, args.t, args.vocab[0], args.dtype, args.repeats)
        print(json.dumps(res))
        return
    print(report(run(args), args))


if __name__ == "__main__":
    main()
