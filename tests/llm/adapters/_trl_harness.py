"""TRL's own GRPOTrainer code on fixed float64 inputs: generation and the model's log-probs are stubbed, the rest runs.

`Stubbed` replaces ``_generate`` (fixed prompt and completion ids, optional vLLM log-probs) and
``_get_per_token_logps_and_entropies`` (fixed ``[B, T]`` float64 log-probs: the behaviour's under no-grad, the
reference model's, and a leaf with gradient for the loss). Everything else is TRL's: masking of truncated
completions, old/reference/vLLM log-probs and the mismatch weights, the advantages (in float64: the default
dtype is float64 while scoring), ``_compute_loss``. The adapter's trainer is the same class with the same stubs,
so the two differ only by the adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

EOS, PAD, TOKEN = 3, 0, 9  # the tiny tokenizer's <eos> and <pad>, and an ordinary token


@dataclass
class Batch:
    """One generation batch: ids, per-function rewards and the log-probs the stubbed model returns."""

    completion_ids: list[list[int]]
    rewards: list[list[float | None]]  # [B][F]
    old: torch.Tensor  # [B, T] behaviour (no-grad forward)
    logp: torch.Tensor  # [B, T] current policy (the loss's forward; a fresh leaf per call)
    ref: torch.Tensor  # [B, T] reference model
    sampling: list[list[float]] | None  # the vLLM log-probs per completion
    entropy: torch.Tensor

    @property
    def size(self) -> int:
        return len(self.completion_ids)


def random_batch(
    seed: int,
    *,
    b: int = 8,
    k: int = 4,
    t: int = 5,
    funcs: int = 1,
    vllm: bool = False,
    spread: float = 0.3,
) -> Batch:
    """Random lengths 1..t, about a third of the completions truncated (no EOS), float32-exact rewards with a
    constant group and a tie, log-probs ``old``, ``old + N(0, spread^2)`` (ratios beyond the clip bounds) and a
    reference near them."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b,), generator=gen).tolist()
    lengths[0] = t  # the padded width is t
    truncated = (torch.rand(b, generator=gen) < 0.35).tolist()
    truncated[1], truncated[2] = False, True  # both kinds occur
    ids = [[TOKEN] * (n - 1) + [TOKEN + 1 if cut else EOS] for n, cut in zip(lengths, truncated, strict=True)]
    rewards = torch.randn(b, funcs, generator=gen).float().double()
    rewards[k : 2 * k, 0] = 0.5  # a constant group
    rewards[1, 0] = rewards[0, 0]  # a tie
    table: list[list[float | None]] = rewards.tolist()
    if funcs > 1:
        for i in range(0, b, 3):
            table[i][1] = None  # a function that does not score this completion
    old = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 3
    logp = old + spread * torch.randn(b, t, generator=gen, dtype=torch.float64)
    ref = old + 0.5 * torch.randn(b, t, generator=gen, dtype=torch.float64)
    sampling = None
    if vllm:
        noisy = old + 0.2 * torch.randn(b, t, generator=gen, dtype=torch.float64)
        sampling = [noisy[i, :n].tolist() for i, n in enumerate(lengths)]
    entropy = torch.rand(b, t, generator=gen, dtype=torch.float64)
    return Batch(ids, table, old, logp, ref, sampling, entropy)


class Stubbed:
    """Mixin before a ``GRPOTrainer`` class: generation and log-probs from ``self.batch`` (a `Batch`)."""

    batch: Batch
    loss_logp: torch.Tensor | None = None

    def _generate(self, prompts: list[Any]) -> tuple[Any, ...]:
        b = self.batch
        prompt_ids = [[5, 6, 7]] * b.size
        return prompt_ids, b.completion_ids, None, ["x"] * b.size, b.sampling, {}, None, []

    def _get_per_token_logps_and_entropies(
        self, model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int, *_: Any, **kw: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        b = self.batch
        if getattr(self, "ref_model", None) is not None and model is self.ref_model:
            lp = b.ref
        elif not torch.is_grad_enabled():
            lp = b.old
        else:
            self.loss_logp = b.logp.clone().requires_grad_()
            lp = self.loss_logp
        return lp[:, -logits_to_keep:], (b.entropy if kw.get("compute_entropy") else None), None


class RlooStubbed(Stubbed):
    """`Stubbed` for TRL's ``RLOOTrainer`` (its ``_generate`` returns ids and texts only)."""

    def _generate(self, prompts: list[Any]) -> tuple[Any, ...]:
        return (*super()._generate(prompts)[:2], ["x"] * self.batch.size)


def reward_functions(holder: list[Batch], funcs: int) -> list[Any]:
    """TRL reward functions reading column ``f`` of ``holder[0].rewards``."""

    def make(f: int) -> Any:
        def reward(prompts: list[Any], completions: list[Any], **_: Any) -> list[float | None]:
            return [row[f] for row in holder[0].rewards]

        reward.__name__ = f"reward_{f}"
        return reward

    return [make(f) for f in range(funcs)]


def build(
    trainer_class: type,
    config_class: type,
    tiny_dir: Path,
    out: Path,
    batch: Batch,
    *,
    mixin: type = Stubbed,
    **config: Any,
) -> Any:
    """A trainer of ``trainer_class`` (with ``mixin`` before it) on the tiny model, scoring ``batch``."""
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer

    funcs = len(batch.rewards[0])
    base: dict[str, Any] = {
        "output_dir": str(out),
        "use_cpu": True,
        "per_device_train_batch_size": batch.size,
        "per_device_eval_batch_size": batch.size,
        "num_generations": 4,
        "max_completion_length": batch.logp.shape[1],
        "report_to": [],
        "save_strategy": "no",
        "disable_tqdm": True,
        "log_level": "error",
        "bf16": False,
        "seed": 0,
    }
    stubbed = type(f"Stubbed{trainer_class.__name__}", (mixin, trainer_class), {})
    holder = [batch]
    trainer = stubbed(
        model=AutoModelForCausalLM.from_pretrained(tiny_dir),
        reward_funcs=reward_functions(holder, funcs),
        args=config_class(**(base | config)),
        train_dataset=datasets.Dataset.from_list([{"prompt": "ab"}] * 16),
        processing_class=AutoTokenizer.from_pretrained(tiny_dir),
    )
    trainer.batch = batch
    return trainer


def score(trainer: Any, *, train: bool = True, vllm: bool = False) -> dict[str, Any]:
    """TRL's ``_generate_and_score_completions`` on the trainer's batch, in float64."""
    trainer.model.train(train)
    if vllm:  # vLLM cannot start on CPU: its flag is set after construction, the mismatch code is TRL's
        trainer.use_vllm = True
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return dict(trainer._generate_and_score_completions([{"prompt": "ab"}] * trainer.batch.size))
    finally:
        torch.set_default_dtype(default)


def loss_and_grad(trainer: Any, inputs: dict[str, Any], *, accumulation: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer's ``_compute_loss`` on ``inputs`` and its gradient with respect to the current log-probs."""
    trainer.current_gradient_accumulation_steps = accumulation  # set by HF's loop during training
    loss = trainer._compute_loss(trainer.model, inputs)
    (grad,) = torch.autograd.grad(loss, trainer.loss_logp)
    return loss.detach(), grad
