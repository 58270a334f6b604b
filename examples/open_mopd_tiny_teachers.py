"""Build the two domain teachers of ``examples/open_mopd_tiny_cpu.yaml``: tiny models, each fine-tuned on one domain.

Each teacher is the tiny model of the example (2 layers, the run's seed) after ``--steps`` supervised
steps on its own task only: ``addition`` (one-digit sums) and ``multiple`` (a positive multiple of a
below b). The student of the example starts from the same tiny model after a short SFT on the mixture
of both, so each teacher is better than the student on its domain, and the student must be routed to
the right one per prompt. Saved with ``save_pretrained`` (model and the shared character tokenizer).

Run once before the example (a few seconds on a CPU):

    python examples/open_mopd_tiny_teachers.py --out runs/open_mopd_teachers
    posttrain train examples/open_mopd_tiny_cpu.yaml --out runs/open_mopd
"""

from __future__ import annotations

import argparse
from pathlib import Path

DOMAINS = {"addition": ("addition", {"digits": 1}), "multiple": ("multiple", {})}
"""Domain name -> (task, options): the components of the example's ``mixture`` task."""


def build_teachers(out: Path, *, steps: int = 80, seed: int = 0, lr: float = 1e-3) -> dict[str, Path]:
    """One SFT'd tiny teacher per domain under ``out/<domain>``; returns the directories."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.llm.rollout.tasks import make_task
    from posttrain.llm.tools.tiny import TinyConfig, build_tiny
    from posttrain.llm.train.sft import sft_warmup

    base = build_tiny(out / "base", TinyConfig(num_hidden_layers=2), seed=seed)
    dirs = {}
    for i, (name, (task, options)) in enumerate(DOMAINS.items()):
        model = AutoModelForCausalLM.from_pretrained(base)
        tokenizer = AutoTokenizer.from_pretrained(base)
        sft_warmup(model, tokenizer, make_task(task, **options), steps=steps, lr=lr, seed=seed + 1 + i)
        dirs[name] = out / name
        model.save_pretrained(dirs[name])
        tokenizer.save_pretrained(dirs[name])
    return dirs


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/open_mopd_teachers"))
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for name, path in build_teachers(args.out, steps=args.steps, seed=args.seed).items():
        print(f"{name}: {path}")
