"""GARL / PAFT in the LLM trainer (``algorithm.method: garl | paft``): float64 loss and gradients against the
estimators by hand (verifier and likelihood variants, q = 0, 0.5, 1 and the limiting forms), the answer
tokens scored in the training forward, extreme log-probs, config errors, the q schedule, an end-to-end run."""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from posttrain.errors import DomainError
from posttrain.estimators import AggregationMode, aggregate, garl_loss, paft_loss, rloo_advantages
from posttrain.llm.config import config_from_dict
from posttrain.llm.methods.algorithm import UpdateContext
from posttrain.llm.methods.catalog import build_algorithm
from posttrain.llm.rollout.answer import AnswerSuffixConfig, AnswerSuffixStage
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.llm.rollout.logprobs import token_logprobs
from posttrain.llm.rollout.tasks import Problem
from posttrain.llm.tools.tiny import ALPHABET, SPECIAL_TOKENS
from posttrain.llm.train.trainer import Trainer
from tests.llm.fakes import FixedEngine, TableTask

G, K, T = 3, 4, 7
SEQ_SUM = AggregationMode.SEQ_MEAN_TOKEN_SUM


def _batch(variant: str, *, seed: int = 0, answer_logp_scale: float = 1.0, rewards: Any = None) -> RolloutBatch:
    """A float64 batch by hand: traces of 1..4 tokens; likelihood rows get 2 answer tokens after the trace."""
    gen = torch.Generator().manual_seed(seed)
    b = G * K
    lengths = torch.tensor([1 + i % 4 for i in range(b)])
    cols = torch.arange(T).unsqueeze(0)
    trace = cols < lengths.unsqueeze(1)
    answer = (cols >= lengths.unsqueeze(1)) & (cols < lengths.unsqueeze(1) + 2)
    mask = trace | answer if variant == "likelihood" else trace
    logp_old = -torch.rand(b, T, generator=gen, dtype=torch.float64) * 3 * answer_logp_scale
    if rewards is None:
        rewards = (torch.rand(b, generator=gen) < 0.5).double()
        rewards[::K] = 1.0  # every prompt has a success (so the verifier weights are not all 0)
    return RolloutBatch(
        prompt_ids=torch.ones(b, 2, dtype=torch.long), prompt_mask=torch.ones(b, 2, dtype=torch.bool),
        response_ids=torch.full((b, T), 5, dtype=torch.long), mask=mask, rewards=rewards, group_size=K,
        logp_old=torch.where(mask, logp_old, 0.0), answer_mask=answer & mask if variant == "likelihood" else None,
    )  # fmt: skip


def _log_w(batch: RolloutBatch, variant: str) -> torch.Tensor:
    if variant == "verifier":
        return batch.grouped_rewards().log()
    assert batch.answer_mask is not None and batch.logp_old is not None
    return torch.where(batch.answer_mask, batch.logp_old, 0.0).sum(-1).reshape(G, K)


def _trainer_loss(
    method: str, options: dict[str, Any], batch: RolloutBatch, logp: torch.Tensor, seed: int = 7
) -> torch.Tensor:
    """The bundle's loss on ``batch`` as the trainer computes it: advantage, hook, token loss, aggregation."""
    alg = build_algorithm(method=method, horizon=T, options=options)
    batch = batch.replace(advantages=alg.advantage(batch))
    assert alg.before_update is not None
    batch, _, metrics = alg.before_update(batch, None, UpdateContext(None, 0, seed, 1.0))
    assert all(math.isfinite(float(v)) for v in metrics.values())
    tok, _ = alg.token_loss(logp, None, batch)
    return aggregate(tok, batch.loss_mask(), alg.aggregation, horizon=T)


def _uniforms(seed: int, samples: int = 1) -> torch.Tensor:
    return torch.rand(G, samples, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _grad(loss: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, logp)
    return g


def _logp(batch: RolloutBatch, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    assert batch.logp_old is not None
    return (batch.logp_old + 0.1 * torch.randn(batch.mask.shape, generator=gen, dtype=torch.float64)).requires_grad_()


@pytest.mark.parametrize("variant", ["verifier", "likelihood"])
@pytest.mark.parametrize("q", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("method", ["garl", "paft"])
def test_loss_and_gradient_equal_the_estimators_by_hand(method: str, q: float, variant: str) -> None:
    batch = _batch(variant)
    logp = _logp(batch)
    got = _trainer_loss(method, {"q": q, "variant": variant}, batch, logp)
    am = batch.answer_mask
    trace = batch.mask if am is None else batch.mask & ~am
    if method == "garl":
        tok, _ = garl_loss(logp, trace, _log_w(batch, variant), q=q, answer_mask=am)
    else:
        tok, _ = paft_loss(logp, trace, _log_w(batch, variant), _uniforms(7), q=q, answer_mask=am)
    want = tok.sum() / (G * K)  # the estimators' reduction: every row has a token
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(_grad(got, logp), _grad(want, logp), rtol=1e-12, atol=1e-14)
    assert float(got.detach()) != 0.0


def _sequence_logp(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, logp, 0.0).sum(-1).reshape(G, K)


def test_q0_garl_is_reinforce_rloo_on_the_reward() -> None:
    """Verifier variant, q = 0: the gradient of -mean (r_m - b_m) log pi(z_m), the RLOO REINFORCE gradient."""
    batch = _batch("verifier")
    logp = _logp(batch)
    got = _trainer_loss("garl", {"q": 0.0}, batch, logp)
    want = -(rloo_advantages(batch.grouped_rewards()) * _sequence_logp(logp, batch.mask)).mean()
    torch.testing.assert_close(_grad(got, logp), _grad(want, logp), rtol=1e-12, atol=1e-14)


def test_q0_garl_likelihood_is_verifree_rloo_plus_the_pathwise_term() -> None:
    """Likelihood variant, q = 0 (RB-RLOO / VeriFree): (w_m - b_m) on the trace and w_m on the answer, w = exp(log_w)."""
    batch = _batch("likelihood")
    logp = _logp(batch)
    got = _trainer_loss("garl", {"q": 0.0, "variant": "likelihood"}, batch, logp)
    w = _log_w(batch, "likelihood").exp()
    assert batch.answer_mask is not None
    trace, answer = _sequence_logp(logp, batch.mask & ~batch.answer_mask), _sequence_logp(logp, batch.answer_mask)
    want = -(rloo_advantages(w) * trace + w * answer).mean()
    torch.testing.assert_close(_grad(got, logp), _grad(want, logp), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("variant", ["verifier", "likelihood"])
def test_q1_garl_without_baseline_is_the_self_normalised_marginal_likelihood_gradient(variant: str) -> None:
    """q = 1, b = 0 (IWAE): sum_m softmax(log w)_m grad log[pi(z_m) p(y*|z_m)], averaged over prompts."""
    batch = _batch(variant)
    logp = _logp(batch)
    got = _trainer_loss("garl", {"q": 1.0, "variant": variant, "baseline": "none"}, batch, logp)
    posterior = _log_w(batch, variant).softmax(-1)
    want = -(posterior * _sequence_logp(logp, batch.mask)).sum(-1).mean()
    torch.testing.assert_close(_grad(got, logp), _grad(want, logp), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("variant", ["verifier", "likelihood"])
def test_q1_paft_is_sft_on_the_resampled_traces(variant: str) -> None:
    """q = 1 PAFT: unweighted SFT (trace + answer) on S = 2 traces per prompt drawn by inverse CDF of w / sum w."""
    batch = _batch(variant)
    logp = _logp(batch)
    got = _trainer_loss("paft", {"q": 1.0, "variant": variant, "samples": 2}, batch, logp, seed=11)
    cdf = _log_w(batch, variant).softmax(-1).cumsum(-1)
    picks = [[int((cdf[g] <= u).sum()) for u in _uniforms(11, 2)[g].tolist()] for g in range(G)]
    seq = _sequence_logp(logp, batch.mask)
    want = -sum(seq[g, m] for g in range(G) for m in picks[g]) / (G * 2)
    torch.testing.assert_close(_grad(got, logp), _grad(want, logp), rtol=1e-12, atol=1e-14)


def test_extreme_answer_log_probs_give_a_finite_loss_and_gradient() -> None:
    """Answer log-likelihoods around -3e4 (w underflows in linear space): finite, and q = 1 still learns."""
    for q in (0.0, 0.5, 1.0):
        for method in ("garl", "paft"):
            batch = _batch("likelihood", answer_logp_scale=1e4)
            logp = _logp(batch)
            loss = _trainer_loss(method, {"q": q, "variant": "likelihood"}, batch, logp)
            grad = _grad(loss, logp)
            assert math.isfinite(float(loss.detach())) and bool(grad.isfinite().all())
            if q == 1.0:  # w_bar^{1-q} = 1: the normalised weights survive the underflow
                assert float(grad.abs().sum()) > 0


def test_a_prompt_without_success_has_zero_loss_and_gradient() -> None:
    rewards = torch.zeros(G * K, dtype=torch.float64)
    rewards[:K] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # prompt 0 only
    batch = _batch("verifier", rewards=rewards)
    logp = _logp(batch)
    for method in ("garl", "paft"):
        grad = _grad(_trainer_loss(method, {"q": 0.75}, batch, logp), logp)
        assert bool(grad.isfinite().all()) and float(grad[K:].abs().sum()) == 0.0 and float(grad[:K].abs().sum()) > 0


def test_q_schedule_switches_after_switch_step() -> None:
    alg = build_algorithm(method="garl", horizon=T, options={"q": 1.0, "q_after": 0.0, "switch_step": 3})
    batch = _batch("verifier")
    qs = []
    for step in (1, 3, 4, 10):
        phase = alg.at(step)
        assert phase.before_update is not None
        qs.append(float(phase.before_update(batch, None, UpdateContext(None, 0, 0, 1.0))[2]["tsallis/q"]))
    assert qs == [1.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"q": 1.5}, "algorithm.options.q"),
        ({"q": "high"}, "algorithm.options.q"),
        ({"variant": "oracle"}, "algorithm.options.variant"),
        ({"baseline": "mean"}, "algorithm.options.baseline"),
        ({"q_after": 0.0}, "algorithm.options.switch_step"),
        ({"switch_step": 5}, "algorithm.options.switch_step"),
        ({"q_after": 2.0, "switch_step": 5}, "algorithm.options.q_after"),
        ({"log_w_min": 3.0}, "algorithm.options.log_w_min"),
        ({"smaples": 1}, "algorithm.options"),
        ({"variant": "likelihood"}, "rollout.answer_suffix"),
    ],
)
def test_config_errors_name_the_key(options: dict[str, Any], key: str) -> None:
    with pytest.raises(DomainError, match=key.replace(".", r"\.")):
        config_from_dict({"algorithm": {"method": "garl", "options": options}})


def test_paft_samples_and_answer_suffix_errors_name_the_key() -> None:
    with pytest.raises(DomainError, match=r"algorithm\.options\.samples"):
        config_from_dict({"algorithm": {"method": "paft", "options": {"samples": 0}}})
    with pytest.raises(DomainError, match=r"rollout\.answer_suffix"):  # set but unused: trained as sampled tokens
        config_from_dict({"rollout": {"answer_suffix": {"delimiter": "="}}, "algorithm": {"method": "grpo"}})


# ---------------------------------------------------------------- the trainer, the stage, the tiny model

EQ = len(SPECIAL_TOKENS) + ALPHABET.index("=")  # the id of "=" in the character vocabulary
RESPONSES = [[5 + (i % 7)] * (1 + i % 4) + ([EQ, 6] if i % 5 == 0 else []) + [3] for i in range(G * K)]


@dataclasses.dataclass(frozen=True)
class AnswerTask(TableTask):
    """TableTask with gold answers ``"1<i>"`` (two characters)."""

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        return [Problem(f"{rng.randrange(10)}+{i}=", f"1{i}") for i in range(n)]


def _likelihood_trainer(tiny: tuple[Any, Any], method: str, q: float) -> Trainer:
    model, tok = tiny
    model.double()
    torch.manual_seed(0)
    cfg = config_from_dict({
        "data": {"prompts_per_step": G}, "rollout": {"group_size": K, "max_new_tokens": 8,
                                                     "answer_suffix": {"delimiter": "="}},
        "algorithm": {"method": method, "options": {"q": q, "variant": "likelihood"}},
        "optim": {"micro_batch_size": K, "max_grad_norm": None},
    })  # fmt: skip
    a = cfg.algorithm
    alg = build_algorithm(method=a.method, horizon=8, options=a.options)
    stage = AnswerSuffixStage(AnswerSuffixConfig("="), tokenizer=tok)
    return Trainer(cfg, model=model, tokenizer=tok, task=AnswerTask(), engine=FixedEngine(model, RESPONSES),
                   algorithm=alg, sampling=cfg.rollout.sampling(), stages=(stage,))  # fmt: skip


@pytest.mark.parametrize("method", ["garl", "paft"])
def test_trainer_gradient_equals_the_estimator_on_the_appended_answer(tiny: tuple[Any, Any], method: str) -> None:
    """Micro-batches of one group; the answer tokens are scored in the training forward: gradients by hand."""
    trainer = _likelihood_trainer(tiny, method, 0.5)
    batch, _ = trainer.rollout()
    assert batch.answer_mask is not None and batch.logp_old is not None
    assert int(trainer.tokenizer.convert_tokens_to_ids("=")) == EQ
    update = batch
    if method == "paft":
        assert trainer.algorithm.before_update is not None
        update, _, _ = trainer.algorithm.before_update(batch, None, UpdateContext(trainer.model, 0, 99, 1.0))
    model = trainer.model
    model.zero_grad()
    trainer.accumulate_gradients(update)
    g_trainer = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]

    model.zero_grad()
    logp, _ = token_logprobs(
        model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask, group_size=batch.group_size
    )
    am = batch.answer_mask
    log_w = torch.where(am, batch.logp_old, 0.0).sum(-1).reshape(G, K)
    torch.testing.assert_close(log_w, torch.where(am, logp, 0.0).sum(-1).reshape(G, K).detach())  # on-policy
    if method == "garl":
        tok, _ = garl_loss(logp, batch.mask & ~am, log_w, q=0.5, answer_mask=am)
    else:
        u = torch.rand(G, 1, generator=torch.Generator().manual_seed(99), dtype=torch.float64)
        tok, _ = paft_loss(logp, batch.mask & ~am, log_w, u, q=0.5, answer_mask=am)
    (tok.sum() / (G * K)).backward()
    g_hand = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    assert len(g_hand) == len(g_trainer)
    for a, b in zip(g_trainer, g_hand, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_answer_tokens_in_the_training_forward_equal_a_separate_forward(tiny: tuple[Any, Any]) -> None:
    """Row by row, [prompt; trace; "=" answer <eos>] without padding: same answer log-probs as the padded batch."""
    trainer = _likelihood_trainer(tiny, "garl", 0.75)
    batch, _ = trainer.rollout()
    model, am = trainer.model, batch.answer_mask
    assert am is not None and batch.logp_old is not None
    logp, _ = token_logprobs(
        model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.mask, group_size=batch.group_size
    )
    cut = [i for i, r in enumerate(RESPONSES) if EQ in r]
    assert cut and all(int((batch.mask[i] & ~am[i]).sum()) == RESPONSES[i].index(EQ) for i in cut)  # cut at "="
    for row in range(batch.batch_size):
        prompt = batch.prompt_ids[row][batch.prompt_mask[row]]
        response = batch.response_ids[row][batch.mask[row]]
        ids = torch.cat([prompt, response]).unsqueeze(0)
        with torch.no_grad():
            alone = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
        want = alone.gather(-1, response.unsqueeze(-1)).squeeze(-1)
        got = logp[row][batch.mask[row]]
        torch.testing.assert_close(got.detach(), want, rtol=1e-9, atol=1e-10)
        answer = batch.response_ids[row][am[row]].tolist()
        assert trainer.tokenizer.decode(answer[:-1]) == f"=1{row // K}" and answer[-1] == 3  # "=" + gold + <eos>
        torch.testing.assert_close(batch.logp_old[row][am[row]], want[am[row][batch.mask[row]]], rtol=1e-9, atol=1e-10)


def _tiny_run(tmp_path: Path, method: str, variant: str) -> list[dict[str, Any]]:
    from posttrain.llm.run import train

    cfg = config_from_dict({
        "model": {"tiny": {"num_hidden_layers": 1}},
        "data": {"task": "chat_addition", "options": {"template": "{a}+{b}=", "low": 0, "high": 9},
                 "prompts_per_step": 4, "sft_steps": 2, "sft_batch_size": 8, "eval_prompts": 4},
        "rollout": {"group_size": 4, "max_new_tokens": 3,
                    "answer_suffix": {"delimiter": "="} if variant == "likelihood" else None},
        "algorithm": {"method": method, "options": {"q": 0.75, "variant": variant}},
        "optim": {"steps": 2, "lr": 1e-3}, "checkpoint": {"every": 0}, "logging": {"progress": False},
    })  # fmt: skip
    return train(cfg, tmp_path)


@pytest.mark.parametrize(("method", "variant"), [("garl", "likelihood"), ("paft", "verifier")])
def test_two_steps_end_to_end_on_the_tiny_model(tmp_path: Path, method: str, variant: str) -> None:
    from transformers import AutoModelForCausalLM

    history = _tiny_run(tmp_path, method, variant)
    assert [h["step"] for h in history] == [1, 2]
    keys = {"tsallis/q", "tsallis/log_amplification", "tsallis/log_w_bar", "tsallis/dead_prompts", "loss"}
    assert keys <= set(history[-1]) and history[-1]["tsallis/q"] == 0.75
    if variant == "likelihood":
        assert {"answer/trace_len", "answer/logp"} <= set(history[-1]) and history[-1]["answer/logp"] < 0
    assert all(math.isfinite(h["loss"]) for h in history)
    initial = AutoModelForCausalLM.from_pretrained(tmp_path / "initial")
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoints" / "step_000002" / "model")
    moved = sum(float((a - b).abs().sum()) for a, b in zip(trained.parameters(), initial.parameters(), strict=True))
    assert moved > 0
