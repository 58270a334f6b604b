"""The ``posttrain`` command line (typer + rich).

Subcommands register here; the heavy ones import their modules lazily so ``posttrain --help``
stays fast.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable
from typing import Any, TypeVar

from posttrain._extras import missing_extra_message

try:
    import typer
    from rich.console import Console
    from rich.table import Table
except ModuleNotFoundError as _exc:  # the [cli] extra is not installed: one line, no traceback
    raise SystemExit(missing_extra_message(_exc) or str(_exc)) from None

from posttrain.paper_checks.cli import OPTIONS as CHECK_OPTIONS

app = typer.Typer(
    name="posttrain",
    help="LLM post-training methods: estimators, toy paper checks, and an LLM trainer.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])
_STATE = {"debug": False}
BAD_INPUT: tuple[type[BaseException], ...] = (ValueError, KeyError, OSError)
"""Exceptions that mean a bad input (a config key, a flag, a path): one line and exit code 2 unless ``--debug``.
`PosttrainError`'s subclasses are among them (``DomainError`` is a ``ValueError``)."""


def _version(value: bool) -> None:
    if value:
        from posttrain import __version__

        console.print(f"posttrain {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, metavar="", help="Print the version and exit."
    ),
    debug: bool = typer.Option(
        False, "--debug", metavar="", help="Show the full traceback of an error instead of one line."
    ),
) -> None:
    """LLM post-training methods: estimators, toy paper checks, and an LLM trainer.

    A flag's ``metavar=""`` keeps typer's help from showing it as an option that takes a value (``<bool>``).
    """
    _STATE["debug"] = debug


def bad_input_exits(fn: F) -> F:
    """Wrap a command: a bad input (`BAD_INPUT`) ends with one red line naming it and exit code 2;
    ``posttrain --debug CMD`` re-raises it with its traceback."""
    from posttrain.errors import PosttrainError

    caught: tuple[type[BaseException], ...] = (*BAD_INPUT, PosttrainError)

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except caught as exc:
            if _STATE["debug"]:
                raise
            text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
            kind = "" if isinstance(exc, PosttrainError) else f"{type(exc).__name__}: "
            first = text.splitlines()[0] if text else ""
            err_console.print(f"[red]error:[/red] {kind}{first}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return run  # type: ignore[return-value]


# Modules whose import registers estimators, checks, ... (kept in one list so `list` sees all).
REGISTERING_MODULES = [
    "posttrain.estimators",
    "posttrain.estimators.optim",
    "posttrain.estimators.merging",
    "posttrain.paper_checks",
]


def load_registries() -> None:
    """Import every module that registers something."""
    for name in REGISTERING_MODULES:
        importlib.import_module(name)
    from posttrain.paper_checks import load_all

    load_all()


@app.command("list")
@bad_input_exits
def list_registered(
    kind: str = typer.Argument(None, help="Only this registry (e.g. advantage), or 'paper' for the paper table."),
    paper_id: str = typer.Option(None, "--paper", help="The functions of one paper (e.g. 16, or core)."),
) -> None:
    """List every registered estimator (and check) with its one-line summary and paper.

    'posttrain list paper' prints the paper table (each paper and the functions that implement it),
    'posttrain list --paper 16' one paper's functions, modules and entry points.
    """
    from rich.text import Text

    from posttrain.registry import REGISTRIES

    if paper_id is not None:
        _print_paper(paper_id)
        return
    if kind == "paper":
        _print_papers()
        return
    load_registries()
    kinds = [kind] if kind else sorted(REGISTRIES)
    for k in kinds:
        if k not in REGISTRIES:
            valid = ", ".join(sorted(REGISTRIES))
            raise typer.BadParameter(f"unknown registry {k!r}; valid: {valid} (or 'paper' for the paper table)")
        reg = REGISTRIES[k]
        table = Table(title=f"{k} ({len(reg)})", show_lines=False)
        table.add_column("name", style="bold")
        table.add_column("summary", overflow="fold")
        table.add_column("paper", style="dim", overflow="fold")
        for e in reg:
            table.add_row(e.name, Text(plain_summary(e)), Text(e.paper))
        console.print(table)


def _print_papers() -> None:
    """The paper table: id, title, arXiv ids, estimator functions, checks, docs page."""
    from rich.text import Text

    from posttrain.papers import PAPERS

    table = Table(title=f"papers ({len(PAPERS)}; `posttrain list --paper ID` for one)", show_lines=False)
    for column in ("id", "title", "arXiv", "estimators", "elsewhere", "checks"):
        table.add_column(column, overflow="fold", style="bold" if column == "id" else None)
    for p in PAPERS:
        table.add_row(
            p.id,
            Text(p.title),
            Text(", ".join(p.arxiv)),
            Text(", ".join(p.functions())),
            Text(", ".join(p.elsewhere)),
            ", ".join(p.checks),
        )
    console.print(table)


def _print_paper(paper_id: str) -> None:
    """One paper: each estimator function with its module and summary, then the other entry points."""
    from rich.text import Text

    from posttrain.papers import paper, resolve

    p = paper(paper_id)
    arxiv = ", ".join(f"arXiv:{a}" for a in p.arxiv)
    table = Table(title=f"{p.id}: {p.title} ({arxiv})", show_lines=False)
    table.add_column("function", style="bold")
    table.add_column("module", style="dim")
    table.add_column("summary", overflow="fold")
    for entry in p.estimators:
        module, _, name = entry.partition(":")
        table.add_row(name, f"posttrain.estimators.{module}", Text(_summary(resolve(entry))))
    console.print(table)
    for label, values in (("elsewhere", p.elsewhere), ("checks", p.checks), ("docs", (p.page,) if p.page else ())):
        if values:
            console.print(f"{label}: " + ", ".join(values), highlight=False, soft_wrap=True)


def _summary(obj: object) -> str:
    """An object's docstring summary as `plain_summary` prints a registry entry."""
    from posttrain.registry import Entry

    doc = (getattr(obj, "__doc__", None) or "").strip().splitlines()
    return plain_summary(Entry("", obj, doc[0] if doc else "", ""))


_MATH_SPAN = re.compile(r":math:`([^`]*)`|\$\$?([^$]+)\$\$?")
_ROLE_SPAN = re.compile(r":(?:py:)?\w+:`~?([^`]+)`")
_GREEK = "alpha beta gamma delta epsilon varepsilon eta theta kappa lambda mu nu xi pi rho sigma tau phi varphi chi psi omega"
_TEX_WORDS = {
    **dict(zip(_GREEK.split(), "αβγδεεηθκλμνξπρστφφχψω", strict=True)),
    **dict(zip("Delta Sigma Omega Pi ell sum prod cdot times le leq ge geq ne".split(), "ΔΣΩΠℓΣΠ·×≤≤≥≥≠", strict=True)),
    **dict(zip("approx propto infty nabla to in mid partial sim |".split(), "≈∝∞∇→∈|∂~‖", strict=True)),
    **{w: w + " " for w in ("log", "exp", "min", "max")},
}
_ACCENTS = {"hat": "\u0302", "bar": "\u0304", "tilde": "\u0303", "widehat": "\u0302", "overline": "\u0304"}


def _plain_math(tex: str) -> str:
    """LaTeX as readable one-line text: Greek letters and operators as Unicode, fractions as a/b."""
    s = tex
    s = re.sub(r"\\(?:left|right|big|Big|bigl|bigr)\b", "", s)
    s = re.sub(r"\\(?:mathrm|text|operatorname|mathbf|mathcal|mathbb|boldsymbol|textrm)\{([^{}]*)\}", r"\1", s)
    for _ in range(3):
        s = re.sub(r"\\[td]?frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", s)
        s = re.sub(r"\\sqrt\{([^{}]*)\}", r"√(\1)", s)
    s = re.sub(r"\\[td]?frac(\d)(\d)", r"\1/\2", s)
    s = re.sub(r"\\(" + "|".join(_ACCENTS) + r")\{?\s*(\\?[A-Za-z])\}?", lambda m: _accent(m.group(2), m.group(1)), s)
    s = re.sub(r"\\([A-Za-z]+|\|)", lambda m: _TEX_WORDS.get(m.group(1), m.group(1)), s)
    s = re.sub(r"\\[,;:!> ]", " ", s)
    s = re.sub(r"_\{([^{}]*)\}", r"_\1", s)
    s = re.sub(r"\^\{([^{}]{2,})\}", r"^(\1)", s)
    s = s.replace("{", "").replace("}", "").replace("~", " ")
    return " ".join(s.split())


def _accent(letter: str, accent: str) -> str:
    base = _TEX_WORDS.get(letter.lstrip("\\"), letter.lstrip("\\"))
    return base + _ACCENTS[accent]


def plain_summary(entry: Any, width: int = 160) -> str:
    """An entry's summary as one readable line: the docstring's first paragraph (not a line cut
    mid-formula), math as Unicode text, Sphinx roles and code markup dropped, at most ``width``
    characters cut at a word boundary."""
    text = entry.summary
    doc = getattr(entry.obj, "__doc__", None) or ""
    first = " ".join(doc.strip().split("\n\n", 1)[0].split())
    if text and first.startswith(text.strip()):
        text = first
    text = _MATH_SPAN.sub(lambda m: _plain_math(m.group(1) if m.group(1) is not None else m.group(2)), text)
    text = _ROLE_SPAN.sub(lambda m: m.group(1).split(".")[-1], text)
    text = re.sub(r"``?([^`]+)``?", r"\1", text)
    text = re.sub(r"\*\*?([^*]+)\*\*?", r"\1", text)
    text = " ".join(text.split())
    if len(text) > width:
        cut = text[: width - 1]
        sentence = cut.rfind(". ")
        text = cut[: sentence + 1] if sentence > width // 2 else cut.rsplit(" ", 1)[0] + " …"
    return text


@app.command("check")
def check(
    ids: list[str] = typer.Argument(None, help="Check ids to run (default: all); '20' also runs 20a, 20b, ..."),
    smoke: bool = CHECK_OPTIONS["smoke"],
    seeds: int = CHECK_OPTIONS["seeds"],
    out: str = CHECK_OPTIONS["out"],
    json_out: bool = CHECK_OPTIONS["json_out"],
    strict: bool = CHECK_OPTIONS["strict"],
    stability: bool = CHECK_OPTIONS["stability"],
    tables: bool = CHECK_OPTIONS["tables"],
    mutant: str = CHECK_OPTIONS["mutant"],
    mutants: bool = CHECK_OPTIONS["mutants"],
    jobs: int = CHECK_OPTIONS["jobs"],
    update_readme: bool = typer.Option(
        False, "--update-readme", help="After a full run with --out, rewrite the README method table from it."
    ),
) -> None:
    """Run the paper checks: a three-way verdict per claim from its primary endpoint (exit 1 if a check raised)."""
    from posttrain.paper_checks import CHECKS
    from posttrain.paper_checks.cli import main as run_checks

    load_registries()  # includes every paper-check module
    if len(CHECKS) == 0:
        console.print("No paper checks are registered yet.")
        raise typer.Exit(0)
    code = run_checks(
        ids or [], smoke=smoke, seeds=seeds, out=out, json_out=json_out, strict=strict, stability=stability,
        tables=tables, mutant=mutant, mutants=mutants, jobs=jobs, console=console,
    )  # fmt: skip
    if update_readme and code != 2:
        from pathlib import Path

        from posttrain.paper_checks.readme_table import update_readme as rewrite

        if out is None or smoke:
            console.print("[red]--update-readme needs a full run (no --smoke) with --out[/]")
            raise typer.Exit(2)
        changed = rewrite(Path(out) / "results.json", Path(__file__).resolve().parents[1] / "README.md")
        console.print(f"README method table: {changed} cells rewritten")
    raise typer.Exit(code)


@app.command("real-check")
@bad_input_exits
def real_check(
    ids: list[str] = typer.Argument(None, help="Paper ids to run (default: all)."),
    profile: str = typer.Option("full", "--profile", help="full (SmolLM2 suite), measure (2-step costs) or smoke."),
    seeds: int = typer.Option(None, "--seeds", help="Override every experiment's planned seed count."),
    root: str = typer.Option("runs/real_checks", "--root", help="Cache of the runs (resumable)."),
    out: str = typer.Option(None, "--out", help="Directory for real_results.json."),
    update_docs: bool = typer.Option(False, "--update-docs", help="Store the results and regenerate the docs."),
    train_ungated: bool = typer.Option(False, "--train-ungated", help="Train arms whose probe misses the regime."),
    gate_only: bool = typer.Option(False, "--gate-only", help="Probe and gate the base model; train nothing."),
    cached_only: bool = typer.Option(
        False, "--cached-only", help="Train nothing; judge the experiments whose runs are all finished under --root."
    ),
    pilot: bool = typer.Option(False, "--pilot", help="Run 3 pilot seeds and record them for the seed plans."),
    plan: bool = typer.Option(False, "--plan", help="Print the experiments' seeds and arms; run nothing."),
    budget: bool = typer.Option(False, "--budget", help="Price the full plan from the measure profile's runs."),
    threads: int = typer.Option(2, "--threads", help="Torch threads."),
    archive: bool = typer.Option(
        False,
        "--archive",
        help="Restore the records kept in docs/paper_checks/real_runs first; keep the new ones after.",
    ),
) -> None:
    """The paper checks on SmolLM2-135M-Instruct: transfer cards, regime gates, verdicts beside the toys'."""
    from posttrain.real_checks.cli import main as run_real

    code = run_real(
        ids or [], profile=profile, seeds=seeds, root=root, out=out, update_docs=update_docs,
        train_ungated=train_ungated, plan=plan, budget=budget, gate_only=gate_only, cached_only=cached_only,
        pilot=pilot, threads=threads, archive=archive, console=console,
    )  # fmt: skip
    raise typer.Exit(code)


def _print_edit_report(report: object, out_dir: str) -> None:
    """The edit's numbers as a two-column table (names never wrapped), then where it was written."""
    from dataclasses import asdict

    data = {k: v for k, v in asdict(report).items() if k != "per_tensor"}  # type: ignore[call-overload]
    table = Table(title="checkpoint edit")
    table.add_column("quantity", no_wrap=True)
    table.add_column("value", justify="right", overflow="fold")
    for k, v in data.items():
        table.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
    console.print(table)
    console.print(f"written to {out_dir}", highlight=False, soft_wrap=True)


@app.command("sar")
@bad_input_exits
def sar(
    base_dir: str = typer.Argument(..., help="Base checkpoint directory (safetensors)."),
    tuned_dir: str = typer.Argument(..., help="RL-tuned checkpoint directory from the same base."),
    out_dir: str = typer.Argument(..., help="Where to write the edited checkpoint."),
    delta_fraction: float = typer.Option(
        0.01, "--rank", "--delta-fraction", help="k = max(1, floor(rank * min(m, n)))."
    ),
    base_rank: int = typer.Option(None, "--base-rank", help="Base subspace rank r (default: full)."),
    mask: str = typer.Option("full", "--mask", help="full, diagonal or off_diagonal."),
    alpha: float = typer.Option(1.0, "--alpha", help="Scale of the projected update."),
    dtype: str = typer.Option("auto", "--dtype", help="auto, float32, float16 or bfloat16 (bf16 may erase the edit)."),
    exact: bool = typer.Option(
        False, "--exact", metavar="", help="Exact SVD of each delta instead of a randomized one."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", metavar="", help="Replace OUT_DIR if it is not empty."),
) -> None:
    """SAR: keep the rank-k part of an RL update aligned with the base's spectral frame (arXiv:2607.03065).

    OUT_DIR is written whole under a temporary name and renamed into place; the inputs are only read.
    """
    from posttrain.llm.tools.sar import edit_checkpoint

    report = edit_checkpoint(
        base_dir,
        [tuned_dir],
        out_dir,
        delta_fraction=delta_fraction,
        base_rank=base_rank,
        mask=mask,
        alphas=[alpha],
        save_dtype=dtype,
        randomized=not exact,
        overwrite=overwrite,
    )
    _print_edit_report(report, out_dir)


@app.command("merge")
@bad_input_exits
def merge(
    base_dir: str = typer.Argument(..., help="Base checkpoint directory shared by all experts."),
    out_dir: str = typer.Argument(..., help="Where to write the merged checkpoint."),
    tuned_dirs: list[str] = typer.Argument(..., help="Expert checkpoint directories."),
    method: str = typer.Option("sar", "--method", help="sar, task_arithmetic, average or ties."),
    delta_fraction: float = typer.Option(0.01, "--rank", "--delta-fraction", help="SAR rank fraction."),
    dtype: str = typer.Option("auto", "--dtype", help="auto, float32, float16 or bfloat16."),
    overwrite: bool = typer.Option(False, "--overwrite", metavar="", help="Replace OUT_DIR if it is not empty."),
) -> None:
    """Merge RL experts fine-tuned from one base (SAR-projected sum by default); OUT_DIR as for ``sar``."""
    from posttrain.llm.tools.sar import edit_checkpoint

    report = edit_checkpoint(
        base_dir, tuned_dirs, out_dir, method=method, delta_fraction=delta_fraction, save_dtype=dtype,
        overwrite=overwrite,
    )  # fmt: skip
    _print_edit_report(report, out_dir)


# LLM trainer commands (posttrain.llm.cli imports torch/transformers only inside the commands).
from posttrain.llm import cli as _llm_cli  # noqa: E402

REGISTERING_MODULES += [
    "posttrain.llm.methods.algorithm",
    "posttrain.llm.rollout.tasks",
]  # method, task, verifier registries

app.command("train")(bad_input_exits(_llm_cli.train_command))
app.command("eval")(bad_input_exits(_llm_cli.eval_command))
app.command("es")(bad_input_exits(_llm_cli.es_command))
app.command("pairs")(bad_input_exits(_llm_cli.pairs_command))
app.command("dpo")(bad_input_exits(_llm_cli.dpo_command))
app.add_typer(importlib.import_module("posttrain.llm.tools.models").models_app(bad_input_exits), name="models")


@app.command("arena")
@bad_input_exits
def arena(
    function: str = typer.Argument(..., help="The function to judge: module:function or path/file.py:function."),
    kind: str = typer.Option(None, "--kind", help="advantage, loss or kl (default: read from the parameter names)."),
    baselines: str = typer.Option(
        None,
        "--baselines",
        help="Comma-separated registered names of the same kind (default: grpo,rloo,drgrpo; for a loss "
        "ppo_clip,cispo,gspo; for a KL estimator k1,k2,k3).",
    ),
    seeds: int = typer.Option(64, "--seeds", help="Paired seeds of the learning curves."),
    out: str = typer.Option(None, "--out", help="Write report.md, report.json and arena.png into this directory."),
) -> None:
    """Judge your own advantage, policy loss or KL estimator: contract, conventions, exact toys, learning curves."""
    from posttrain.arena.cli import main as run_arena

    run_arena(function, kind=kind, baselines=baselines, seeds=seeds, out=out, console=console)


@app.command("flops")
@bad_input_exits
def flops(
    config: str = typer.Argument(..., help="A training config YAML (llm format and/or a `flops:` section)."),
) -> None:
    """Print the RACE FLOP accounting (search / learning / reward, update fraction p) of a config."""
    from posttrain.llm.tools.flops import print_flops

    print_flops(config, console)


def main() -> None:
    try:
        app()
    except ModuleNotFoundError as exc:  # an optional extra is missing: name it in one line
        message = missing_extra_message(exc)
        if message is None or _STATE["debug"]:
            raise
        raise SystemExit(message) from None


if __name__ == "__main__":
    main()
