"""One check per paper: a claim, seeded experiments, a primary endpoint, a three-way verdict, mutants.

Checks register a `PaperCheck` in `CHECKS` under the paper's two-digit id when their module is
imported; `load_all` imports every module listed in `MODULES`. The harness is split by concern:
``model`` (what a check declares and returns), ``stats`` (bounds, outcomes, the verdict),
``runner`` (run, select, rerun), ``report`` (JSON and markdown), ``tables`` (the terminal view),
``figures`` (one figure per check) and ``cli`` (``posttrain check`` and each module's ``main``).
"""

from __future__ import annotations

import importlib
from typing import Any

from posttrain.registry import Registry, registry

__all__ = ["CHECKS", "MODULES", "load_all", "register_check"]

CHECKS: Registry[Any] = registry("paper_check")

# One line per check module; a module registers its check on import.
MODULES: list[str] = [
    "posttrain.paper_checks.p09_diffusion_path_space",
    "posttrain.paper_checks.p06_demystifying",
    "posttrain.paper_checks.p05_es_coverage",
    "posttrain.paper_checks.p10_es_solution_coverage",
    "posttrain.paper_checks.p19_select_improve",
    "posttrain.paper_checks.p12_muon",
    "posttrain.paper_checks.p17_sar",
    "posttrain.paper_checks.p20_tsallis",
    "posttrain.paper_checks.p02_hdr",
    "posttrain.paper_checks.p11_rail",
    "posttrain.paper_checks.p14_gflowrl",
    "posttrain.paper_checks.p16_sis",
    "posttrain.paper_checks.p01_opd_then_rl",
    "posttrain.paper_checks.p04_self_routing",
    "posttrain.paper_checks.p07_orarl",
    "posttrain.paper_checks.p08_open_mopd",
    "posttrain.paper_checks.p13_opd2",
    "posttrain.paper_checks.p18_dpo_design",
    "posttrain.paper_checks.p15_race",
    "posttrain.paper_checks.p03_budget",
]


def register_check(check: Any) -> Any:
    """Register a `PaperCheck` under its id (summary = its claim)."""
    CHECKS.add(check.id, check, paper=check.paper, summary=check.claim)
    return check


def load_all() -> None:
    """Import every check module (each registers itself)."""
    for name in MODULES:
        importlib.import_module(name)
