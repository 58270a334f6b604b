"""FlowRL in the LLM trainer: a learned log-partition log Z_phi(x) (an MLP the bundle owns) over prompt features."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from posttrain.errors import DomainError
from posttrain.estimators import AggregationMode, aggregate, flowrl_loss, flowrl_optimal_log_z
from posttrain.llm.methods.catalog import build_algorithm
from posttrain.llm.methods.flow import LogPartitionMLP
from posttrain.llm.methods.needs import prompt_feature_filler
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.run import build_trainer
from tests.llm._lift import fit_example, small_config
from tests.llm.methods.test_algorithm import _grads, _trainer


def test_loss_and_gradients_equal_flowrl_loss_by_hand(tiny: tuple[Any, Any]) -> None:
    """``method: flowrl``: the trainer's loss = ``flowrl_loss`` with log Z = the MLP of the prompt's mean hidden
    state, on the whole batch (float64); gradients of the policy and of the log-Z MLP agree."""
    model = tiny[0].double()
    options = {"beta": 3.0, "clip": 0.1, "width": 8}
    trainer = _trainer(tiny, {"method": "flowrl", "options": options},
                       fillers={"prompt_features": prompt_feature_filler(model)})  # fmt: skip
    assert trainer.algorithm.needs == {"logp_old", "logp_ref", "prompt_features"}
    (net,) = trainer.algorithm.modules
    net.double()
    batch, _ = trainer.rollout()  # FixedEngine's noisy behaviour log-probs: IS weights differ from 1
    assert batch.prompt_features is not None and batch.logp_ref is not None and batch.logp_old is not None
    hidden = model(input_ids=batch.prompt_ids[:1, -1:], output_hidden_states=True).hidden_states[-1]
    assert batch.prompt_features.shape == (batch.batch_size, hidden.shape[-1])
    stats = trainer.accumulate_gradients(batch)
    got = _grads(trainer.model) + _grads(net)
    trainer.model.zero_grad(set_to_none=True)
    net.zero_grad(set_to_none=True)
    logp, _ = token_logprobs(trainer.model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask,
                             group_size=batch.group_size)  # fmt: skip
    log_z = net(batch.prompt_features[:: batch.group_size])  # one log Z per prompt
    tok, diag = flowrl_loss(logp, batch.logp_old, batch.logp_ref, batch.grouped_rewards(), batch.mask, log_z,
                            beta=3.0, clip=0.1)  # fmt: skip
    want = aggregate(tok, batch.mask, AggregationMode.SEQ_MEAN_TOKEN_SUM)
    want.backward()
    assert stats["loss"] == pytest.approx(float(want.detach()), rel=1e-9, abs=1e-12)
    assert float(diag.clip_frac) > 0  # the IS clip is exercised
    assert stats["pg/log_z"] == pytest.approx(float(log_z.detach().mean()), rel=1e-9, abs=1e-12)
    for a, b in zip(got, _grads(trainer.model) + _grads(net), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-10)
    assert any(float(g.abs().sum()) > 0 for g in _grads(net))  # log Z receives a gradient


def test_log_partition_mlp_is_seeded_and_options_are_checked() -> None:
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    a, b, c = LogPartitionMLP(width=5, seed=1), LogPartitionMLP(width=5, seed=1), LogPartitionMLP(width=5, seed=2)
    assert torch.equal(a(x), b(x)) and not torch.equal(a(x), c(x))
    with pytest.raises(DomainError, match="width"):
        LogPartitionMLP(width=0)
    with pytest.raises(DomainError, match="beta"):
        build_algorithm(method="flowrl", horizon=4, options={"bta": 1.0})
    for bad in ({"beta": 0.0}, {"clip": 1.0}):  # at build time, naming the option
        with pytest.raises(DomainError, match=next(iter(bad))):
            build_algorithm(method="flowrl", horizon=4, options=bad)
    assert (
        build_algorithm(method="flowrl", horizon=4).modules[0]
        is not build_algorithm(method="flowrl", horizon=4).modules[0]
    )


def test_bundle_loss_drives_log_z_to_the_batch_optimum(tiny: tuple[Any, Any]) -> None:
    """Policy frozen, the bundle's own loss minimised over the log-Z MLP only (Adam, 300 steps): log Z_phi(x)
    converges to ``flowrl_optimal_log_z`` of the batch for every prompt, from an initial gap >= 10x larger."""
    model = tiny[0].double()
    trainer = _trainer(tiny, {"method": "flowrl", "options": {"beta": 3.0, "width": 16}},
                       fillers={"prompt_features": prompt_feature_filler(model)})  # fmt: skip
    alg = trainer.algorithm
    (net,) = alg.modules
    net.double()
    batch, _ = trainer.rollout()
    assert batch.prompt_features is not None and batch.logp_ref is not None and batch.logp_old is not None
    with torch.no_grad():
        logp, _ = token_logprobs(
            model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask, group_size=batch.group_size
        )
    target = flowrl_optimal_log_z(logp, batch.logp_old, batch.logp_ref, batch.grouped_rewards(), batch.mask,
                                  beta=3.0)  # fmt: skip

    def gap() -> float:
        with torch.no_grad():
            return float((net(batch.prompt_features[:: batch.group_size]) - target).abs().max())

    start = gap()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(300):
        opt.zero_grad()
        tok, _ = alg.token_loss(logp, None, batch)
        aggregate(tok, batch.mask, alg.aggregation).backward()
        opt.step()
    print("FlowRL log Z gap to the batch optimum", start, "->", gap())
    assert gap() < 1e-2 <= start / 10


def test_flowrl_run_logs_log_z_and_resumes_its_module(tmp_path: Path) -> None:
    """From a config: the hook logs log Z, its target and their gap each step, and a resumed run restores the
    log-Z MLP (and its optimizer state) from the checkpoint."""
    cfg = small_config(algorithm={"method": "flowrl", "options": {"beta": 2.0}}, steps=3)
    trainer = build_trainer(cfg, tmp_path / "run")
    history = trainer.fit()
    for h in history:
        want = abs(h["flowrl/log_z"] - h["flowrl/log_z_target"])
        assert math.isfinite(h["flowrl/log_z_gap"]) and h["flowrl/log_z_gap"] >= want - 1e-6
    resumed = build_trainer(cfg, tmp_path / "run", resume=True)
    assert resumed.step == 3
    for p, q in zip(trainer.algorithm.modules[0].parameters(), resumed.algorithm.modules[0].parameters(), strict=True):
        assert torch.equal(p.detach(), q.detach())


@pytest.mark.slow
def test_flowrl_raises_held_out_reward_after_sft(tmp_path: Path) -> None:
    """SFT warm-up then 30 FlowRL steps on tiny_cpu.yaml (seed 0): held-out reward rises by >= 0.05 and the
    learned log Z moves (the same margin and budget as the GFlowRL lift test)."""
    _, history, before, after = fit_example(tmp_path / "run", "algorithm.method=flowrl")
    log_z = [h["flowrl/log_z"] for h in history]
    gaps = [h["flowrl/log_z_gap"] for h in history]
    print("FlowRL held-out reward", before, "->", after, "log Z", log_z[0], "->", log_z[-1],
          "|log Z - target| first/last 5", sum(gaps[:5]) / 5, sum(gaps[-5:]) / 5)  # fmt: skip
    assert after - before >= 0.05
    assert sum(gaps[-5:]) < sum(gaps[:5])
