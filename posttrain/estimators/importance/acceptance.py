r"""Selective importance sampling (SIS): a token-level rejection test against the behaviour policy.

Each stored token $y_t \sim \mu$ is accepted with probability $a_t = \min(1, \rho_t/M_t)$,
$M_t$ the largest ratio over the behaviour's top-K tokens; accepted tokens are treated as
on-policy (weight 1, no clipping), rejected ones keep the usual clipped importance ratio.

SIS enters a PPO-family loss through `sis_logp_old`, which returns *effective* behaviour
log-probs, equal to ``logp.detach()`` on accepted tokens and ``logp_old`` elsewhere, so
``loss(logp, sis_logp_old(...), ...)`` sees the ratio $e^{\ell - \mathrm{sg}(\ell)}$ (value 1,
gradient $\nabla\ell$) on accepted tokens. `posttrain.estimators.losses.offpolicy.sis_loss` is that
composition with the PPO clip (GRPO + SIS); `posttrain.estimators.losses.offpolicy.sis_gspo_loss` is GSPO + SIS, whose sequence ratio is taken over the
rejected tokens only (a different composition, see there).

Released form and earlier reconstruction. The authors' released code (a verl fork,
``offpolicy2onpolicy``) fixes three details that an earlier reconstruction from the paper's text
had differently; the released form is the default here:

1. acceptance has no top-K membership rule: a sampled token outside the behaviour top-K is
   accepted with probability $\min(1, \rho/M)$ like any other (the reconstruction always
   rejected it; that variant stays available by passing ``in_topk``), and a token whose
   log-ratio is exactly 0 is always accepted;
2. GSPO + SIS averages the log-ratios over the *rejected* tokens only and gives accepted tokens
   ratio 1 with no clip (the reconstruction, ``gspo_loss(logp, sis_logp_old(...))``, averaged over
   all tokens and clipped every token);
3. the divergence metrics are per-sequence means, with the rejected tokens' $|\log\rho|$
   clipped to the PPO range (the reconstruction used unclipped sums).

Reference: Li et al. 2026, "Turning Off-Policy Tokens On-Policy: A Plug-in Approach for Improving
LLM Alignment", arXiv:2607.04728; the released code (github.com/liyu199809/SIS).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posttrain.errors import ShapeError
from posttrain.estimators._numerics import zero_off_mask
from posttrain.estimators.importance.ratios import log_ratio
from posttrain.shapes import Bool, Float, Int
from posttrain.validate import check_float, check_mask, check_positive, check_same_shape, check_tensor

__all__ = ["sis_accept", "sis_acceptance_prob", "sis_divergence", "sis_logp_old", "sis_rejection_test", "token_in_topk"]


def token_in_topk(tokens: Int[Tensor, "B T"], topk_idx: Int[Tensor, "B T K"]) -> Bool[Tensor, "B T"]:
    """$I_{bt} = \\mathbb 1[y_{bt} \\in \\mathrm{topk\\_idx}_{bt,:}]$ (K = 0 gives all False).

    Examples:
        >>> token_in_topk(torch.tensor([[2, 0]]), torch.tensor([[[2, 1], [1, 3]]])).tolist()
        [[True, False]]
    """
    check_tensor("tokens", tokens, ndim=2)
    check_tensor("topk_idx", topk_idx, ndim=3)
    if topk_idx.shape[:2] != tokens.shape:
        raise ShapeError(
            f"topk_idx: expected shape [{tokens.shape[0]}, {tokens.shape[1]}, K], got {list(topk_idx.shape)}"
        )
    return (topk_idx == tokens.unsqueeze(-1)).any(dim=-1)


def sis_acceptance_prob(
    logp: Float[Tensor, "B T"],
    logp_old: Float[Tensor, "B T"],
    cur_topk_logp: Float[Tensor, "B T K"],
    old_topk_logp: Float[Tensor, "B T K"],
    in_topk: Bool[Tensor, "B T"] | None = None,
) -> Float[Tensor, "B T"]:
    r"""SIS acceptance probability $a = \min(1, \rho/M)$, computed in log space, no gradient.

    $$
    \log\rho_{bt} = \ell_{bt} - \ell^{old}_{bt},\qquad
    \log M_{bt} = \max_{k\le K}\big(\ell^{cur}_{btk} - \ell^{old}_{btk}\big),\qquad
    a_{bt} = \exp\big(\min(0, \log\rho_{bt} - \log M_{bt})\big)
    $$

    and $a = 1$ where $\log\rho = 0$ exactly (the released test accepts those whatever
    M is). With K = V (all tokens) this is exact rejection sampling: accepted proposals are
    distributed as $\pi_\theta(\cdot|s_t)$. With K < V, M may be below 1.

    Passing ``in_topk`` selects the earlier reconstruction instead: $a = I\cdot\min(1, \rho/M)$
    (a token outside the top-K is always rejected, no exact-zero rule). A support column at
    $-\infty$ under both policies makes $\log M$ undefined; such tokens get
    $a = 0$ (rejected), never NaN.

    Args:
        logp: ``[B, T]`` current-policy log-probs of the stored tokens (gradient ignored).
        logp_old: ``[B, T]`` behaviour log-probs $\log\mu$ of the stored tokens.
        cur_topk_logp: ``[B, T, K]`` current log-probs at the behaviour's top-K indices.
        old_topk_logp: ``[B, T, K]`` behaviour log-probs at those indices.
        in_topk: optional ``[B, T]`` boolean (`token_in_topk`): the top-K membership variant.

    Returns:
        ``[B, T]`` acceptance probabilities in [0, 1] (detached).

    Raises:
        ShapeError: wrong ranks, dtypes or shapes.

    Examples:
        >>> lp = torch.log(torch.tensor([[0.5, 0.2]])); lo = torch.log(torch.tensor([[0.25, 0.4]]))
        >>> cur = torch.log(torch.tensor([[[0.5, 0.3], [0.2, 0.8]]]))
        >>> old = torch.log(torch.tensor([[[0.25, 0.75], [0.4, 0.6]]]))
        >>> [round(x, 4) for x in sis_acceptance_prob(lp, lo, cur, old)[0].tolist()]
        [1.0, 0.375]
    """
    with torch.no_grad():
        a = _capped_ratio_over_envelope(logp, logp_old, cur_topk_logp, old_topk_logp, in_topk)
        a.nan_to_num_(nan=0.0)  # a support column at -inf under both policies: rejected, as sis_rejection_test does
        if in_topk is not None:
            return torch.where(in_topk, a, torch.zeros((), dtype=a.dtype, device=a.device))
        return torch.where(logp.detach() == logp_old, torch.ones((), dtype=a.dtype, device=a.device), a)


def _capped_ratio_over_envelope(
    logp: Tensor, logp_old: Tensor, cur_topk_logp: Tensor, old_topk_logp: Tensor, in_topk: Tensor | None
) -> Tensor:
    r"""Validate the rejection test's inputs; return $\exp(\min(0, \log\rho - \log M))$ (0 for K = 0)."""
    check_float("logp", logp, ndim=2)
    check_float("logp_old", logp_old)
    check_same_shape("logp", logp, logp_old=logp_old)
    check_float("cur_topk_logp", cur_topk_logp, ndim=3)
    check_float("old_topk_logp", old_topk_logp)
    check_same_shape("cur_topk_logp", cur_topk_logp, old_topk_logp=old_topk_logp)
    if cur_topk_logp.shape[:2] != logp.shape:
        raise ShapeError(
            f"cur_topk_logp: expected shape [{logp.shape[0]}, {logp.shape[1]}, K], got {list(cur_topk_logp.shape)}"
        )
    if in_topk is not None:
        check_mask("in_topk", in_topk, logp.shape)
    lr = logp.detach() - logp_old
    if cur_topk_logp.shape[-1] == 0:
        return torch.zeros_like(lr)
    log_m = (cur_topk_logp - old_topk_logp).amax(dim=-1)
    lr = lr.to(torch.promote_types(lr.dtype, log_m.dtype))  # no copy when the dtypes agree
    return lr.sub_(log_m).clamp_(max=0.0).exp_()  # in place on this function's own temporary


def sis_rejection_test(
    logp: Float[Tensor, "B T"],
    logp_old: Float[Tensor, "B T"],
    cur_topk_logp: Float[Tensor, "B T K"],
    old_topk_logp: Float[Tensor, "B T K"],
    in_topk: Bool[Tensor, "B T"] | None,
    u: Float[Tensor, "B T"],
) -> Bool[Tensor, "B T"]:
    r"""The whole rejection test in one pass: $\mathrm{acc} = \big(u < e^{\min(0, \log\rho - \log M)}\big)
    \vee (\log\rho = 0)$ (released form, ``in_topk=None``).

    Identical to ``sis_accept(sis_acceptance_prob(logp, logp_old, cur_topk_logp, old_topk_logp, in_topk), u)``
    for ``u`` in [0, 1) (same arithmetic for $a$); with ``in_topk`` given, the earlier
    top-K variant $I \wedge (u < a)$. Use it when only the outcome is needed (the trainer
    hook); no gradient.

    Args:
        logp, logp_old, cur_topk_logp, old_topk_logp, in_topk: as `sis_acceptance_prob`
            (``in_topk`` positional: ``None`` for the released test).
        u: ``[B, T]`` i.i.d. Uniform(0, 1) draws (see `sis_accept`).

    Returns:
        ``[B, T]`` boolean, the accepted tokens.

    Examples:
        >>> lp = torch.log(torch.tensor([[0.5, 0.2]])); lo = torch.log(torch.tensor([[0.25, 0.4]]))
        >>> cur = torch.log(torch.tensor([[[0.5, 0.3], [0.2, 0.8]]]))
        >>> old = torch.log(torch.tensor([[[0.25, 0.75], [0.4, 0.6]]]))
        >>> sis_rejection_test(lp, lo, cur, old, None, torch.tensor([[0.9, 0.4]])).tolist()
        [[True, False]]
    """
    with torch.no_grad():
        a = _capped_ratio_over_envelope(logp, logp_old, cur_topk_logp, old_topk_logp, in_topk)
        check_float("u", u)
        check_same_shape("logp", logp, u=u)
        if in_topk is not None:
            return (u < a).logical_and_(in_topk)
        return (u < a).logical_or_(logp.detach() == logp_old)


def sis_accept(accept_prob: Float[Tensor, "B T"], u: Float[Tensor, "B T"]) -> Bool[Tensor, "B T"]:
    r"""$\mathrm{acc} = \mathbb 1[u < a]$ with ``u`` i.i.d. Uniform(0, 1) drawn by the caller.

    Draw ``u`` from a dedicated ``torch.Generator`` (seeded per step and mini-batch) so that SIS does
    not shift any other random stream.

    Examples:
        >>> sis_accept(torch.tensor([[0.5, 1.0, 0.0]]), torch.tensor([[0.6, 0.99, 0.0]])).tolist()
        [[False, True, False]]
    """
    check_float("accept_prob", accept_prob, ndim=2)
    check_same_shape("accept_prob", accept_prob, u=u)
    check_float("u", u)
    return u < accept_prob


def sis_logp_old(
    logp: Float[Tensor, "B T"], logp_old: Float[Tensor, "B T"], accepted: Bool[Tensor, "B T"]
) -> Float[Tensor, "B T"]:
    r"""Effective behaviour log-probs that turn any ratio-based loss into its SIS version.

    $$
    \ell^{sis}_{bt} = \begin{cases}\mathrm{sg}(\ell_{bt}) & \mathrm{acc}_{bt}\\
    \ell^{old}_{bt} & \text{otherwise}\end{cases}
    \quad\Rightarrow\quad \tilde\rho_{bt} = e^{\ell_{bt} - \ell^{sis}_{bt}} \in \{1\}\cup\{\rho_{bt}\}
    $$

    On accepted tokens the ratio has value exactly 1 and gradient $\nabla\ell$, so a PPO clip
    is never active there ("clip-less"); rejected tokens keep the ordinary ratio.

    Examples:
        >>> lp = torch.tensor([[-1.0, -2.0]]); lo = torch.tensor([[-1.5, -1.0]])
        >>> sis_logp_old(lp, lo, torch.tensor([[True, False]])).tolist()
        [[-1.0, -1.0]]
    """
    check_float("logp", logp, ndim=2)
    check_float("logp_old", logp_old)
    check_same_shape("logp", logp, logp_old=logp_old)
    check_mask("accepted", accepted, logp.shape)
    return torch.where(accepted, logp.detach(), logp_old)


def sis_divergence(
    logp: Float[Tensor, "B T"],
    logp_old: Float[Tensor, "B T"],
    accepted: Bool[Tensor, "B T"],
    mask: Bool[Tensor, "B T"],
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> tuple[Float[Tensor, " B"], Float[Tensor, " B"]]:
    r"""Per-sequence divergences ``(D_orig, D_sis)`` in the released form, no gradient.

    $$
    c_{bt} = \big|\mathrm{clip}(\log\rho_{bt}, \log(1-\epsilon_{low}), \log(1+\epsilon_{high}))\big|,\qquad
    D^{orig}_b = \frac{1}{L_b}\sum_t m_{bt}\big(\mathrm{acc}_{bt}|\log\rho_{bt}| + (1-\mathrm{acc}_{bt})c_{bt}\big),\qquad
    D^{sis}_b = \frac{1}{L_b}\sum_t m_{bt}(1-\mathrm{acc}_{bt})c_{bt}
    $$

    with $L_b = \max(1, \sum_t m_{bt})$: the mean absolute log-ratio a sequence's update
    sees (rejected tokens' ratios are clipped by PPO, accepted ones count in full without SIS and
    as 0 with it). The released trainer logs their batch means. $D^{sis} \le D^{orig}$.
    The earlier reconstruction used unclipped sums $\sum_t m|\log\rho|$ (and the same with
    $1-\mathrm{acc}$), the quantity in the bound $|\prod_t\tilde\rho_t - 1| \le e^{D} - 1$.

    Args:
        logp, logp_old: ``[B, T]``. accepted, mask: ``[B, T]`` boolean.
        clip_low, clip_high: the PPO range of the rejected tokens ($\epsilon_{low} \ge 1$: no lower clip).

    Examples:
        >>> d = sis_divergence(torch.tensor([[0.1, -0.3]]), torch.zeros(1, 2),
        ...                    torch.tensor([[True, False]]), torch.ones(1, 2, dtype=torch.bool))
        >>> [round(float(x), 4) for x in (d[0][0], d[1][0])]
        [0.1616, 0.1116]
    """
    check_mask("mask", mask, logp.shape)
    check_mask("accepted", accepted, logp.shape)
    lo = math.log(1.0 - clip_low) if clip_low < 1.0 else -math.inf
    hi = math.log1p(check_positive("clip_high", clip_high))
    with torch.no_grad():
        lr = zero_off_mask(log_ratio(logp.detach(), logp_old), mask)
        length = mask.sum(-1).clamp(min=1).to(lr.dtype)
        d_sis = (lr.clamp(min=lo, max=hi).abs() * (mask & ~accepted)).sum(-1) / length
        d_orig = d_sis + (lr.abs() * (mask & accepted)).sum(-1) / length
    return d_orig, d_sis
