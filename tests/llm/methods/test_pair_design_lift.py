"""DPO pair design and DPO on the tiny model: by-hand float64 equality, caps, JSONL, config errors, end to end."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from posttrain.errors import DomainError
from posttrain.estimators import dpo_loss
from posttrain.llm.config import config_from_dict, load_config
from posttrain.llm.methods.dpo import dpo_pair_loss, encode_pairs, sequence_logprobs
from posttrain.llm.methods.pairs import PreferencePair, label_pairs, pool_forward, read_pairs, write_pairs
from posttrain.theory.dpo_design import edge_vectors, policy_curvature, within_prompt_pairs
from posttrain.theory.dpo_design_solvers import frank_wolfe_design
from posttrain.theory.dpo_pair_selection import select_pairs, standardise_features

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
PAIRS = [
    PreferencePair("3+4=", "7", "8"),
    PreferencePair("9+9=", "18", "1"),
    PreferencePair("1+1=", "2", "3", tie=True),
]


def _by_hand_seq_logp(model: Any, tokenizer: Any, prompt: str, response: str) -> torch.Tensor:
    """sum_t log softmax(z_t)[y_t] over ``response + <eos>``, one unpadded sequence, float64."""
    x = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    y = [*tokenizer(response, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    logits = model(input_ids=torch.tensor([x + y])).logits[0].double()
    logp = torch.log_softmax(logits[len(x) - 1 : -1], dim=-1)  # position i predicts token i + 1
    return logp.gather(-1, torch.tensor(y).unsqueeze(-1)).sum()


def _by_hand_loss(policy: Any, reference: Any, tokenizer: Any, beta: float, eps: float) -> torch.Tensor:
    rows = []
    for p in PAIRS:
        lp = [_by_hand_seq_logp(policy, tokenizer, p.prompt, y) for y in (p.chosen, p.rejected)]
        with torch.no_grad():
            lr = [_by_hand_seq_logp(reference, tokenizer, p.prompt, y) for y in (p.chosen, p.rejected)]
        args = [t.reshape(1) for t in (*lp, *lr)]
        rows.append(dpo_loss(*args, beta=beta, label_smoothing=0.5 if p.tie else eps)[0])
    return torch.cat(rows).mean()


@pytest.fixture()
def models64(tiny: tuple[Any, Any]) -> tuple[Any, Any, Any]:
    model, tokenizer = tiny
    model = model.double()
    reference = copy.deepcopy(model)
    with torch.no_grad():  # a reference different from the policy
        for p in reference.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype))
    return model, reference.requires_grad_(False), tokenizer


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_dpo_loss_and_gradients_equal_dpo_loss_by_hand(models64: tuple[Any, Any, Any], eps: float) -> None:
    model, reference, tokenizer = models64
    enc = encode_pairs(tokenizer, PAIRS)
    with torch.no_grad():
        ref = sequence_logprobs(reference, enc)
    loss, diag = dpo_pair_loss(sequence_logprobs(model, enc), ref, enc.tie, beta=0.3, label_smoothing=eps)
    assert loss.dtype == torch.float64 and loss.shape == (3,)
    mine = torch.autograd.grad(loss.mean(), list(model.parameters()))
    want_loss = _by_hand_loss(model, reference, tokenizer, 0.3, eps)
    want = torch.autograd.grad(want_loss, list(model.parameters()))
    torch.testing.assert_close(loss.mean(), want_loss, rtol=1e-10, atol=1e-12)
    for a, b in zip(mine, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-11)
    assert float(diag.margin.abs().min()) > 0  # the reference differs: a non-trivial margin


def _dpo_cfg(tmp: Path, **dpo: Any) -> Any:
    write_pairs(tmp / "pairs.jsonl", PAIRS)
    return config_from_dict({
        "model": {"dtype": "float64"}, "dpo": {"pairs": str(tmp / "pairs.jsonl"), "beta": 0.3, "batch_size": 3, **dpo},
        "optim": {"steps": 1, "name": "SGD", "lr": 0.5, "max_grad_norm": None}, "logging": {"progress": False},
    })  # fmt: skip


@pytest.mark.parametrize("micro", [None, 1])
def test_one_dpo_step_is_sgd_on_the_by_hand_gradient(
    models64: tuple[Any, Any, Any], tmp_path: Path, micro: Any
) -> None:
    from posttrain.llm.train.dpo import train_dpo

    model, reference, tokenizer = models64
    cfg = _dpo_cfg(tmp_path, micro_batch_size=micro)
    before = [p.detach().clone() for p in model.parameters()]
    grads = torch.autograd.grad(_by_hand_loss(model, reference, tokenizer, 0.3, 0.0), list(model.parameters()))
    rows = train_dpo(cfg, model=model, reference=reference, tokenizer=tokenizer, pairs=PAIRS, out_dir=None)
    for p, b, g in zip(model.parameters(), before, grads, strict=True):
        torch.testing.assert_close(p.detach(), b - 0.5 * g, rtol=1e-8, atol=1e-11)
    assert {"loss", "reward_accuracy", "margin", "ties", "grad_norm", "step_time_s"} <= set(rows[0])
    assert rows[0]["ties"] == 1


def test_pool_forward_features_and_logp_by_hand(tiny: tuple[Any, Any]) -> None:
    model, tokenizer = tiny
    model = model.double()
    enc = encode_pairs(tokenizer, PAIRS)  # 6 rows, left-padded prompts, right-padded responses
    phi, logp = pool_forward(model, enc.prompt_ids, enc.prompt_mask, enc.response_ids, enc.mask)
    texts = [(p.prompt, y) for y in ("chosen", "rejected") for p in PAIRS]
    for row, (prompt, which) in enumerate(texts):
        response = getattr(PAIRS[row % 3], which)
        x = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        y = [*tokenizer(response, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        with torch.no_grad():
            out = model(input_ids=torch.tensor([x + y]), output_hidden_states=True)
            want = _by_hand_seq_logp(model, tokenizer, prompt, response)
        torch.testing.assert_close(phi[row], out.hidden_states[-1][0, -1], rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(logp[row], want, rtol=1e-10, atol=1e-10)


def test_curvature_is_the_pi0_weighted_within_pool_covariance() -> None:
    rng = np.random.default_rng(0)
    phi, logp = rng.normal(size=(5, 4, 3)), rng.normal(size=(5, 4)) * 3
    want = np.zeros((3, 3))
    for x in range(5):  # loop form: weights renormalised over each prompt's pool
        w = np.exp(logp[x] - logp[x].max())
        w /= w.sum()
        mean = w @ phi[x]
        want += sum(w[k] * np.outer(phi[x, k] - mean, phi[x, k] - mean) for k in range(4)) / 5
    np.testing.assert_allclose(policy_curvature(phi, logp, beta=0.2), 0.1 * want, rtol=1e-12)


def test_caps_hold_and_match_the_uncapped_draw_when_loose() -> None:
    rng = np.random.default_rng(1)
    phi, logp = rng.normal(size=(8, 5, 6)), rng.normal(size=(8, 5))
    capped = select_pairs(phi, logp, 16, max_per_prompt=2, seed=4)
    assert len(capped.edges) == 16 and np.bincount(capped.edges[:, 0]).max() <= 2
    free = select_pairs(phi, logp, 16, seed=4)
    loose = select_pairs(phi, logp, 16, max_per_prompt=10, seed=4)
    assert np.array_equal(free.edges, loose.edges)
    with pytest.raises(DomainError, match="n_pairs"):
        select_pairs(phi, logp, 17, max_per_prompt=2)


def test_labels_ties_and_unjudged() -> None:
    edges = np.array([[0, 0, 1], [0, 1, 2], [1, 0, 1], [1, 1, 2]])
    texts = [["a", "b", "b"], ["c", "d", "e"]]
    rewards = np.array([[0.0, 1.0, 1.0], [1.0, 0.0, np.nan]])
    pairs, counts = label_pairs(edges, np.full(4, 0.25), ["p", "q"], texts, rewards, ties="exclude")
    assert [(p.chosen, p.rejected) for p in pairs] == [("b", "a"), ("c", "d")]
    assert counts == {"drawn": 4, "ties": 1, "identical": 1, "unjudged": 1, "written": 2}
    kept, _ = label_pairs(edges, np.full(4, 0.25), ["p", "q"], texts, rewards, ties="keep")
    assert [p.tie for p in kept] == [False, True, False]


def test_jsonl_round_trip_and_errors(tmp_path: Path) -> None:
    pairs = [PreferencePair("p", "a", "b", 0.25, 3, (1, 0), (1.0, 0.0)), PreferencePair("q", "c", "d", tie=True)]
    write_pairs(tmp_path / "x.jsonl", pairs)
    assert read_pairs(tmp_path / "x.jsonl") == pairs
    raw = [PreferencePair("p", "a", "b", 0.5, 0, (0, 1), labelled=False)]
    write_pairs(tmp_path / "raw.jsonl", raw)
    assert "completion_a" in (tmp_path / "raw.jsonl").read_text()
    assert read_pairs(tmp_path / "raw.jsonl", labelled=False) == raw
    with pytest.raises(DomainError, match=r"dpo.pairs: .*raw.jsonl:1 needs string chosen, rejected \(an unlabelled"):
        read_pairs(tmp_path / "raw.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "p", "chosen": "a"}\n')
    with pytest.raises(DomainError, match=r"bad.jsonl:1 needs string rejected"):
        read_pairs(tmp_path / "bad.jsonl")


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ({"pairs": {"n_pairs": 449}}, r"pairs\.n_pairs: expected <= 448"),
        ({"pairs": {"max_per_prompt": 2, "n_pairs": 33}}, r"pairs\.n_pairs: expected <= 32"),
        ({"pairs": {"per_prompt": True, "max_per_prompt": 2, "n_pairs": 1}}, r"pairs\.max_per_prompt"),
        ({"pairs": {"completions": 1}}, r"pairs\.completions: expected an integer in \[2, 4096\], got 1"),
        ({"pairs": {"design": "dopt"}}, r"pairs\.design: unknown name 'dopt'; valid: optimal, uniform"),
        ({"pairs": {"ties": "half"}}, r"pairs\.ties: unknown name"),
        ({"pairs": {"ridge": 0.0}}, r"pairs\.ridge: expected a number > 0"),
        ({"pairs": {"pca_dim": 0}}, r"pairs\.pca_dim"),
        ({"dpo": {"beta": 0.0}}, r"dpo\.beta: expected a number > 0"),
        ({"dpo": {"label_smoothing": 0.5}}, r"dpo\.label_smoothing"),
        ({"dpo": {"batch_size": 4, "micro_batch_size": 5}}, r"dpo\.micro_batch_size"),
        ({"dpo": {"bogus": 1}}, r"dpo: unknown key\(s\) bogus"),
    ],
)
def test_config_errors_name_the_key(raw: dict[str, Any], match: str) -> None:
    with pytest.raises(DomainError, match=match):
        config_from_dict(raw)


def test_examples_load() -> None:
    for name in ("pairs_design_tiny_cpu.yaml", "dpo_tiny_cpu.yaml"):
        load_config(EXAMPLES / name)


def _invoke(*args: str) -> Any:
    from typer.testing import CliRunner

    from posttrain.cli import app

    return CliRunner().invoke(app, list(args))


def test_dpo_command_needs_a_pairs_file(tmp_path: Path) -> None:
    result = _invoke("dpo", str(EXAMPLES / "dpo_tiny_cpu.yaml"), "--set", "dpo.pairs=null", "--out", str(tmp_path))
    assert result.exit_code == 2 and "dpo.pairs: set it" in result.output
    result = _invoke("dpo", str(EXAMPLES / "dpo_tiny_cpu.yaml"), "--set", f"dpo.pairs={tmp_path}/none.jsonl")
    assert result.exit_code == 2 and "is not a file" in result.output


def test_design_then_dpo_end_to_end(tmp_path: Path) -> None:
    design_dir, run_dir = tmp_path / "design", tmp_path / "dpo"
    small = ["model.tiny.num_hidden_layers=1", "data.sft_steps=4", "pairs.prompts=4", "pairs.completions=4",
             "pairs.n_pairs=6", "pairs.max_per_prompt=2", "pairs.pca_dim=8", "pairs.ties=keep", "rollout.max_new_tokens=3"]  # fmt: skip
    result = _invoke("pairs", str(EXAMPLES / "pairs_design_tiny_cpu.yaml"), "--out", str(design_dir),
                     *[a for s in small for a in ("--set", s)])  # fmt: skip
    assert result.exit_code == 0, result.output
    log = json.loads((design_dir / "design.json").read_text())
    pairs = read_pairs(design_dir / "pairs.jsonl")
    assert log["labels"]["drawn"] == 6 and log["labels"]["written"] == len(pairs) == 6  # ties kept
    assert log["max_pairs_of_a_prompt"] <= 2 and log["pool"]["edges"] == 24
    # the logged design is theory's Frank-Wolfe solution on the saved features
    pool = np.load(design_dir / "pool.npz")
    f = standardise_features(pool["phi"], pca_dim=8)
    g = edge_vectors(f, within_prompt_pairs(4, 4), beta=0.1)
    want = frank_wolfe_design(g, policy_curvature(f, pool["logp"], beta=0.1), ridge=1e-3, max_iter=2000, tol=1e-3)
    assert log["objective"] == pytest.approx(want.objective, rel=1e-12)
    edges = within_prompt_pairs(4, 4)
    for p in pairs:  # each pair's q is the solved design's weight of its edge
        a, b = sorted(p.pair or ())
        row = int(np.flatnonzero((edges == [p.prompt_index, a, b]).all(axis=1))[0])
        assert p.q == pytest.approx(want.q[row], rel=1e-12, abs=1e-15)
    sets = [f"dpo.pairs={design_dir / 'pairs.jsonl'}", f"dpo.eval_pairs={design_dir / 'pairs.jsonl'}",
            "optim.steps=3", "dpo.batch_size=4", "logging.eval_every=3", "data.eval_prompts=4", "logging.eval_samples=2",
            "rollout.max_new_tokens=3"]  # fmt: skip
    result = _invoke(
        "dpo", str(EXAMPLES / "dpo_tiny_cpu.yaml"), "--out", str(run_dir), *[a for s in sets for a in ("--set", s)]
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert {"loss", "reward_accuracy", "eval/pairs_loss", "eval/pairs_accuracy", "eval/reward_mean"} <= set(rows[-1])
    from safetensors.torch import load_file

    start = load_file(design_dir / "initial" / "model.safetensors")
    end = load_file(run_dir / "checkpoints" / "step_000003" / "model" / "model.safetensors")
    assert any(not torch.equal(start[k], end[k]) for k in start)
    assert rows[0]["loss"] == pytest.approx(
        float(F.softplus(torch.tensor(0.0))), rel=1e-5
    )  # policy = reference at step 1


def test_dpo_resolves_a_registered_model_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``model.path`` may name a prepared model (as in the SmolLM2 examples): the policy and reference load from its
    directory, never from the hub under that name."""
    import shutil

    from posttrain.llm.tools import models

    design_dir, run_dir = tmp_path / "design", tmp_path / "dpo"
    small = ["model.tiny.num_hidden_layers=1", "data.sft_steps=0", "pairs.prompts=2", "pairs.completions=4",
             "pairs.n_pairs=4", "pairs.pca_dim=4", "pairs.ties=keep", "rollout.max_new_tokens=3"]  # fmt: skip
    result = _invoke("pairs", str(EXAMPLES / "pairs_design_tiny_cpu.yaml"), "--out", str(design_dir),
                     *[a for s in small for a in ("--set", s)])  # fmt: skip
    assert result.exit_code == 0, result.output
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    name = next(iter(models.MODELS))
    prepared = models.model_dir(name)
    shutil.copytree(design_dir / "initial", prepared)
    (prepared / models.MARKER).write_text("{}")
    pairs = design_dir / "pairs.jsonl"
    sets = [f"model.path={name}", f"dpo.pairs={pairs}", f"dpo.eval_pairs={pairs}", "optim.steps=1", "dpo.batch_size=2"]
    result = _invoke(
        "dpo", str(EXAMPLES / "dpo_tiny_cpu.yaml"), "--out", str(run_dir), *[a for s in sets for a in ("--set", s)]
    )
    assert result.exit_code == 0, result.output
    assert (run_dir / "checkpoints" / "step_000001" / "model" / "model.safetensors").is_file()
