r"""Which pairs to label for DPO, on a causal LM: a completion pool in, the designed pairs out.

Han, Goyal, Ma (2026), "Which Pairs to Compare for LLM Post-Training?", arXiv:2606.19607. The
offline step of `posttrain pairs design` (the command is assembled in `posttrain.llm.run_pairs`):

1. a pool of ``K`` completions for each of ``G`` prompts sampled from the reference policy
   $\pi_0$ by the rollout engine;
2. features $\phi(x, y)$: the hidden state of one layer (default the last) at the last token of
   ``x + y`` (`pool_forward`, one forward that also gives the sequence log-prob
   $\log\pi_0(y|x)$ at temperature 1);
3. the design of `posttrain.theory.dpo_pair_selection.select_pairs`: standardise, PCA,
   $g_e = \beta(\phi_a - \phi_b)$, the $\pi_0$-weighted curvature $\hat I(\theta_0)$ (weights from
   the sequence log-probs renormalised over each prompt's pool), Frank-Wolfe on
   $\mathrm{tr}(\hat I A(q)^{-1})$ with ridge, a seeded draw without replacement (per-prompt cap);
4. labels from the task's reward when it has a verifier (`label_pairs`): the completion with the
   higher reward is ``chosen``; equal rewards are ties, counted and excluded or kept (``pairs.ties``).

Rows of the pairs file (`PreferencePair`, JSONL): ``prompt``, ``chosen``, ``rejected`` (or
``completion_a``/``completion_b`` when unlabelled), ``q`` (the design weight of the edge),
``prompt_index``, ``pair`` (the two completion indices in the pool), ``rewards``, ``tie``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from posttrain.errors import DomainError
from posttrain.estimators import zero_off_mask
from posttrain.llm.rollout.logprobs import position_ids, sampled_logprobs, widened
from posttrain.llm.typed import Checked, OneOf, Range

__all__ = [
    "DESIGNS",
    "LABELS",
    "TIES",
    "PairDesignConfig",
    "PreferencePair",
    "label_pairs",
    "pool_forward",
    "read_pairs",
    "write_pairs",
]

DESIGNS = ("optimal", "uniform")
LABELS = ("reward", "none")
TIES = ("exclude", "keep")
_POSITIVE = Range(0.0, None, low_open=True)


@dataclass(frozen=True)
class PairDesignConfig(Checked):
    """``posttrain pairs design``: the pool, its features and the pair design (Han, Goyal, Ma 2026).

    The pool is ``prompts`` x ``completions`` samples of the SFT'd policy with the ``rollout``
    section's sampling (engine, ``max_new_tokens``, temperature); ``n_pairs`` pairs are drawn in total
    (``per_prompt: true``: per prompt) from the design, at most ``max_per_prompt`` of one prompt.
    """

    prompts: Annotated[int, Range(1, 1 << 16)] = 16
    """G: prompts in the pool."""
    completions: Annotated[int, Range(2, 1 << 12)] = 8
    """K: completions sampled per prompt (all ``C(K, 2)`` within-prompt pairs are candidates)."""
    n_pairs: Annotated[int, Range(1, 10**7)] = 32
    """Pairs to draw in total, or per prompt with ``per_prompt``."""
    per_prompt: bool = False
    """Response selection: normalise the design within each prompt and draw ``n_pairs`` per prompt."""
    max_per_prompt: Annotated[int, Range(1, 1 << 24)] | None = None
    """Cap on the pairs of one prompt in the global draw (null: no cap)."""
    design: Annotated[str, OneOf(DESIGNS)] = "optimal"
    """``optimal`` (Frank-Wolfe on the trace criterion) or ``uniform`` (every candidate edge equally: the baseline)."""
    beta: Annotated[float, _POSITIVE] = 0.1
    """DPO temperature in the edge vectors ``g_e = beta (phi_a - phi_b)`` (use the DPO run's ``dpo.beta``)."""
    ridge: Annotated[float, _POSITIVE] = 1e-3
    """lambda of ``A(q) = lambda I + sum_e q_e g_e g_e^T`` (> 0: the inverse stays defined)."""
    pca_dim: Annotated[int, Range(1, 1 << 16)] | None = 128
    """PCA dimension after standardising the features (null: keep all; at most the hidden size)."""
    layer: int = -1
    """Hidden-state layer of the features (``-1``: the last, after the final norm)."""
    max_iter: Annotated[int, Range(1, 10**7)] = 2000
    tol: Annotated[float, _POSITIVE] = 1e-3
    """Frank-Wolfe iteration cap and relative duality-gap tolerance."""
    label: Annotated[str, OneOf(LABELS)] = "reward"
    """``reward``: label each pair by the task's reward; ``none``: write ``completion_a``/``completion_b`` unlabelled."""
    ties: Annotated[str, OneOf(TIES)] = "exclude"
    """Pairs with equal rewards: ``exclude`` them from the pairs file (counted in the log) or ``keep`` them (``tie: true``)."""

    def check(self) -> None:
        """The pair counts against the pool."""
        per = self.completions * (self.completions - 1) // 2
        if self.per_prompt and self.max_per_prompt is not None:
            raise DomainError("max_per_prompt: per_prompt already fixes the pairs per prompt; set one of them")
        cap = per if self.per_prompt else self.prompts * min(per, self.max_per_prompt or per)
        if self.n_pairs > cap:
            raise DomainError(
                f"n_pairs: expected <= {cap} ({'per prompt' if self.per_prompt else 'in total'}: "
                f"{self.prompts} prompts x {self.completions} completions, max_per_prompt={self.max_per_prompt}), "
                f"got {self.n_pairs}"
            )


@torch.no_grad()
def pool_forward(
    model: Any,
    prompt_ids: Int[Tensor, "B P"],
    prompt_mask: Bool[Tensor, "B P"],
    response_ids: Int[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    layer: int = -1,
) -> tuple[Float[Tensor, "B D"], Float[Tensor, " B"]]:
    r"""Features and sequence log-probs of prompt + response rows, one forward (no gradient).

    - ``features[b]``: hidden state of ``layer`` (HF ``hidden_states[layer]``; ``-1`` is the last
      layer after the final norm) at the last response token of row ``b`` (its ``<eos>`` when it
      has one), as float32 or wider;
    - ``seq_logp[b]`` $= \sum_t m_{bt}\log\mathrm{softmax}(z_{bt})_{y_{bt}}$, temperature 1 (the
      policy's own distribution, the convention of the DPO log-probs).

    Args: prompt_ids/prompt_mask ``[B, P]`` left-padded; response_ids/mask ``[B, T]`` right-padded
    (every row at least one response token).
    """
    lengths = mask.long().sum(dim=1)
    if bool((lengths == 0).any()):
        raise DomainError("mask: every response needs at least one token")
    t = response_ids.shape[1]
    attn = torch.cat([prompt_mask, mask], dim=1).long()
    out = model(
        input_ids=torch.cat([prompt_ids, response_ids], dim=1), attention_mask=attn, position_ids=position_ids(attn),
        use_cache=False, output_hidden_states=True, logits_to_keep=t + 1,
    )  # fmt: skip
    hidden = out.hidden_states[layer]  # [B, P + T, D]
    last = prompt_ids.shape[1] + lengths - 1  # [B]
    features = widened(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])
    logp, _ = sampled_logprobs(out.logits, response_ids)
    return features, zero_off_mask(logp, mask).sum(dim=1)


@dataclass(frozen=True)
class PreferencePair:
    """One row of a pairs file; an unlabelled pair keeps its two completions in ``chosen``/``rejected``
    in draw order (written as ``completion_a``/``completion_b``)."""

    prompt: str
    chosen: str
    rejected: str
    q: float | None = None
    """Design weight ``q_e`` of the edge (None for pairs from elsewhere)."""
    prompt_index: int | None = None
    pair: tuple[int, int] | None = None
    """Pool indices of (chosen, rejected), or of (a, b) when unlabelled."""
    rewards: tuple[float, float] | None = None
    """Task rewards of (chosen, rejected)."""
    tie: bool = False
    """Equal rewards (``chosen``/``rejected`` are then in draw order; DPO trains such a pair towards ``u = 0``)."""
    labelled: bool = True
    """False: nobody has said which completion is better yet."""


def label_pairs(
    edges: np.ndarray, weights: np.ndarray, prompts: Sequence[str], texts: Sequence[Sequence[str]],
    rewards: np.ndarray | None, *, ties: str = "exclude",
) -> tuple[list[PreferencePair], dict[str, int]]:  # fmt: skip
    """Turn drawn edges ``[N, 3]`` (prompt, a, b) into pairs; ``rewards`` ``[G, K]`` (None: unlabelled).

    The completion with the higher reward is ``chosen``. A pair whose rewards are equal is a tie:
    excluded (``ties="exclude"``) or kept with ``tie=True`` in draw order; a pair with a NaN reward
    (no verdict) is left out. Returns the pairs and the counts ``drawn``, ``ties``, ``identical``
    (ties whose two texts are the same), ``unjudged``, ``written``.
    """
    if ties not in TIES:
        raise DomainError(f"ties: unknown name {ties!r}; valid: {', '.join(TIES)}")
    counts = {"drawn": int(edges.shape[0]), "ties": 0, "identical": 0, "unjudged": 0, "written": 0}
    out: list[PreferencePair] = []
    for (x, a, b), q in zip(edges.tolist(), weights.tolist(), strict=True):
        ya, yb = texts[x][a], texts[x][b]
        if rewards is None:
            out.append(PreferencePair(prompts[x], ya, yb, q, x, (a, b), labelled=False))
            continue
        ra, rb = float(rewards[x, a]), float(rewards[x, b])
        if not (math.isfinite(ra) and math.isfinite(rb)):
            counts["unjudged"] += 1
            continue
        tie = ra == rb
        if tie:
            counts["ties"] += 1
            counts["identical"] += int(ya == yb)
            if ties == "exclude":
                continue
        if rb > ra:
            (a, ya, ra), (b, yb, rb) = (b, yb, rb), (a, ya, ra)
        out.append(PreferencePair(prompts[x], ya, yb, q, x, (a, b), (ra, rb), tie))
    counts["written"] = len(out)
    return out, counts


def _row(p: PreferencePair) -> dict[str, Any]:
    row: dict[str, Any] = {"prompt": p.prompt}
    if p.labelled:
        row.update(chosen=p.chosen, rejected=p.rejected)
    else:
        row.update(completion_a=p.chosen, completion_b=p.rejected)
    extra = {"q": p.q, "prompt_index": p.prompt_index, "pair": list(p.pair) if p.pair else None,
             "rewards": list(p.rewards) if p.rewards else None, "tie": p.tie}  # fmt: skip
    return {**row, **{k: v for k, v in extra.items() if v is not None}}


def write_pairs(path: str | Path, pairs: Sequence[PreferencePair]) -> None:
    """One JSON object per line (the keys of the module docstring); unlabelled pairs as ``completion_a/b``."""
    Path(path).write_text("".join(json.dumps(_row(p)) + "\n" for p in pairs))


def read_pairs(path: str | Path, *, where: str = "dpo.pairs", labelled: bool = True) -> list[PreferencePair]:
    """Pairs from a JSONL file: ``prompt``, ``chosen``, ``rejected`` strings per line (other keys optional).

    Raises:
        DomainError: an unreadable file, a line that is not a JSON object, a missing or non-string
            ``prompt``/``chosen``/``rejected`` (with ``labelled``: an unlabelled row is refused), an
            empty file; the message names ``where``, the file and the line.
    """
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise DomainError(f"{where}: cannot read {path} ({exc.strerror or exc})") from None
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise DomainError(f"{where}: {path}:{i} is not valid JSON") from None
        if not isinstance(row, dict):
            raise DomainError(f"{where}: {path}:{i} is not a JSON object")
        is_labelled = labelled or "chosen" in row
        keys = ("chosen", "rejected") if is_labelled else ("completion_a", "completion_b")
        bad = [k for k in ("prompt", *keys) if not isinstance(row.get(k), str)]
        if bad:
            hint = " (an unlabelled pair: label it first)" if "completion_a" in row and labelled else ""
            raise DomainError(f"{where}: {path}:{i} needs string {', '.join(bad)}{hint}")
        pair, rewards = row.get("pair"), row.get("rewards")
        out.append(PreferencePair(
            row["prompt"], row[keys[0]], row[keys[1]], row.get("q"), row.get("prompt_index"),
            tuple(pair) if pair else None, tuple(rewards) if rewards else None, bool(row.get("tie", False)),
            is_labelled,
        ))  # fmt: skip
    if not out:
        raise DomainError(f"{where}: {path} holds no pairs")
    return out
