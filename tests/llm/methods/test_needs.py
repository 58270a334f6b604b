"""The table of needs: every batch input a method reads has one row that says who provides it and what it requires;
the run, the config checks and the trainer read the table (no need is tested by name)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from posttrain.errors import DomainError, ShapeError
from posttrain.estimators import ADVANTAGES
from posttrain.llm.config import config_from_dict, load_run
from posttrain.llm.config.checks import value_at
from posttrain.llm.methods.algorithm import ADVANTAGE_INPUTS, LOSS_INPUTS, Inputs
from posttrain.llm.methods.catalog import METHODS, build_algorithm
from posttrain.llm.methods.needs import NEEDS, Need, Source, example_batch, read, write
from posttrain.llm.rollout.batch import RolloutBatch
from posttrain.registry import Entry

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")


def test_every_need_has_one_row_and_its_preconditions_name_config_keys() -> None:
    assert set(NEEDS) == set(Need)
    fields = {f.name for f in dataclasses.fields(RolloutBatch)}
    cfg = config_from_dict({})
    for need, row in NEEDS.items():
        assert (row.fill is not None) == (row.source is Source.FILLER), need
        assert (row.view is not None) == (row.source is Source.VIEW), need
        if row.source is not Source.VIEW and need.value not in fields:  # a need without a field: in extras
            assert read(example_batch({need}, group_size=1, rewards=[0.0]), need) is not None, need
        for key in row.requires:
            value_at(cfg, key)  # a real dotted key of the config
    order = list(Need)
    assert order.index(Need.TOPK_IDS) < min(order.index(n) for n in (Need.TOPK_LOGP_OLD, Need.TOPK_LOGP_REF))


def test_needs_hash_like_their_names() -> None:
    assert Need.LOGP_REF == "logp_ref" and {"logp_ref": 1}[Need.LOGP_REF] == 1 and "logp_ref" in {Need.LOGP_REF}
    assert f"{Need.LOGP_REF}" == "logp_ref"


@pytest.mark.parametrize("method", sorted(METHODS.names()))
def test_every_method_declares_needs_from_the_table(method: str) -> None:
    options = {"switch_step": 1} if method == "opd_then_rl" else {}
    alg = build_algorithm(method=method, horizon=4, options=options or None, group_size=9)
    for need in (*alg.needs, *alg.loss_needs, *alg.provides):
        assert isinstance(need, Need), (method, need)
    assert Need.LOGP_OLD in alg.needs


def test_a_new_input_lives_in_extras_and_follows_the_rows() -> None:
    batch = example_batch({Need.LOGP_REF, Need.TOPK_IDS}, group_size=2, rewards=[1.0, 0.0, 1.0, 1.0])
    assert read(batch, Need.LOGP_REF) is not None and read(batch, Need.TOPK_IDS).dtype == torch.long
    assert read(batch, Need.REWARDS).shape == (2, 2)
    tr = read(batch, Need.TOKEN_REWARDS)
    assert tr.tolist() == [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]]
    extra = batch.replace(extras={"new_input": torch.arange(4.0)})
    assert extra.rows(2, 4).extras["new_input"].tolist() == [2.0, 3.0]
    with pytest.raises(ShapeError, match=r"extras\.new_input: expected 4 rows"):
        batch.replace(extras={"new_input": torch.zeros(3)})
    with pytest.raises(DomainError, match=r"extras\.new_input"):
        batch.replace(extras={"new_input": torch.tensor([0.0, float("nan"), 0.0, 0.0])})
    assert write(batch, Need.SYNTHETIC, torch.zeros(4, dtype=torch.bool)).synthetic is not None


def test_a_plain_advantage_is_one_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    """An advantage of the ``[G, K]`` rewards needs its estimator and its registration only; one with another input
    adds its `ADVANTAGE_INPUTS` row (and, for a new batch input, a `Need` and its `NEEDS` row)."""

    def centred(rewards: torch.Tensor, *, shift: float = 0.0) -> torch.Tensor:
        return rewards - rewards.mean(dim=-1, keepdim=True) + shift

    monkeypatch.setitem(ADVANTAGES._entries, "centred_test", Entry("centred_test", centred, "test", ""))
    cfg = config_from_dict({"algorithm": {"advantage": "centred_test", "advantage_options": {"shift": 0.5}}})
    alg = build_algorithm(method="grpo", horizon=3, advantage=cfg.algorithm.advantage,
                          advantage_options=cfg.algorithm.advantage_options)  # fmt: skip
    batch = example_batch(alg.needs, group_size=2, rewards=[1.0, 0.0, 0.0, 0.0])
    assert alg.advantage(batch)[:, 0].tolist() == [1.0, 0.0, 0.5, 0.5]

    def with_ref(logp_ref: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return -logp_ref * mask

    monkeypatch.setitem(ADVANTAGES._entries, "ref_test", Entry("ref_test", with_ref, "test", ""))
    monkeypatch.setitem(ADVANTAGE_INPUTS, "ref_test", Inputs((Need.LOGP_REF, Need.MASK), per_token=True))
    alg = build_algorithm(method="grpo", horizon=3, advantage="ref_test")
    assert Need.LOGP_REF in alg.needs  # declared by the registration: the run fills it, the trainer checks it


def test_loss_inputs_are_declared_not_read_from_parameter_names() -> None:
    assert build_algorithm(method="grpo", horizon=3, loss="opd").loss_needs == LOSS_INPUTS["opd"]
    assert Need.LOGP_TEACHER in build_algorithm(method="grpo", horizon=3, advantage="opd").needs


def test_the_plan_builds_the_method_once_and_hands_one_sampling_on(tmp_path: Path) -> None:
    """`load_run` builds the `Algorithm` once; `build_trainer` trains that object, and the engine, the trainer and the
    fillers share the plan's one `SamplingConfig` (its temperature)."""
    from posttrain.llm.run import build_trainer

    plan = load_run(None, [
        "model.tiny.num_hidden_layers=1", "data.task=addition", "data.options={digits: 1}", "data.prompts_per_step=2",
        "rollout.group_size=2", "rollout.max_new_tokens=2", "rollout.temperature=0.7", "algorithm.method=flowrl",
        "optim.steps=1", "logging.progress=false",
    ])  # fmt: skip
    assert plan.sampling.temperature == 0.7
    trainer = build_trainer(plan, tmp_path / "run")
    assert trainer.algorithm is plan.algorithm and trainer.algorithm.modules[0] is plan.algorithm.modules[0]
    assert trainer.sampling is plan.sampling and trainer.engine.sampling is plan.sampling  # type: ignore[attr-defined]
    assert set(trainer.fillers) == {Need.LOGP_REF, Need.PROMPT_FEATURES}  # only what the method reads
