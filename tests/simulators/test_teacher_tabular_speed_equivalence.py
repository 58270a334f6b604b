"""The fast paths of the student-teacher tabular loop equal the plain autograd formulation bit for bit.

The reference here is the direct form: an expanded-index ``gather`` of the node rows, autograd's
dense scatter-add backward into the table, and a fresh ``torch.optim.Adam`` step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from posttrain.estimators import masked_mean, zero_off_mask
from posttrain.simulators import SeedRNG, TabularSpec, sample_sequences
from posttrain.simulators._base import log_softmax_small
from posttrain.simulators.tabular import token_logp, visited_rows
from posttrain.simulators.teacher_tabular import (
    TeacherStep,
    _RowGrad,
    _rows_token_logp,
    fixed_token_logp,
    match_reward,
    node_log_probs,
    stack_methods,
    train_with_teacher,
    visited_token_logp,
)

SPEC = TabularSpec(vocab=4, horizon=3, eos=3)


def _table(seed: int, *lead: int) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return 2.0 * torch.randn(*lead, SPEC.num_nodes, SPEC.vocab, generator=gen, dtype=torch.float64)


def _tokens(seed: int, *lead: int) -> Tensor:
    tokens = torch.randint(0, SPEC.vocab, (*lead, SPEC.horizon), generator=torch.Generator().manual_seed(seed))
    return torch.where(SPEC.response_mask(tokens), tokens, 0)  # canonical padding after EOS


def _gathered_log_probs(table: Tensor, tokens: Tensor) -> Tensor:
    """The reference `node_log_probs`: gather along the node axis with the index expanded over V."""
    lead_g, (k, t) = table.shape[:-2], tokens.shape[-2:]
    idx = SPEC.prefix_nodes(tokens).reshape(*lead_g, k * t, 1).expand(*lead_g, k * t, SPEC.vocab)
    return torch.log_softmax(table.gather(-2, idx), dim=-1).reshape(*lead_g, k, t, SPEC.vocab)


def _gathered_token_logp(table: Tensor, tokens: Tensor) -> Tensor:
    logp = _gathered_log_probs(table, tokens).gather(-1, tokens.unsqueeze(-1))[..., 0]
    return zero_off_mask(logp, SPEC.response_mask(tokens))


def _gathered_tabular_token_logp(table: Tensor, tokens: Tensor) -> Tensor:
    """The reference `posttrain.simulators.tabular.token_logp`: the expanded gather and the short log-softmax."""
    lead_g, (k, t) = table.shape[:-2], tokens.shape[-2:]
    idx = SPEC.prefix_nodes(tokens).reshape(*lead_g, k * t, 1).expand(*lead_g, k * t, SPEC.vocab)
    rows = log_softmax_small(table.gather(-2, idx))
    out = rows.gather(-1, tokens.reshape(*lead_g, k * t, 1)).reshape(*lead_g, k, t)
    return zero_off_mask(out, SPEC.response_mask(tokens))


def test_row_copies_equal_the_expanded_gather_in_value_and_gradient() -> None:
    table, tokens = _table(0, 2, 3), _tokens(1, 2, 3, 5)
    up = torch.randn(2, 3, 5, SPEC.horizon, SPEC.vocab, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for fast, slow, upstream in (
        (node_log_probs, _gathered_log_probs, up),
        (visited_token_logp, _gathered_token_logp, up[..., 0]),
        (token_logp, _gathered_tabular_token_logp, up[..., 0]),
    ):
        a, b = table.clone().requires_grad_(True), table.clone().requires_grad_(True)
        va, vb = fast(SPEC, a, tokens), slow(b, tokens)
        assert torch.equal(va, vb)
        va.backward(upstream)
        vb.backward(upstream)
        assert a.grad is not None and b.grad is not None and torch.equal(a.grad, b.grad)


def test_fixed_token_logp_equals_the_visited_rows() -> None:
    table, tokens = _table(3, 2, 3), _tokens(4, 2, 3, 6)
    assert torch.equal(fixed_token_logp(SPEC, table)(tokens), visited_token_logp(SPEC, table, tokens))


def test_row_grad_equals_autograd_step_after_step() -> None:
    # rows overlap from one step to the next, so a stale row left unzeroed would show
    table = _table(5, 2, 3)
    grad = _RowGrad(table)
    for step in range(4):
        tokens = _tokens(10 + step, 2, 3, 4)
        up = torch.randn(2, 3, 4, SPEC.horizon, generator=torch.Generator().manual_seed(20 + step), dtype=torch.float64)
        direct = step == 2  # a method that also differentiates the table itself
        ref = table.clone().requires_grad_(True)
        loss = (_gathered_token_logp(ref, tokens) * up).sum()
        (loss + (ref**2).sum() if direct else loss).backward()
        rows_idx = visited_rows(SPEC, table, tokens)
        rows = table.reshape(-1, SPEC.vocab).index_select(0, rows_idx).requires_grad_(True)
        (_rows_token_logp(SPEC, rows, tokens) * up).sum().backward()
        out = grad.assemble(rows_idx, rows.grad, 2 * table if direct else None)
        assert out is not None and ref.grad is not None and torch.equal(out, ref.grad)
    assert grad.assemble(rows_idx, None, None) is None  # no gradient at all: Adam skips the table


def _reference_train(
    theta0: Tensor,
    loss_fn: Callable[[TeacherStep], Tensor],
    reward_fn: Callable[[Tensor, Tensor], Tensor],
    *,
    steps: int,
    k: int,
    seeds: list[int],
    lr: float,
) -> Tensor:
    """The plain loop: autograd through the expanded gather, a dense gradient each step, Adam."""
    rng = SeedRNG.from_seeds(seeds, stream=0)
    s, g = theta0.shape[:2]
    theta = theta0.clone().requires_grad_(True)
    opt = torch.optim.Adam([theta], lr=lr, fused=True)
    for step in range(1, steps + 1):
        with torch.no_grad():
            tokens, mask, _ = sample_sequences(SPEC, theta.detach(), k, rng)
            rewards = reward_fn(tokens, mask)
        logp = _gathered_token_logp(theta, tokens).reshape(-1, SPEC.horizon)
        flat_mask = mask.reshape(-1, SPEC.horizon)
        ctx = TeacherStep(
            step, rewards.reshape(s * g, k), logp, logp.detach(), flat_mask, tokens, theta, torch.zeros(0, s)
        )
        per_seed = masked_mean(loss_fn(ctx).reshape(s, -1), flat_mask.reshape(s, -1), dim=-1)
        opt.zero_grad(set_to_none=True)
        per_seed.sum().backward()
        opt.step()
    return theta.detach()


def _reinforce(ctx: TeacherStep) -> Tensor:
    adv = ctx.rewards - ctx.rewards.mean(-1, keepdim=True)
    return -adv.reshape(-1, 1) * ctx.logp * ctx.mask


def _reinforce_with_pull(ctx: TeacherStep) -> Tensor:
    # also differentiates ctx.theta directly (a pull of every visited node towards uniform)
    pull = node_log_probs(SPEC, ctx.theta, ctx.tokens).mean(-1).reshape(ctx.logp.shape)
    return _reinforce(ctx) - 0.1 * pull


def test_train_with_teacher_equals_the_plain_autograd_loop() -> None:
    theta0, reward, seeds = 0.5 * _table(7, 4, 3), match_reward(_tokens(8, 4, 3, 2)), [0, 1, 0, 1]
    for second in (_reinforce, _reinforce_with_pull):
        loss = stack_methods([_reinforce, second])
        fast = train_with_teacher(SPEC, theta0, loss, reward, None, steps=8, k=5, seeds=seeds, lr=0.1).theta
        slow = _reference_train(theta0, loss, reward, steps=8, k=5, seeds=seeds, lr=0.1)
        assert not torch.equal(slow, theta0)
        if second is _reinforce:
            assert torch.equal(fast, slow)
        else:  # the direct gradient through ctx.theta may be summed in another order
            assert torch.allclose(fast, slow, rtol=0.0, atol=1e-12)
            assert not torch.equal(fast[:2], fast[2:])  # the pull moved the second method's blocks
