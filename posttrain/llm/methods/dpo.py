r"""DPO on a causal LM: labelled pairs (prompt, chosen, rejected) as token batches, and their loss.

The loss is `posttrain.estimators.losses.preference.dpo_loss` applied to *sequence* log-probs
$\ell(y|x) = \sum_t \log\pi(y_t|x, y_{<t})$ over the response tokens (temperature 1) of the
policy and of a frozen reference (Rafailov et al. 2023, arXiv:2305.18290):

$$
u = \beta\big[(\ell_w - \ell^{ref}_w) - (\ell_l - \ell^{ref}_l)\big],\qquad
\mathcal L = -(1-\varepsilon)\log\sigma(u) - \varepsilon\log\sigma(-u).
$$

A pair marked as a tie (equal task rewards, kept by the pair design) is trained with
$\varepsilon = 1/2$, the Bradley-Terry likelihood of half a win each way, which pulls $u$ to 0.
Responses are tokenised as ``text + <eos>`` (TRL's convention), prompts as the trainer encodes them.
The training loop is `posttrain.llm.train.dpo`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators import DPODiagnostics, dpo_loss
from posttrain.llm.methods.pairs import PreferencePair
from posttrain.llm.rollout.engine import left_pad
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.rollout.text import encode_prompts, right_pad
from posttrain.llm.typed import Checked, Range

__all__ = ["DpoConfig", "PairBatch", "dpo_pair_loss", "encode_pairs", "sequence_logprobs"]


@dataclass(frozen=True)
class DpoConfig(Checked):
    """``posttrain dpo``: DPO on the labelled pairs of a JSONL file, ``optim.steps`` steps of ``batch_size`` pairs.

    The policy is ``model.path`` (null: the ``initial/`` model beside the pairs file, which
    ``posttrain pairs design`` writes); the frozen reference is ``model.reference`` (null: the same
    initial model). The optimizer, schedule, clipping, checkpoints and logging are the ``optim``,
    ``checkpoint`` and ``logging`` sections'.
    """

    pairs: str | None = None
    """The training pairs (JSONL: ``prompt``, ``chosen``, ``rejected`` per line)."""
    eval_pairs: str | None = None
    """Held-out labelled pairs whose DPO loss and implicit-reward accuracy are logged every ``logging.eval_every`` steps."""
    beta: Annotated[float, Range(0.0, None, low_open=True)] = 0.1
    """KL strength / DPO temperature."""
    label_smoothing: Annotated[float, Range(0.0, 0.5, high_open=True)] = 0.0
    """Flip probability epsilon in [0, 0.5) of conservative DPO (0: plain DPO)."""
    batch_size: Annotated[int, Range(1, 1 << 16)] = 16
    """Pairs per optimizer step (drawn in reshuffled epochs over the file)."""
    micro_batch_size: Annotated[int, Range(1, 1 << 16)] | None = None
    """Pairs per forward (gradients accumulated; null: the whole batch). The files are read when the command starts."""

    def check(self) -> None:
        mb = self.micro_batch_size
        if mb is not None and mb > self.batch_size:
            raise DomainError(f"micro_batch_size: expected 1..batch_size={self.batch_size} or null, got {mb!r}")


@dataclass(frozen=True)
class PairBatch:
    """``N`` pairs as ``2N`` rows: rows ``0..N-1`` are the chosen responses, ``N..2N-1`` the rejected ones."""

    prompt_ids: Int[Tensor, "R P"]
    prompt_mask: Bool[Tensor, "R P"]
    response_ids: Int[Tensor, "R T"]
    mask: Bool[Tensor, "R T"]
    tie: Bool[Tensor, " N"]

    @property
    def num_pairs(self) -> int:
        return int(self.tie.shape[0])

    def to(self, device: Any) -> PairBatch:
        return PairBatch(
            *(t.to(device) for t in (self.prompt_ids, self.prompt_mask, self.response_ids, self.mask, self.tie))
        )


def encode_pairs(
    tokenizer: Any, pairs: Sequence[PreferencePair], *, chat_template: bool = False, system: str | None = None
) -> PairBatch:
    """Tokenise pairs: prompts as the trainer encodes them (left-padded), responses as ``text + <eos>`` (right-padded)."""
    if not pairs:
        raise DomainError("pairs: expected at least one pair")
    unlabelled = [i for i, p in enumerate(pairs) if not p.labelled]
    if unlabelled:
        raise DomainError(f"pairs: rows {unlabelled[:5]} are unlabelled (no chosen/rejected); label them first")
    prompts = encode_prompts(tokenizer, [p.prompt for p in pairs], chat_template=chat_template, system=system)
    prompt_ids, prompt_mask = left_pad(prompts + prompts, int(tokenizer.pad_token_id))
    eos = int(tokenizer.eos_token_id)
    texts = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    responses = [[*tokenizer(t, add_special_tokens=False)["input_ids"], eos] for t in texts]
    response_ids, mask = right_pad(responses, int(tokenizer.pad_token_id))
    return PairBatch(prompt_ids, prompt_mask, response_ids, mask, torch.tensor([p.tie for p in pairs]))


def sequence_logprobs(model: Any, batch: PairBatch) -> Float[Tensor, " R"]:
    r"""$\ell_r = \sum_t m_{rt}\log\pi(y_{rt}|x_r, y_{r,<t})$ of every row, temperature 1 (gradient flows outside ``no_grad``)."""
    logp, _ = token_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask)
    return logp.sum(dim=1)


def dpo_pair_loss(
    logp: Float[Tensor, " R"],
    logp_ref: Float[Tensor, " R"],
    tie: Bool[Tensor, " N"],
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[Float[Tensor, " N"], DPODiagnostics]:
    r"""Per-pair DPO loss ``[N]`` from the ``2N`` row log-probs of a `PairBatch` (chosen rows first).

    `dpo_loss` with ``label_smoothing`` on the labelled pairs and with $\varepsilon = 1/2$ on the
    ties. Returns ``(loss [N], diagnostics of the labelled form)``.

    Raises:
        ShapeError: ``logp``/``logp_ref`` not ``[2N]`` for ``tie`` ``[N]``.
    """
    n = tie.shape[0]
    if logp.shape != (2 * n,) or logp_ref.shape != (2 * n,):
        raise ShapeError(
            f"logp, logp_ref: expected [2N] = [{2 * n}] (tie is [{n}]), got {list(logp.shape)}, {list(logp_ref.shape)}"
        )
    args = (logp[:n], logp[n:], logp_ref[:n], logp_ref[n:])
    loss, diag = dpo_loss(*args, beta=beta, label_smoothing=label_smoothing)
    if bool(tie.any()):
        tied, _ = dpo_loss(*args, beta=beta, label_smoothing=0.5)
        loss = torch.where(tie, tied, loss)
    return loss, diag
