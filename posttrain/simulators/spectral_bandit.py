r"""Spectral contextual bandit (the paper's (docs: methods/sar.md) toy): a linear softmax policy whose base weight has a
dominant spectral subspace, trained by GRPO; batched over runs (a leading axis ``R``).

Base $W_0 = U\,\mathrm{diag}(s)\,V^\top$ (``[m, n]``, actions x input dims), inputs
$x = V_{:,C}\,c + \sigma\xi$, teacher $W^\star = W_0 + U_{:,:r_0} M^\star V_{:,:r_0}^\top$,
correct action $y^\star(x) = \arg\max W^\star x$, policy $\pi_W(y|x) = \mathrm{softmax}(Wx)$.
The exact held-out success $\mathrm{acc}(W) = \mathbb{E}_x\,\pi_W(y^\star(x)|x)$ is computed on
a fixed input set next to the sampler.

Optional shortcut cue (``cues > 0``): $j$ orthonormal input directions $Z$ (``cue_frame [n, j]``)
outside the base's row space (so $W_0 Z = W^\star Z = 0$: neither the base nor the teacher reads
them) and a Gaussian code $b_a \in \mathbb R^j$ per action (``cue_code [j, m]``). A cued input is
$x + \gamma\,Z b_{a}$ with $a = y^\star(x)$ with probability $\rho$ (the cue's reliability) and a
uniform action otherwise (`add_cue`); $\rho = 0$ makes the cue present but uninformative.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.estimators.optim import adamw_init, adamw_update
from posttrain.simulators._base import sample_categorical
from posttrain.simulators.loop import grpo_surrogate

__all__ = ["SpectralTask", "accuracy", "add_cue", "make_spectral_task", "sample_inputs", "train_grpo"]


@dataclass(frozen=True)
class SpectralTask:
    """Per-run tensors: ``w0 [R, m, n]``, ``teacher [R, m, n]``, ``frame [R, n, m]`` (V with the columns outside the
    input set C zeroed), the base's singular frames ``u [R, m, m]``, ``v [R, n, m]``, and the shortcut cue
    ``cue_frame [R, n, j]``, ``cue_code [R, j, m]`` (``j = 0``: no cue)."""

    w0: Tensor
    teacher: Tensor
    frame: Tensor
    u: Tensor
    v: Tensor
    cue_frame: Tensor
    cue_code: Tensor


def make_spectral_task(
    seed: int,
    *,
    m: int = 32,
    n: int = 64,
    r0: int = 8,
    s_hi: float = 3.0,
    s_lo: float = 0.3,
    teacher_scale: float = 1.5,
    columns: tuple[int, ...] = tuple(range(8)),
    teacher_columns: tuple[int, ...] | None = None,
    teacher_seed: int | None = None,
    cues: int = 0,
    dtype: torch.dtype = torch.float64,
) -> SpectralTask:
    """One task (unbatched: add the run axis with `torch.stack`). ``teacher_columns`` restricts
    the nonzero columns of $M^\\star$ (merging experts); inputs live on ``columns``; ``teacher_seed``
    draws $M^\\star$ from its own generator (same base, independent teachers); ``cues`` shortcut
    directions are drawn last from the seed's generator (so the rest of the task does not depend on them)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.linalg.qr(torch.randn(m, m, generator=g, dtype=dtype)).Q
    v = torch.linalg.qr(torch.randn(n, m, generator=g, dtype=dtype)).Q
    s = torch.cat([torch.full((r0,), s_hi, dtype=dtype), torch.full((m - r0,), s_lo, dtype=dtype)])
    w0 = u @ torch.diag(s) @ v.T
    gt = g if teacher_seed is None else torch.Generator().manual_seed(teacher_seed)
    mstar = teacher_scale * torch.randn(r0, r0, generator=gt, dtype=dtype)
    if teacher_columns is not None:
        keep = torch.zeros(r0, dtype=torch.bool)
        keep[list(teacher_columns)] = True
        mstar = mstar * keep.to(dtype)
    teacher = w0 + u[:, :r0] @ mstar @ v[:, :r0].T
    on = torch.zeros(m, dtype=dtype)
    on[list(columns)] = 1.0
    raw = torch.randn(n, cues, generator=g, dtype=dtype)
    cue_frame = torch.linalg.qr(raw - v @ (v.T @ raw)).Q  # orthonormal, orthogonal to the base's row space
    cue_code = torch.randn(cues, m, generator=g, dtype=dtype)
    return SpectralTask(w0, teacher, v * on, u, v, cue_frame, cue_code)  # frame: V with the columns outside C zeroed


def add_cue(
    x: Tensor, target: Tensor, task: SpectralTask, *, scale: float, reliability: float, generator: torch.Generator
) -> Tensor:
    r"""Cued inputs $x + \gamma Z b_a$ (``x [R, N, n]``, ``target [R, N]``): $a$ = the target with probability
    ``reliability``, else a uniform action; ``scale`` is $\gamma$. No cue directions: ``x`` unchanged."""
    r, count = target.shape
    j, m = task.cue_code.shape[-2:]
    if j == 0:
        return x
    keep = torch.rand(r, count, generator=generator, dtype=x.dtype) < reliability
    shown = torch.where(keep, target, torch.randint(m, (r, count), generator=generator))
    code = torch.gather(task.cue_code, 2, shown[:, None, :].expand(r, j, count))  # [R, j, N]
    return x + scale * code.mT @ task.cue_frame.mT


def sample_inputs(frame: Tensor, count: int, *, noise: float, generator: torch.Generator) -> Tensor:
    """Inputs ``[R, count, n]``: $x = F c + \\sigma \\xi$ with ``frame F [R, n, |C|]``."""
    r, n, c = frame.shape
    coef = torch.randn(r, count, c, generator=generator, dtype=frame.dtype)
    xi = torch.randn(r, count, n, generator=generator, dtype=frame.dtype)
    return coef @ frame.mT + noise * xi


def accuracy(w: Tensor, teacher: Tensor, x: Tensor) -> Tensor:
    r"""Exact success $\frac1N\sum_i \pi_W(y^\star(x_i)|x_i)$ per run, ``[R]``, for ``x [R, N, n]``."""
    target = torch.argmax(x @ teacher.mT, dim=-1, keepdim=True)
    return torch.softmax(x @ w.mT, dim=-1).gather(-1, target).squeeze(-1).mean(-1)


def train_grpo(
    task: SpectralTask,
    *,
    updates: int = 300,
    batch: int = 64,
    group: int = 8,
    lr: float = 0.01,
    noise: float = 0.3,
    cue_scale: float = 0.0,
    cue_reliability: float = 1.0,
    generator: torch.Generator,
) -> Tensor:
    """GRPO (group-normalised advantages, on-policy ratio-1 PPO loss = vanilla policy gradient, token mean)
    with Adam ascent from ``w0``, all runs at once; returns the trained ``W [R, m, n]``. With ``cue_scale > 0``
    the training inputs carry the task's shortcut cue (`add_cue`, ``cue_reliability``)."""
    w = task.w0.clone()
    state = adamw_init([w])
    for _ in range(updates):
        x = sample_inputs(task.frame, batch, noise=noise, generator=generator)  # [R, batch, n]
        target = torch.argmax(x @ task.teacher.mT, dim=-1)
        if cue_scale > 0:
            x = add_cue(x, target, task, scale=cue_scale, reliability=cue_reliability, generator=generator)
        leaf = w.detach().requires_grad_(True)
        logits = (x @ leaf.mT).repeat_interleave(group, dim=1)  # [R, batch*group, m]
        u = torch.rand(logits.shape[:-1], generator=generator, dtype=logits.dtype)
        act = sample_categorical(logits, u.unsqueeze(-1)).squeeze(-1)
        logp = torch.log_softmax(logits, -1).gather(-1, act.unsqueeze(-1)).squeeze(-1)  # [R, batch*group]
        reward = (act == target.repeat_interleave(group, dim=1)).to(w.dtype)
        loss = grpo_surrogate(logp, reward, group=group)
        (grad,) = torch.autograd.grad(loss.mean(-1).sum(), [leaf])
        with torch.no_grad():
            (up,), state = adamw_update([grad], state, [w], lr=lr, weight_decay=0.0)
            w = w + up
    return w
