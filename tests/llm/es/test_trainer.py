"""ES fine-tuning of the tiny causal LM in place: the update by hand, training, gloo = one process."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from posttrain.errors import DomainError
from posttrain.estimators import es_step, evolution_strategy
from posttrain.llm.es.trainer import EsTrainConfig, es_train, generation_fitness, trainable_params
from posttrain.llm.rollout.tasks import Problem, make_task
from posttrain.llm.run import grpo_then_es


def _target_logp(model: Any, tokenizer: Any) -> Callable[[int], float]:
    """A smooth fitness: mean log-probability of the answer tokens of ``12+34=46`` (teacher forcing)."""
    ids = torch.tensor([tokenizer("12+34=46")["input_ids"]])

    def fitness(step: int) -> float:
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        return float(logp[-2:].mean())

    return fitness


def test_one_step_equals_the_estimator_by_hand(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    params = trainable_params(model)
    assert "lm_head.weight" not in params  # tied to the embedding: perturbed once
    before = {k: v.detach().clone() for k, v in params.items()}
    fitness = generation_fitness(model, tok, make_task("addition"), prompts_per_step=4, max_new_tokens=4)
    seen: list[float] = []
    cfg = EsTrainConfig(population=4, sigma=0.05, lr=0.01, steps=1, seed=3)

    def recorded(step: int) -> float:
        seen.append(fitness(step))
        return seen[-1]

    logs = es_train(params, recorded, cfg)
    pop = evolution_strategy(population=4, sigma=0.05, lr=0.01).ask(
        evolution_strategy(population=4, sigma=0.05, lr=0.01).init(3)
    )
    delta = es_step(before, pop, torch.tensor(seen, dtype=torch.float64), lr=0.01)
    for k, p in params.items():  # restore-by-subtraction drifts by rounding only
        torch.testing.assert_close(p.detach(), before[k] + delta[k], rtol=0, atol=1e-6)
    assert len(logs) == 1 and logs[0].noop == (len(set(seen)) == 1)


def test_es_raises_a_smooth_fitness(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    fitness = _target_logp(model, tok)
    start = fitness(0)
    es_train(trainable_params(model), fitness, EsTrainConfig(population=8, sigma=0.02, lr=0.03, steps=10, seed=0))
    assert fitness(0) > start + 0.5  # measured: about +1 nat after 10 steps, +2 after 20


def _worker(rank: int, world: int, init_file: str, model_dir: str, out_dir: str, cfg: EsTrainConfig) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    model, tok = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    es_train(trainable_params(model), _target_logp(model, tok), cfg)
    if rank == 0:
        torch.save({k: v.detach() for k, v in trainable_params(model).items()}, os.path.join(out_dir, f"w{world}.pt"))
    if world > 1:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_processes_match_one_process_bitwise(tiny_dir: Path, tmp_path: Path) -> None:
    cfg = EsTrainConfig(population=6, sigma=0.02, lr=0.03, steps=2, seed=1)
    _worker(0, 1, "", str(tiny_dir), str(tmp_path), cfg)
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tiny_dir), str(tmp_path), cfg), nprocs=2, join=True)
    one, two = torch.load(tmp_path / "w1.pt"), torch.load(tmp_path / "w2.pt")
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)


def test_grpo_then_es_schedule(tmp_path: Path) -> None:
    """GRPO steps through the RL trainer, then ES on its endpoint; the ES half is saved and reloadable."""
    from transformers import AutoModelForCausalLM

    from posttrain.llm.config import config_from_dict

    cfg = config_from_dict(
        {
            "model": {"tiny": {"num_hidden_layers": 1}},
            "data": {"task": "addition", "options": {"digits": 1}, "prompts_per_step": 4, "sft_steps": 0},
            "rollout": {"group_size": 2, "max_new_tokens": 3},
            "optim": {"steps": 2},
            "logging": {"progress": False},
        }
    )
    rl_logs, es_logs = grpo_then_es(
        cfg, tmp_path, EsTrainConfig(population=4, sigma=0.01, lr=0.005, steps=2), prompts_per_step=4
    )
    assert len(rl_logs) == 2 and len(es_logs) == 2
    assert all(0.0 <= log.reward_mean <= 1.0 for log in es_logs)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "es")
    initial = AutoModelForCausalLM.from_pretrained(tmp_path / "initial")
    assert set(dict(reloaded.named_parameters())) == set(dict(initial.named_parameters()))


def test_es_command_runs_the_configured_es_from_the_initial_model(tmp_path: Path) -> None:
    """``posttrain es CONFIG``: the saved endpoint equals ``es_train`` by hand from ``out/initial``, bit for bit."""
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer
    from typer.testing import CliRunner

    from posttrain.cli import app

    example = Path(__file__).resolve().parents[3] / "examples" / "tiny_cpu.yaml"
    sets = ["data.sft_steps=40", "model.tiny={num_hidden_layers: 1}", "rollout.max_new_tokens=3", "seed=5",
            "es.population=4", "es.sigma=0.05", "es.lr=0.01", "es.steps=2", "es.prompts_per_step=8"]  # fmt: skip
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["es", str(example), "--out", str(out), *[a for s in sets for a in ("--set", s)]])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "es_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and not (out / "metrics.jsonl").exists()  # no RL steps
    model = AutoModelForCausalLM.from_pretrained(out / "initial")
    tok = AutoTokenizer.from_pretrained(out / "initial")
    task = make_task("addition", digits=1)
    fitness = generation_fitness(model, tok, task, prompts_per_step=8, seed=5, max_new_tokens=3)
    logs = es_train(trainable_params(model), fitness, EsTrainConfig(population=4, sigma=0.05, lr=0.01, steps=2, seed=5))
    assert [r["reward_mean"] for r in rows] == [log.reward_mean for log in logs]
    assert not all(r["noop"] for r in rows)  # some step moved the weights, so the comparison below has teeth
    endpoint = dict(AutoModelForCausalLM.from_pretrained(out / "es").named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(p, endpoint[name]), name
    bad = CliRunner().invoke(app, ["es", str(example), "--set", "es.shaping=rank"])
    assert bad.exit_code == 2 and "es.shaping" in bad.output


class _TextTask:
    """Addition prompts of several lengths; reward = a fingerprint of the completion's characters."""

    def __init__(self) -> None:
        self.inner = make_task("addition")

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        return self.inner.sample(rng, n)

    def reward(self, problem: Problem, completion: str) -> float:
        return sum((i + 1) * ord(c) for i, c in enumerate(completion)) % 997 / 997

    def solution(self, problem: Problem, rng: random.Random) -> str:
        return self.inner.solution(problem, rng)


def test_generation_fitness_micro_batches_give_the_same_responses(tiny: tuple[Any, Any]) -> None:
    """One prompt per ``generate`` (less activation memory) scores the same greedy responses as the whole batch."""
    model, tok = tiny
    task = _TextTask()
    prompts = task.sample(random.Random(0), 6)
    assert len({len(p.prompt) for p in prompts}) > 1  # padding differs between the batch and the slices
    fitness = {m: generation_fitness(model, tok, task, prompts_per_step=6, max_new_tokens=6, problems=prompts,
                                     micro_batch=m)(0) for m in (None, 1, 4)}  # fmt: skip
    assert fitness[None] == fitness[1] == fitness[4] and fitness[None] > 0
    with pytest.raises(DomainError, match="micro_batch"):
        generation_fitness(model, tok, task, prompts_per_step=6, micro_batch=0)


def test_es_micro_batch_is_a_validated_config_key() -> None:
    from posttrain.llm.config import config_from_dict

    assert config_from_dict({"es": {"micro_batch": 2}}).es.micro_batch == 2
    with pytest.raises(DomainError, match=r"es\.micro_batch"):
        config_from_dict({"es": {"micro_batch": 0}})
