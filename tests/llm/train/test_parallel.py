"""Data parallel on CPU: 2 gloo processes (DDP or FSDP2) produce the gradients of 1 process on the same global batch.

The models run in float64 with their RMS norms in float64 too (`exact_norms`): transformers computes the norms in
float32 even in a float64 model, so a forward batched differently (FSDP2 runs one prompt pass and one response pass
per rank, one process chunks its whole batch) would agree only to float32 rounding there (1.8e-8 absolute measured
under FSDP2), not to the 1e-12 that the parallel paths owe.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.llm.config import config_from_dict
from posttrain.llm.methods.catalog import build_algorithm
from posttrain.llm.rollout.tasks import Problem
from tests.llm._lift import small_config
from tests.llm.fakes import FixedEngine, TableTask
from tests.llm.rollout.test_shared_prefix import exact_norms

pytest.importorskip("transformers", reason="needs the [llm] extra (transformers)")

G, K = 4, 2
RESPONSES = [[5 + (i % 7)] * (1 + i % 4) + [3] for i in range(G * K)]
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _reference(tiny_dir: Path, strategy: str) -> Any:
    """A reference model off the policy (weights + seeded noise), placed for ``strategy`` by ``wrap_frozen``."""
    from transformers import AutoModelForCausalLM

    from posttrain.llm.train.parallel import wrap_frozen

    ref = exact_norms(AutoModelForCausalLM.from_pretrained(tiny_dir).double())
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return wrap_frozen(ref, strategy)


def _global_batch_and_grads(
    tiny_dir: Path, mode: str, world: int, rank: int, strategy: str = "ddp", kl: bool = False
) -> tuple[float, list[torch.Tensor]]:
    """Loss and full gradients on this rank's share of the fixed global batch (the whole batch when world=1);
    with ``kl``, GRPO + k3 KL to a reference model placed like the policy (sharded under FSDP2)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.llm.methods.needs import logp_filler
    from posttrain.llm.train.parallel import full_tensor, is_sharded, wrap_model
    from posttrain.llm.train.trainer import Trainer

    model = exact_norms(AutoModelForCausalLM.from_pretrained(tiny_dir).double())
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    penalty: dict[str, Any] = {"kl": "k3", "kl_coef": 0.5} if kl else {}
    cfg = config_from_dict(
        {
            "data": {"prompts_per_step": G},
            "rollout": {"group_size": K, "max_new_tokens": 6},
            "algorithm": {"method": "grpo", "aggregation": mode, **penalty},
            "optim": {"micro_batch_size": K, "max_grad_norm": None},
        }
    )
    alg = build_algorithm(method="grpo", horizon=6, aggregation=mode, **penalty)
    fillers = {}
    if kl:
        ref = _reference(tiny_dir, strategy)
        assert is_sharded(ref) == (strategy == "fsdp" and world > 1)
        fillers["logp_ref"] = logp_filler(ref, 1.0)
    wrapped = wrap_model(model, strategy) if world > 1 else model
    trainer = Trainer(
        cfg, model=wrapped, tokenizer=tok, task=TableTask(), engine=FixedEngine(model, RESPONSES), algorithm=alg,
        sampling=cfg.rollout.sampling(), fillers=fillers,
    )  # fmt: skip
    # the fixed engine returns the global batch (so the maker draws every problem); this rank keeps its groups below
    maker = trainer.maker
    trainer.rank, trainer.world, trainer.maker = 0, 1, dataclasses.replace(maker, rank=0, world=1)
    batch, _ = trainer.rollout()
    trainer.rank, trainer.world, trainer.maker = rank, world, maker
    share = batch.batch_size // world
    local = batch.rows(rank * share, (rank + 1) * share)
    stats = trainer.accumulate_gradients(local)
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    return stats["loss"], [full_tensor(g).detach().clone() for g in grads if g is not None]


def _spawn(tmp: Path, worker: Any, *args: Any, timeout: float | None = None) -> None:
    """Run ``worker(rank, *args)`` in 2 processes joined in a gloo group (rendezvous file under ``tmp``);
    with ``timeout`` (seconds), processes still running then (e.g. a collective hang) are killed and the test fails."""
    import torch.multiprocessing as mp

    procs = mp.spawn(_in_group, args=(str(tmp / "init"), worker, args), nprocs=2, join=False)
    deadline = None if timeout is None else time.monotonic() + timeout
    while not procs.join(None if deadline is None else max(deadline - time.monotonic(), 0.0)):
        if deadline is not None and time.monotonic() >= deadline:
            for p in procs.processes:
                p.kill()
                p.join()
            pytest.fail(f"the 2 gloo processes were still running after {timeout} s (a collective hang?)")


def _in_group(rank: int, init_file: str, worker: Any, args: tuple[Any, ...]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        worker(rank, *args)
        dist.barrier()  # neither rank tears gloo down while the other still talks to it
    finally:
        dist.destroy_process_group()


def test_distributed_strategy_is_validated_and_inert_in_one_process(tiny: tuple[Any, Any]) -> None:
    from posttrain.errors import DomainError
    from posttrain.llm.train.parallel import is_sharded, wrap_model

    assert config_from_dict({}).distributed.strategy == "ddp"
    with pytest.raises(DomainError, match=r"distributed\.strategy.*valid: ddp, fsdp"):
        config_from_dict({"distributed": {"strategy": "zero3"}})
    with pytest.raises(DomainError, match=r"distributed\.strategy.*rollout\.engine='vllm'"):
        config_from_dict({"distributed": {"strategy": "fsdp"}, "rollout": {"engine": "vllm"}})
    with pytest.raises(DomainError, match=r"rollout\.replay.*fsdp"):
        config_from_dict({"distributed": {"strategy": "fsdp"}, "rollout": {"replay": {"rule": "hdr"}}})
    model = tiny[0]
    for strategy in ("ddp", "fsdp"):  # no process group: the model is used as is
        assert wrap_model(model, strategy) is model and not is_sharded(model)


def _worker(rank: int, tiny_dir: str, out: str, strategy: str) -> None:
    results = {mode: _global_batch_and_grads(Path(tiny_dir), mode, 2, rank, strategy) for mode in MODES}
    losses = {m: torch.tensor(r[0], dtype=torch.float64) for m, r in results.items()}
    for t in losses.values():
        dist.all_reduce(t)  # each rank's loss is its share of the global loss
    if rank == 0:
        torch.save({m: (float(losses[m]), r[1]) for m, r in results.items()}, out)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_gloo_processes_equal_one(tiny_dir: Path, tmp_path: Path, strategy: str) -> None:
    out = tmp_path / "ddp.pt"
    _spawn(tmp_path, _worker, str(tiny_dir), str(out), strategy)
    ddp: dict[str, Any] = torch.load(out, weights_only=True)
    for mode in MODES:
        loss, grads = _global_batch_and_grads(tiny_dir, mode, 1, 0)
        assert ddp[mode][0] == pytest.approx(loss, rel=1e-10), mode
        for a, b in zip(ddp[mode][1], grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def _kl_worker(rank: int, tiny_dir: str, out: str) -> None:
    loss, grads = _global_batch_and_grads(Path(tiny_dir), "token-mean", 2, rank, "fsdp", kl=True)
    total = torch.tensor(loss, dtype=torch.float64)
    dist.all_reduce(total)
    if rank == 0:
        torch.save((float(total), grads), out)


@pytest.mark.slow
def test_fsdp_with_a_sharded_reference_equals_one_process(tiny_dir: Path, tmp_path: Path) -> None:
    """GRPO + k3 KL under FSDP2 with the reference model sharded too (its forwards are collectives): the loss
    and gradients equal one process with an unsharded reference, and the KL term is active."""
    out = tmp_path / "kl.pt"
    _spawn(tmp_path, _kl_worker, str(tiny_dir), str(out))
    sharded_loss, sharded_grads = torch.load(out, weights_only=True)
    loss, grads = _global_batch_and_grads(tiny_dir, "token-mean", 1, 0, kl=True)
    plain_loss, _ = _global_batch_and_grads(tiny_dir, "token-mean", 1, 0)
    assert abs(loss - plain_loss) > 1e-3  # the KL term contributes
    assert sharded_loss == pytest.approx(loss, rel=1e-10)
    for a, b in zip(sharded_grads, grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


FIT_ALGORITHMS: dict[str, dict[str, Any]] = {
    "grpo_kl": {"method": "grpo", "kl": "k3", "kl_coef": 0.05},  # the reference is sharded too
    "flowrl": {"method": "flowrl", "options": {"beta": 2.0, "width": 8}},  # + a learned log Z beside the policy
}


def _fit_worker(rank: int, out_dir: str, result: str, algorithm: str) -> None:
    """Under FSDP2: 2 steps uninterrupted in ``out/full``; 1 step, then resume and 1 more in ``out/resumed``."""
    from posttrain.llm.run import build_trainer
    from posttrain.llm.train.parallel import full_state_dict, is_sharded

    cfg = config_from_dict(
        {
            "data": {"prompts_per_step": 2, "sft_steps": 0},
            "rollout": {"group_size": 2, "max_new_tokens": 6},
            "algorithm": FIT_ALGORITHMS[algorithm],
            "optim": {"steps": 2, "lr": 1e-2},
            "checkpoint": {"every": 1},
            "logging": {"progress": False},
            "distributed": {"strategy": "fsdp"},
        }
    )
    full = build_trainer(cfg, Path(out_dir) / "full")
    assert is_sharded(full.model)
    history = full.fit()
    first = build_trainer(cfg, Path(out_dir) / "resumed")
    resumed_history = first.fit(stop_after=1)
    resumed = build_trainer(cfg, Path(out_dir) / "resumed", resume=True)
    assert resumed.step == 1
    resumed_history += resumed.fit()
    weights, resumed_weights = full_state_dict(full.model), full_state_dict(resumed.model)  # collectives
    if rank == 0:
        torch.save(
            {
                "weights": weights,
                "resumed_weights": resumed_weights,
                "modules": [m.state_dict() for m in full.algorithm.modules],
                "resumed_modules": [m.state_dict() for m in resumed.algorithm.modules],
                "losses": [m["loss"] for m in history],
                "resumed_losses": [m["loss"] for m in resumed_history],
            },
            result,
        )


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(FIT_ALGORITHMS))
def test_fsdp_fit_writes_a_full_checkpoint_and_resumes(tmp_path: Path, algorithm: str) -> None:
    """2 gloo processes under FSDP2 (policy and reference sharded) train 2 steps; the checkpoint is the full
    model, loadable by ``from_pretrained``, and a run resumed after step 1 ends with the same weights and losses
    (FlowRL: also the same log-Z MLP, whose optimizer state the sharded checkpoint holds beside the policy's)."""
    from transformers import AutoModelForCausalLM

    from posttrain.llm.train.checkpoint import latest_checkpoint

    result = tmp_path / "result.pt"
    _spawn(tmp_path, _fit_worker, str(tmp_path), str(result), algorithm)
    out = tmp_path / "full"
    final: dict[str, Any] = torch.load(result, weights_only=True)
    assert len(final["losses"]) == 2 and all(math.isfinite(x) for x in final["losses"])
    ckpt = latest_checkpoint(out / "checkpoints")
    assert ckpt is not None and ckpt.name == "step_000002"
    loaded = AutoModelForCausalLM.from_pretrained(ckpt / "model").state_dict()
    initial = AutoModelForCausalLM.from_pretrained(out / "initial").state_dict()
    assert set(loaded) == set(final["weights"])
    for name, value in final["weights"].items():
        torch.testing.assert_close(loaded[name], value, rtol=0, atol=0, msg=name)
    assert any(not torch.equal(loaded[n], initial[n]) for n in loaded)  # the 2 steps changed the weights
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert final["resumed_losses"] == final["losses"]
    for name, value in final["weights"].items():
        torch.testing.assert_close(final["resumed_weights"][name], value, rtol=0, atol=0, msg=name)
    assert len(final["modules"]) == (algorithm == "flowrl") and len(final["resumed_modules"]) == len(final["modules"])
    for module, resumed in zip(final["modules"], final["resumed_modules"], strict=True):
        for name, value in module.items():
            torch.testing.assert_close(resumed[name], value, rtol=0, atol=0, msg=name)


def _generate_worker(rank: int, tiny_dir: str, result: str) -> None:
    from transformers import AutoModelForCausalLM

    from posttrain.llm.rollout.engine import HFEngine, SamplingConfig
    from posttrain.llm.train.parallel import is_sharded, wrap_model

    model = AutoModelForCausalLM.from_pretrained(tiny_dir).double()
    prompts = [[[5, 6, 7]], [[8, 9]]]
    sampling = SamplingConfig(max_new_tokens=6)
    first = HFEngine(model, pad_id=0, eos_id=0, sampling=SamplingConfig(max_new_tokens=1))
    eos = int(first.generate(prompts[1], n=1, seed=0, greedy=True).response_ids[0, 0])  # rank 1 stops at once
    plain = HFEngine(model, pad_id=0, eos_id=eos, sampling=sampling).generate(prompts[rank], n=2, seed=0, greedy=True)
    wrap_model(model, "fsdp")
    assert is_sharded(model)
    synced = HFEngine(model, pad_id=0, eos_id=eos, sampling=sampling, synced_gpus=True)
    sharded = synced.generate(prompts[rank], n=2, seed=0, greedy=True)
    lengths = [torch.zeros(2, dtype=torch.long) for _ in range(2)]
    dist.all_gather(lengths, plain.mask.sum(-1))
    if rank == 0:
        torch.save({"lengths": lengths, "plain": plain, "sharded": sharded}, result)


@pytest.mark.slow
def test_fsdp_generation_with_uneven_lengths_equals_unsharded(tiny_dir: Path, tmp_path: Path) -> None:
    """Ranks whose responses end at different steps neither deadlock nor change the sampled tokens."""
    result = tmp_path / "gen.pt"
    _spawn(tmp_path, _generate_worker, str(tiny_dir), str(result))
    got: dict[str, Any] = torch.load(result, weights_only=False)
    assert not torch.equal(got["lengths"][0], got["lengths"][1])  # the case under test: uneven lengths
    plain, sharded = got["plain"], got["sharded"]
    width = plain.mask.shape[1]
    assert not sharded.mask[:, width:].any()
    torch.testing.assert_close(sharded.mask[:, :width], plain.mask)
    torch.testing.assert_close(sharded.response_ids[:, :width] * plain.mask, plain.response_ids * plain.mask)
    torch.testing.assert_close(sharded.logp[:, :width], plain.logp, rtol=1e-9, atol=1e-12)


class _HalfTableTask(TableTask):
    """:class:`TableTask`'s graded rewards on a step's prompts ``d+0=`` and ``d+1=`` (rank 0's share of 4 under
    2 ranks), 0 on the rest: only rank 0's groups are mixed-outcome, so only rank 0's replay buffer fills."""

    def reward(self, problem: Problem, completion: str) -> float:
        return super().reward(problem, completion) if int(problem.prompt.split("+")[1][:-1]) < 2 else 0.0


def _replay_worker(rank: int, out_dir: str) -> None:
    """3 GRPO steps under DDP with replay, micro-batches of one group; this rank's replay log and final weights."""
    from posttrain.llm.run import build_trainer
    from posttrain.llm.train.parallel import rank_and_world

    cfg = small_config(
        steps=3, micro_batch_size=4, rollout={"replay": {"rule": "naive_recency", "k_rep": 2, "tau": 1e9}}
    )
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, sft_steps=0))
    trainer = build_trainer(cfg, Path(out_dir) / "run")
    assert isinstance(trainer.model, torch.nn.parallel.DistributedDataParallel) and rank_and_world() == (rank, 2)
    assert cfg.optim.micro_batch_size == cfg.rollout.group_size
    trainer.task = _HalfTableTask()
    all_reduce, calls = dist.all_reduce, [0]

    def counted(*args: Any, **kwargs: Any) -> Any:  # the trainer's normaliser and FLOP sums
        calls[0] += 1
        return all_reduce(*args, **kwargs)

    dist.all_reduce = counted
    try:
        history = trainer.fit()
    finally:
        dist.all_reduce = all_reduce
    weights = {k: v.detach().clone() for k, v in trainer.policy.state_dict().items()}
    result = {"groups": [h["replay/groups"] for h in history], "all_reduce": calls[0], "weights": weights}
    torch.save(result, Path(out_dir) / f"{rank}.pt")


@pytest.mark.slow
def test_ddp_ranks_replaying_unequal_groups_stay_in_sync(tmp_path: Path) -> None:
    """Each rank keeps its own replay buffer: here rank 0 replays groups while rank 1 (no mixed-outcome groups)
    replays none, so rank 0 runs more micro-batch forwards per update. The run completes (no collective hang),
    both ranks issue the same all-reduces (normaliser, FLOPs) and end with bitwise-identical weights."""
    _spawn(tmp_path, _replay_worker, str(tmp_path), timeout=300)
    got = [torch.load(tmp_path / f"{rank}.pt", weights_only=True) for rank in range(2)]
    assert any(a != b for a, b in zip(got[0]["groups"], got[1]["groups"], strict=True)), got  # the case under test
    assert sum(got[0]["groups"]) > 0 and sum(got[1]["groups"]) == 0
    assert got[0]["all_reduce"] == got[1]["all_reduce"] > 0  # the same collectives on both ranks
    assert set(got[0]["weights"]) == set(got[1]["weights"])
    for name, value in got[0]["weights"].items():
        assert torch.equal(value, got[1]["weights"][name]), name


@settings(max_examples=25, deadline=None)
@given(
    scale=st.floats(1e-3, 1e3),
    max_norm=st.floats(1e-2, 10.0),
    with_modules=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_clip_gradients_clips_policy_and_modules_by_their_joint_norm(
    scale: float, max_norm: float, with_modules: bool, seed: int
) -> None:
    """The joint 2-norm of policy + module gradients is returned and clipped to ``max_norm``, one common factor
    (the direction is kept); without modules it is ``clip_grad_norm_``; ``max_norm=None`` leaves gradients alone."""
    from posttrain.llm.train.parallel import clip_gradients

    gen = torch.Generator().manual_seed(seed)
    policy, module = torch.nn.Linear(3, 2).double(), torch.nn.Linear(2, 1).double()
    params = {"policy": list(policy.parameters()), "module": list(module.parameters()) if with_modules else []}
    for p in params["policy"] + params["module"]:
        p.grad = scale * torch.randn(p.shape, generator=gen, dtype=p.dtype)
    before = [p.grad.clone() for p in params["policy"] + params["module"]]  # type: ignore[union-attr]
    joint = float(torch.sqrt(sum((g**2).sum() for g in before)))
    assert math.isnan(clip_gradients(params["policy"], params["module"], None))
    assert all(torch.equal(p.grad, b) for p, b in zip(params["policy"] + params["module"], before, strict=True))
    total = clip_gradients(params["policy"], params["module"], max_norm)
    assert total == pytest.approx(joint, rel=1e-12)
    after = [p.grad for p in params["policy"] + params["module"]]
    factor = min(1.0, max_norm / (joint + 1e-6))
    for a, b in zip(after, before, strict=True):
        torch.testing.assert_close(a, b * factor, rtol=1e-12, atol=0)
    if not with_modules:  # the same as torch's own clipping
        for p, b in zip(params["policy"], before, strict=True):
            p.grad = b.clone()
        assert float(torch.nn.utils.clip_grad_norm_(params["policy"], max_norm)) == pytest.approx(total, rel=1e-12)
