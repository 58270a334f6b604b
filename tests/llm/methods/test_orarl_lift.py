"""OraRL in the LLM trainer (``algorithm.method: orarl`` + ``rollout.oracle``): by hand in float64, the oracle
row's round trip through every built-in task's reward, config errors, logging without oracle rows, a run."""

from __future__ import annotations

import json
import random
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from posttrain.errors import DomainError
from posttrain.estimators import AggregationMode, aggregate, clipped_ratio_loss
from posttrain.estimators.advantages import (
    orarl_oracle_advantage,
    orarl_policy_advantages,
    post_selection_correction,
    sign_balanced_selection,
)
from posttrain.llm.config import config_from_dict
from posttrain.llm.methods.algorithm import UpdateContext
from posttrain.llm.methods.catalog import build_algorithm
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.oracle import OracleConfig, OracleStage, OracleWarning
from posttrain.llm.rollout.stages import StepContext
from posttrain.llm.rollout.tasks import TASKS, Problem, make_task
from posttrain.llm.rollout.text import score_responses
from posttrain.llm.train.step_log import step_metrics
from posttrain.theory.race_flops import FlopSplit
from tests.llm._lift import record_rollouts, small_config

G, N, T = 4, 8, 5  # groups, sampled rows per group (+ 1 oracle row), response positions


def _batch(seed: int = 0) -> RolloutBatch:
    """G groups of N partial-credit rewards + an oracle row (last, synthetic), float64, ragged masks."""
    gen = torch.Generator().manual_seed(seed)
    b = G * (N + 1)
    lengths = torch.randint(1, T + 1, (b,), generator=gen)
    mask = torch.arange(T).expand(b, T) < lengths.unsqueeze(-1)
    rewards = torch.rand(G, N + 1, generator=gen, dtype=torch.float64)
    rewards[:, -1] = torch.tensor([1.0, 0.9, 1.0, 0.3], dtype=torch.float64)  # r* < mu for the last group
    rewards[1, :-1] = 0.0  # an all-fail group
    synthetic = torch.zeros(G, N + 1, dtype=torch.bool)
    synthetic[:, -1] = True
    return RolloutBatch(
        prompt_ids=torch.ones(b, 2, dtype=torch.long), prompt_mask=torch.ones(b, 2, dtype=torch.bool),
        response_ids=torch.ones(b, T, dtype=torch.long), mask=mask, rewards=rewards.reshape(-1), group_size=N + 1,
        logp_old=torch.where(mask, -torch.rand(b, T, generator=gen, dtype=torch.float64), 0.0),
        synthetic=synthetic.reshape(-1),
    )  # fmt: skip


def _by_hand(batch: RolloutBatch, k: int = 4, q_pos: int = 1, q_neg: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Stages 1-5 from the estimator parts: ``(advantages [G, N+1] with 0 on dropped rows, keep [G, N+1])``."""
    r = batch.grouped_rewards()
    pol, r_star = r[:, :-1], r[:, -1]
    a_pol, _ = orarl_policy_advantages(pol, r_star)
    a_star = orarl_oracle_advantage(pol, r_star, a_pol)
    full = torch.cat([a_pol, a_star[:, None]], dim=1)
    is_oracle = torch.zeros_like(full, dtype=torch.bool)
    is_oracle[:, -1] = True
    keep = sign_balanced_selection(full, is_oracle, keep=k, q_pos=q_pos, q_neg=q_neg)
    idx = keep.nonzero()[:, 1].reshape(G, k)  # sorted by row index
    rms_ref, sigma = a_pol.pow(2).mean(-1).sqrt(), pol.std(-1)
    active = post_selection_correction(full.gather(1, idx), is_oracle.gather(1, idx), rms_ref, sigma)
    return torch.zeros_like(full).scatter(1, idx, active), keep


def _ctx() -> UpdateContext:
    return UpdateContext(None, 0, 0, 1.0)


def test_advantages_selection_loss_and_gradients_equal_the_estimators_by_hand() -> None:
    batch = _batch()
    alg = build_algorithm(method="orarl", horizon=T, group_size=N + 1)
    assert alg.aggregation is AggregationMode.TOKEN_MEAN and "synthetic" in alg.needs
    want_adv, want_keep = _by_hand(batch)
    adv = alg.advantage(batch)
    assert adv.dtype == torch.float64
    torch.testing.assert_close(adv, want_adv.reshape(-1, 1) * batch.mask, rtol=0, atol=1e-15)
    assert alg.before_update is not None
    hooked, state, metrics = alg.before_update(batch.replace(advantages=adv), None, _ctx())
    assert torch.equal(hooked.kept, want_keep.reshape(-1)) and int(hooked.kept.sum()) == 4 * G
    assert float(metrics["orarl/kept"]) == pytest.approx(4 / (N + 1))
    again, _, _ = alg.before_update(hooked, state, _ctx())  # later updates reuse the selection
    assert torch.equal(again.kept, hooked.kept)

    gen = torch.Generator().manual_seed(1)
    logp = (
        batch.logp_old + 0.2 * torch.randn(batch.logp_old.shape, generator=gen, dtype=torch.float64)
    ).requires_grad_()
    tok, _ = alg.token_loss(logp, None, hooked)
    loss = aggregate(tok, hooked.loss_mask(), alg.aggregation, horizon=T)
    kept_mask = batch.mask & want_keep.reshape(-1, 1)
    want_tok, _ = clipped_ratio_loss(logp, batch.logp_old, want_adv.reshape(-1, 1) * batch.mask, batch.mask)
    want = (want_tok * kept_mask).sum() / kept_mask.sum()  # token mean over the kept rows only
    torch.testing.assert_close(loss, want, rtol=1e-13, atol=1e-15)
    (g,) = torch.autograd.grad(loss, logp)
    (g_want,) = torch.autograd.grad(want, logp)
    torch.testing.assert_close(g, g_want, rtol=1e-13, atol=1e-15)
    assert bool((g[~want_keep.reshape(-1)] == 0).all())  # dropped rows: no gradient


def test_all_fail_group_matches_the_papers_values() -> None:
    """Group 1 fails everywhere with r* = 1: kept (sampled, oracle) = (-0.0125 x 3, 0.0375) as in the paper."""
    batch = _batch()
    adv = build_algorithm(method="orarl", horizon=T, group_size=N + 1).advantage(batch)
    row = adv[:, 0].reshape(G, N + 1)[1]
    kept = row[row != 0]
    torch.testing.assert_close(kept, torch.tensor([-0.0125] * 3 + [0.0375], dtype=torch.float64), rtol=0, atol=1e-12)
    r = batch.grouped_rewards()[3]  # r* = 0.3 below the policy mean: w = 0, the oracle's own advantage is 0 ...
    assert float(r[-1]) < float(r[:-1].mean())
    assert float(adv[:, 0].reshape(G, N + 1)[3, -1]) >= 0.0  # ... and the post-selection projection keeps it >= 0


def test_no_pruning_keeps_every_row_and_sets_no_hook() -> None:
    batch = _batch()
    alg = build_algorithm(method="orarl", horizon=T, group_size=N + 1, options={"prune_ratio": None, "gamma": 0.0})
    assert alg.before_update is None
    r = batch.grouped_rewards()
    centred = r[:, :-1] - r[:, :-1].mean(-1, keepdim=True)  # gamma = 0: Dr.GRPO advantages on the sampled rows
    got = alg.advantage(batch)[:, 0].reshape(G, N + 1)
    torch.testing.assert_close(got[:, :-1], centred, rtol=0, atol=1e-15)


def test_batch_without_the_oracle_rows_is_refused() -> None:
    alg = build_algorithm(method="orarl", horizon=T, group_size=N + 1)
    batch = _batch()
    with pytest.raises(DomainError, match="synthetic"):
        alg.advantage(batch.replace(synthetic=None))
    wrong = batch.synthetic.reshape(G, N + 1).roll(1, dims=1).reshape(-1)  # oracle first, not last
    with pytest.raises(DomainError, match="synthetic"):
        alg.advantage(batch.replace(synthetic=wrong))


def _task_with_options(name: str, tmp_path: Path) -> Any:
    rows = [{"prompt": "3+4=", "answer": "7"}, {"prompt": "10+5=", "answer": "15"}]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    options: dict[str, dict[str, Any]] = {"jsonl": {"path": str(data)}, "dataset": {"path": str(data)}}
    options["mixture"] = {"tasks": {"add": "addition", "mult": "multiple", "count": "countdown"}}
    return make_task(name, **options.get(name, {}))


@pytest.mark.parametrize("name", sorted(TASKS.names()))
def test_every_built_in_tasks_oracle_row_scores_one_through_its_reward(
    name: str, tiny: tuple[Any, Any], tmp_path: Path
) -> None:
    """The reference solution, tokenised like a response (+ <eos>), decoded and scored by the task's reward: 1."""
    model, tok = tiny
    task = _task_with_options(name, tmp_path)
    problems = task.sample(random.Random(0), 6)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out, logs = _append_oracle(model, tok, task, problems)
    assert not [w for w in record if issubclass(w.category, OracleWarning)]
    assert out.grouped_rewards()[:, -1].tolist() == [1.0] * len(problems) and logs["oracle/below_expected"] == 0.0
    assert out.synthetic is not None and bool(out.synthetic.reshape(len(problems), -1)[:, -1].all())
    last = out.response_ids.gather(1, out.mask.sum(-1, keepdim=True) - 1)[:, 0]  # the last response token
    assert bool((last[out.synthetic] == tok.eos_token_id).all())  # tokenised like a response: ends in <eos>


def _append_oracle(model: Any, tok: Any, task: Any, problems: list[Problem], n: int = 2) -> tuple[RolloutBatch, Any]:
    """The oracle stage on ``n`` dummy sampled rows per problem, scored by the task's reward."""
    g = len(problems)
    resp = torch.full((g * n, 2), int(tok.eos_token_id))
    base = RolloutBatch(
        prompt_ids=torch.full((g * n, 3), 5), prompt_mask=torch.ones(g * n, 3, dtype=torch.bool),
        response_ids=resp, mask=torch.ones(g * n, 2, dtype=torch.bool), rewards=torch.zeros(g * n), group_size=n,
        logp_old=torch.zeros(g * n, 2),
    )  # fmt: skip

    def score(ids: torch.Tensor, mask: torch.Tensor, m: int) -> torch.Tensor:
        return torch.tensor(score_responses(tok, task, problems, ids, mask, m)[0])

    ctx = StepContext(0, 1, 0, model, None, [[5, 5, 5]] * g, score, int(tok.pad_token_id), 1.0, problems)  # type: ignore[arg-type]
    stage = OracleStage(OracleConfig(), tokenizer=tok, task=task, micro_batch_size=n + 1)
    assert stage.fresh_samples(n + 1) == n
    return stage.after_rollout(base, ctx)


def test_a_serialiser_that_does_not_round_trip_is_counted_and_warned(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny

    class Broken:  # a serialiser mismatch: the reward's parser rejects the written answer
        def reward(self, problem: Problem, completion: str) -> float:
            return float(completion.strip() == problem.answer)

        def solution(self, problem: Problem, rng: random.Random) -> str:
            return problem.answer + "0"

    problems = [Problem("3+4=", "7"), Problem("1+1=", "2")]
    with pytest.warns(OracleWarning, match="below expected_reward"):
        out, logs = _append_oracle(model, tok, Broken(), problems)
    assert logs["oracle/below_expected"] == 2.0 and out.grouped_rewards()[:, -1].tolist() == [0.0, 0.0]


def test_oracle_logp_old_is_the_policys_forward(tiny: tuple[Any, Any]) -> None:
    from posttrain.llm.rollout.logprobs import token_logprobs

    model, tok = tiny
    out, _ = _append_oracle(model, tok, make_task("addition", digits=1), [Problem("3+4=", "7", (3, 4))] * 2)
    with torch.no_grad():
        want, _ = token_logprobs(model, out.prompt_ids, out.prompt_mask, out.response_ids, out.mask)
    assert out.logp_old is not None
    torch.testing.assert_close(out.logp_old, want)
    assert bool((out.logp_old[out.synthetic].sum(-1) < 0).all())  # the oracle row has its own log-probs


@pytest.mark.parametrize(
    ("algorithm", "rollout", "key"),
    [
        ({"method": "orarl"}, {"group_size": 9}, "rollout.oracle"),
        ({"method": "orarl", "options": {"q_pos": 2}}, {"group_size": 9, "oracle": {}}, "algorithm.options.q_pos"),
        ({"method": "orarl", "options": {"prune_ratio": 1.0}}, {"group_size": 9, "oracle": {}}, "algorithm.options.prune_ratio"),
        ({"method": "orarl"}, {"group_size": 3, "oracle": {}}, "algorithm.options.prune_ratio"),
        ({"method": "orarl", "options": {"gamma": -1.0}}, {"group_size": 9, "oracle": {}}, "algorithm.options.gamma"),
        ({"method": "orarl", "options": {"gamma": "x"}}, {"group_size": 9, "oracle": {}}, "algorithm.options.gamma"),
        ({"method": "orarl", "options": {"oracle_mode": "x"}}, {"group_size": 9, "oracle": {}}, "algorithm.options.oracle_mode"),
        ({"method": "orarl", "options": {"group_size": 9}}, {"group_size": 9, "oracle": {}}, "algorithm.options"),
        ({"method": "orarl"}, {"group_size": 9, "oracle": {"expected_reward": "x"}}, "rollout.oracle.expected_reward"),
        ({"method": "orarl"}, {"group_size": 9, "oracle": {}, "replay": {}}, "rollout.oracle"),
    ],
)  # fmt: skip
def test_config_errors_name_the_key(algorithm: dict[str, Any], rollout: dict[str, Any], key: str) -> None:
    with pytest.raises(DomainError, match=key.replace(".", r"\.")):
        config_from_dict({"algorithm": algorithm, "rollout": rollout})


def test_naive_injection_is_grpo_on_the_oracle_rows() -> None:
    """Another method with rollout.oracle trains on the oracle row as sampled (GRPO: naive injection): accepted."""
    cfg = config_from_dict({"algorithm": {"method": "grpo"}, "rollout": {"group_size": 9, "oracle": {}}})
    assert cfg.rollout.oracle == OracleConfig()


def test_logged_reward_and_length_leave_out_synthetic_rows() -> None:
    batch = _batch()
    row = step_metrics(
        1, batch, {"entropy": 0.0, "loss": 0.0}, logp_gap=None, grad_norm=None, lr=0.0, gen_time_s=0.0,
        step_time_s=0.0, flops=FlopSplit(0.0, 0.0, 0.0), extra={},
    )  # fmt: skip
    sampled = ~batch.synthetic
    assert row["reward_mean"] == pytest.approx(float(batch.rewards[sampled].mean()), abs=1e-12)
    assert row["reward_std"] == pytest.approx(float(batch.rewards[sampled].std()), abs=1e-12)
    assert row["response_len"] == pytest.approx(float(batch.mask[sampled].sum(-1).double().mean()), abs=1e-12)
    assert row["reward_mean"] != pytest.approx(float(batch.rewards.mean()), abs=1e-6)  # the oracle would change it


def test_two_steps_end_to_end(tmp_path: Path) -> None:
    """``posttrain.llm.run.train`` on the tiny model: 4 + 1 rows per group, K = 2 kept (oracle + 1 positive)."""
    from posttrain.llm.run import build_trainer

    algorithm = {"method": "orarl", "options": {"q_pos": 1, "q_neg": 0}}
    cfg = small_config(algorithm=algorithm, rollout={"group_size": 5, "oracle": {}})
    trainer = build_trainer(cfg, tmp_path / "run")
    batches = record_rollouts(trainer)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    history = trainer.fit()
    assert len(history) == 2
    for h, b in zip(history, batches, strict=True):
        assert b.group_size == 5 and b.synthetic is not None and int(b.synthetic.sum()) == 4
        assert h["reward_mean"] == pytest.approx(float(b.rewards[~b.synthetic].mean()), abs=1e-6)
        assert h["oracle/reward_mean"] == 1.0 and h["oracle/below_expected"] == 0.0
        assert h["orarl/kept"] == pytest.approx(2 / 5)
        assert h["logp_gap"] < 1e-5  # logp_old: the trainer's own forward for every row
        for key in ("orarl/gain", "orarl/oracle_advantage", "orarl/flips", "loss", "step_time_s"):
            assert key in h
    assert any(not torch.equal(a, p) for a, p in zip(before, trainer.model.parameters(), strict=True))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]


def test_example_config_loads() -> None:
    from posttrain.llm.config import load_config

    example = Path(__file__).resolve().parents[3] / "examples" / "orarl_tiny_cpu.yaml"
    cfg = load_config(example)
    assert cfg.algorithm.method == "orarl" and cfg.rollout.oracle is not None and cfg.rollout.group_size == 9
    grpo = load_config(
        example, ["algorithm.method=grpo", "algorithm.options={}", "rollout.oracle=null", "rollout.group_size=8"]
    )
    assert grpo.rollout.oracle is None
