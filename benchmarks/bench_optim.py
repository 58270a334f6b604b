"""Muon (hidden matrices) + AdamW (rest) step vs an all-AdamW step on the tiny causal LM: a ratio."""

from __future__ import annotations

import importlib.util

import torch

from benchmarks._timing import Row, time_pair


def run(*, repeats: int = 10, hidden: int = 128, layers: int = 2) -> list[Row]:
    if importlib.util.find_spec("transformers") is None:  # pragma: no cover - the [llm] extra is missing
        return []
    from posttrain.llm.tools.tiny import TinyConfig, tiny_model
    from posttrain.llm.train.muon import MuonWithAdamW

    shape = TinyConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers)
    model = tiny_model(shape, 64, seed=0)
    torch.manual_seed(0)
    ids = torch.randint(64, (8, 32))
    model(input_ids=ids, labels=ids).loss.backward()
    muon = MuonWithAdamW(model, lr=0.02, adamw_lr=1e-3)
    muon_fp32 = MuonWithAdamW(model, lr=0.02, adamw_lr=1e-3, compute_dtype=None)
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)

    def step(opt: torch.optim.Optimizer) -> object:
        with torch.no_grad():
            snapshot = [p.detach().clone() for p in model.parameters()]
        opt.step()
        with torch.no_grad():  # undo, so every timed call sees the same weights
            for p, s in zip(model.parameters(), snapshot, strict=True):
                p.copy_(s)
        return None

    rows = []
    for name, opt in (("Muon+AdamW step (bf16 NS)", muon), ("Muon+AdamW step (fp32 NS)", muon_fp32)):
        ours, ref = time_pair(lambda o=opt: step(o), lambda: step(adamw), repeats=repeats)
        rows.append(Row(name, ours, ref, "torch AdamW step (same model)", None, higher_is_better=False))
    return rows
