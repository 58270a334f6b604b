"""TRL's GRPOTrainer with our reward function, advantage and policy loss, on the tiny model (CPU, no network)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

trl = pytest.importorskip("trl", reason="TRL is not installed (the [trl] extra; make test-adapters installs it)")
datasets = pytest.importorskip("datasets", reason="TRL's datasets dependency is missing")

from posttrain.estimators import (  # noqa: E402
    aggregate,
    clipped_ratio_loss,
    rloo_advantages,
    sis_accept,
    sis_acceptance_prob,
    sis_loss,
)
from posttrain.estimators.importance import token_in_topk  # noqa: E402
from posttrain.llm.adapters.rewards import task_reward, trl_rows  # noqa: E402
from posttrain.llm.adapters.trl import grpo_config_class, grpo_trainer_class  # noqa: E402
from posttrain.llm.rollout.tasks import Problem, make_task  # noqa: E402

K = 4  # completions per prompt


def _config(out: str, config_class: Any = None, **overrides: Any) -> Any:
    base: dict[str, Any] = {
        "output_dir": out,
        "use_cpu": True,
        "per_device_train_batch_size": 2 * K,
        "num_generations": K,
        "max_completion_length": 4,
        "max_steps": 2,
        "learning_rate": 1e-3,
        "beta": 0.0,
        "temperature": 1.0,
        "report_to": [],
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
        "log_level": "error",
        "loss_type": "grpo",
        "seed": 0,
        "bf16": False,  # TRL's default autocasts to bfloat16, also on CPU: float32 throughout here
    }
    return (config_class or trl.GRPOConfig)(**(base | overrides))


def _trainer(cls: Any, tiny_dir: Path, out: str, *, reward_funcs: Any = None, **config: Any) -> Any:
    """``cls`` on the tiny model; ``config`` overrides the base config (our options for our trainer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ours = issubclass(cls, grpo_trainer_class())
    return cls(
        model=AutoModelForCausalLM.from_pretrained(tiny_dir),
        reward_funcs=reward_funcs or task_reward("addition", digits=1),
        args=_config(out, grpo_config_class() if ours else None, **config),
        train_dataset=datasets.Dataset.from_list(trl_rows("addition", 16, seed=0, digits=1)),
        processing_class=AutoTokenizer.from_pretrained(tiny_dir),
    )


def _fixed_batch(vocab: int, b: int = 2 * K, p: int = 4, t: int = 5) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    return {
        "prompt_ids": torch.randint(4, vocab, (b, p), generator=gen),
        "prompt_mask": torch.ones(b, p, dtype=torch.long),
        "completion_ids": torch.randint(4, vocab, (b, t), generator=gen),
        "completion_mask": (torch.arange(t) < lengths.unsqueeze(-1)).long(),
        "advantages": torch.randn(b, generator=gen),
    }


def _token_logps(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """log pi(y_t | ...) of the completion tokens, by hand (no padding in the prompts, temperature 1)."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    t = batch["completion_ids"].shape[1]
    logits = model(input_ids=ids, attention_mask=attn).logits[:, -t - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)


def test_adapted_loss_equals_our_estimator_and_trl_grpo_on_a_fixed_batch(tiny_dir: Path) -> None:
    """Through the real model and TRL's log-prob helper (the float64 comparisons stub the model out)."""
    with tempfile.TemporaryDirectory() as out:
        ours = _trainer(grpo_trainer_class(), tiny_dir, out)  # TRL's loss_type="grpo", by our estimators
        theirs = _trainer(trl.GRPOTrainer, tiny_dir, out)
    theirs.model.load_state_dict(ours.model.state_dict())
    batch = _fixed_batch(ours.model.config.vocab_size)
    with torch.no_grad():
        logp = _token_logps(ours.model, batch)
    batch["old_per_token_logps"] = logp + 0.3 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(1))
    mask = batch["completion_mask"].bool()
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():  # TRL's own log-prob helper (logits of the completion positions only)
        logp_trl = ours._get_per_token_logps_and_entropies(ours.model, ids, attn, logp.shape[1])[0]
    # on the response, the same numbers up to float32 rounding (TRL 1.16 scores through a fused LM head, 0 on padding)
    torch.testing.assert_close(logp_trl[mask], logp[mask], rtol=0, atol=1e-5)
    per_token, diag = clipped_ratio_loss(logp_trl, batch["old_per_token_logps"], batch["advantages"], mask)
    assert 0 < float(diag.clip_frac) < 1  # both branches of the clip are exercised
    losses, grads = [], []
    for trainer in (ours, theirs):
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 2  # set by HF's loop during training
        loss = trainer.compute_loss(trainer.model, batch)
        losses.append(loss.detach())
        grads.append(torch.autograd.grad(loss, trainer.model.model.embed_tokens.weight)[0])
    torch.testing.assert_close(losses[0], aggregate(per_token, mask, "seq-mean-token-mean") / 2)
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)


def test_sis_inside_trl_equals_our_sis_loss_on_a_fixed_batch(tiny_dir: Path) -> None:
    with tempfile.TemporaryDirectory() as out:
        trainer = _trainer(grpo_trainer_class(), tiny_dir, out, sis_top_k=8)
    model = trainer.model
    batch = _fixed_batch(model.config.vocab_size)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    mask, t = batch["completion_mask"].bool(), batch["completion_ids"].shape[1]
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        logp = trainer._get_per_token_logps_and_entropies(model, ids, attn, t)[0]
        full = torch.log_softmax(model(input_ids=ids, attention_mask=attn).logits[:, -t - 1 : -1], dim=-1)
    behaviour = torch.log_softmax(full + 0.5 * torch.randn(full.shape, generator=gen), dim=-1)  # a stale policy
    top = behaviour.topk(8, dim=-1)
    batch |= {
        "old_per_token_logps": behaviour.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1),
        "posttrain_sis_topk_ids": top.indices,
        "posttrain_sis_topk_logp": top.values,
    }
    model.train()
    trainer.current_gradient_accumulation_steps = 1
    state = trainer.posttrain_sis_generator.get_state()
    loss = trainer.compute_loss(model, batch)
    u = torch.rand(logp.shape, generator=torch.Generator().set_state(state))
    old = batch["old_per_token_logps"]
    accepted = sis_accept(sis_acceptance_prob(logp, old, full.gather(-1, top.indices), top.values), u) & mask
    assert 0 < float(accepted.sum()) < float(mask.sum())  # both kinds of token occur
    expected = aggregate(sis_loss(logp, old, batch["advantages"], mask, accepted)[0], mask, "seq-mean-token-mean")
    torch.testing.assert_close(loss.detach(), expected)


def test_a_short_run_trains_on_our_reward_with_our_advantage(tiny_dir: Path) -> None:
    """Two optimizer steps with our task reward plus a dense one (weighted): TRL trains on our RLOO advantages."""
    task, seen, used = make_task("addition", digits=1), [], []
    reward = task_reward("addition", digits=1)

    def recording_reward(prompts: list[str], completions: list[str], **kw: Any) -> list[float]:
        values = reward(prompts, completions, **kw)
        seen.append((prompts, completions, kw["answer"], values))
        return values

    def digits(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
        """Share of digit characters: varies between random completions, so the advantages are not all 0."""
        return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]

    recording_reward.__name__ = "addition"
    base = grpo_trainer_class()

    class Recording(base):  # type: ignore[misc, valid-type]
        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
            out: dict[str, Any] = super()._generate_and_score_completions(inputs)
            used.append((self._posttrain_rewards.clone(), out["advantages"].clone()))
            return out

    weights = [1.0, 0.5]
    with tempfile.TemporaryDirectory() as out:
        trainer = _trainer(
            Recording, tiny_dir, out, reward_funcs=[recording_reward, digits], advantage="rloo", reward_weights=weights
        )
        trainer.train()
    assert len(used) == 2 and len(seen) == 2
    for (prompts, completions, answers, values), (per_func, advantages) in zip(seen, used, strict=True):
        assert values == [task.reward(Problem(p, a), c) for p, c, a in zip(prompts, completions, answers, strict=True)]
        assert per_func[:, 0].tolist() == values
        summed = per_func @ torch.tensor(weights)
        torch.testing.assert_close(advantages, rloo_advantages(summed.view(-1, K)).reshape(-1))
        assert bool((advantages != 0).any())
    logged = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    assert logged == pytest.approx([float((f @ torch.tensor(weights)).mean()) for f, _ in used])


def test_sis_run_accepts_exactly_the_behaviour_top_k_tokens_while_on_policy(tiny_dir: Path) -> None:
    """Two updates per generation: the first is on-policy, where the released SIS test accepts every token, also
    those outside the behaviour's top-K (the earlier reconstruction accepted only the top-K ones)."""
    coverage = []
    base = grpo_trainer_class()

    class Recording(base):  # type: ignore[misc, valid-type]
        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
            out: dict[str, Any] = super()._generate_and_score_completions(inputs)
            mask = out["completion_mask"].bool()
            in_topk = token_in_topk(out["completion_ids"], out["posttrain_sis_topk_ids"])
            coverage.append(float((in_topk & mask).sum() / mask.sum()))
            return out

    with tempfile.TemporaryDirectory() as out:
        trainer = _trainer(Recording, tiny_dir, out, sis_top_k=16, num_iterations=2, max_steps=2)
        trainer.train()
    rates = [h["posttrain/sis_accept_rate"] for h in trainer.state.log_history if "posttrain/sis_accept_rate" in h]
    assert len(coverage) == 1 and len(rates) == 2
    assert 0 < coverage[0] < 1
    assert rates[0] == pytest.approx(1.0)  # on-policy: rho = M = 1, every token accepted, in the top-K or not
    assert 0 <= rates[1] <= 1.0


def test_settings_the_adapter_does_not_reproduce_are_refused(tiny_dir: Path) -> None:
    from posttrain.errors import DomainError

    with tempfile.TemporaryDirectory() as out, pytest.raises(DomainError, match="top_entropy_quantile"):
        _trainer(grpo_trainer_class(), tiny_dir, out, top_entropy_quantile=0.5)
    with tempfile.TemporaryDirectory() as out:
        trainer = _trainer(grpo_trainer_class(), tiny_dir, out)
        trainer.args.off_policy_mask_threshold = 0.5  # changed after the config was built
        with pytest.raises(DomainError, match="off_policy_mask_threshold"):
            grpo_trainer_class()(model=trainer.model, reward_funcs=task_reward("addition", digits=1), args=trainer.args)


def test_options_come_from_trl_parser_and_yaml_and_are_saved_with_the_args(tmp_path: Path) -> None:
    """TRL's convention: the options are config fields, so TrlParser reads them and the run's args record them."""
    import json

    config_class = grpo_config_class()
    assert issubclass(config_class, trl.GRPOConfig)
    yaml_path = tmp_path / "run.yaml"
    yaml_path.write_text(
        "advantage: rloo\npolicy_loss: ppo_clip\nloss_options:\n  clip_high: 0.28\n  dual_clip: 3.0\n"
        "aggregation: token-mean\nsis_top_k: 8\nnum_generations: 4\nuse_cpu: true\nbf16: false\n"
    )
    (args,) = trl.TrlParser((config_class,)).parse_args_and_config(
        ["--config", str(yaml_path), "--output_dir", str(tmp_path / "out"), "--advantage_options", '{"eps": 0.001}']
    )
    assert isinstance(args, config_class)
    assert (args.advantage, args.policy_loss, args.aggregation, args.sis_top_k) == ("rloo", "ppo_clip", "token-mean", 8)
    assert args.loss_options == {"clip_high": 0.28, "dual_clip": 3.0}
    assert args.advantage_options == {"eps": 0.001}  # a JSON string on the command line, parsed as TRL's dict fields
    saved = json.loads(args.to_json_string())
    assert {k: saved[k] for k in ("advantage", "loss_options", "aggregation", "sis_top_k")} == {
        "advantage": "rloo",
        "loss_options": {"clip_high": 0.28, "dual_clip": 3.0},
        "aggregation": "token-mean",
        "sis_top_k": 8,
    }


def test_bad_options_fail_when_the_config_is_built(tmp_path: Path) -> None:
    from posttrain.errors import PosttrainError

    config_class = grpo_config_class()
    with pytest.raises(PosttrainError, match="aggregation"):
        _config(str(tmp_path), config_class, aggregation="token-median")
    with pytest.raises(PosttrainError, match="sis_top_k"):
        _config(str(tmp_path), config_class, sis_top_k=0)
    with pytest.raises(PosttrainError, match="advantage"):
        _config(str(tmp_path), config_class, advantage="gspo")  # a policy loss, not an advantage
    with pytest.raises(PosttrainError, match="loss_options"):
        _config(str(tmp_path), config_class, loss_options={"clip_high": 0.28})  # no policy_loss of ours to take them
    with pytest.raises(PosttrainError, match="loss_type"):  # grpo's normaliser and ours would both apply
        _config(str(tmp_path), config_class, aggregation="token-mean")
    assert _config(str(tmp_path), config_class, loss_type="dapo", aggregation="token-mean").aggregation == "token-mean"


def test_plain_grpo_config_is_refused(tiny_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from posttrain.errors import DomainError

    with pytest.raises(DomainError, match="PosttrainGRPOConfig"):
        grpo_trainer_class()(
            model=AutoModelForCausalLM.from_pretrained(tiny_dir),
            reward_funcs=task_reward("addition", digits=1),
            args=_config(str(tmp_path)),
        )


def test_token_mean_uses_num_items_in_batch_exactly_as_trl_dapo(tiny_dir: Path) -> None:
    """token-mean divides by the generation batch's token count (TRL's ``num_items_in_batch``), not the micro-batch's."""
    with tempfile.TemporaryDirectory() as out:
        ours = _trainer(
            grpo_trainer_class(), tiny_dir, out, loss_type="dapo", policy_loss="ppo_clip", aggregation="token-mean"
        )
        theirs = _trainer(trl.GRPOTrainer, tiny_dir, out, loss_type="dapo")
    theirs.model.load_state_dict(ours.model.state_dict())
    batch = _fixed_batch(ours.model.config.vocab_size)
    with torch.no_grad():
        logp = _token_logps(ours.model, batch)
    batch["old_per_token_logps"] = logp + 0.3 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(1))
    mask = batch["completion_mask"].bool()
    n_batch = 3 * int(mask.sum())  # this micro-batch is a third of its generation batch's tokens
    batch["num_items_in_batch"] = torch.tensor(n_batch)
    losses, grads = [], []
    for trainer in (ours, theirs):
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 2  # set by HF's loop during training
        loss = trainer.compute_loss(trainer.model, batch)
        losses.append(loss.detach())
        grads.append(torch.autograd.grad(loss, trainer.model.model.embed_tokens.weight)[0])
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():
        logp_trl = ours._get_per_token_logps_and_entropies(ours.model, ids, attn, logp.shape[1])[0]
    per_token, _ = clipped_ratio_loss(logp_trl, batch["old_per_token_logps"], batch["advantages"], mask)
    steps_per_generation = ours.args.steps_per_generation  # 1 here: TRL's normaliser is N * accumulation / spg
    expected = (per_token * mask).sum() / (n_batch * 2 / steps_per_generation)
    torch.testing.assert_close(losses[0], expected.detach())
    assert not torch.allclose(losses[0], aggregate(per_token, mask, "token-mean").detach() / 2)  # not the local mean
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)
