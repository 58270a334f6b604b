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
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show the full traceback of an error instead of one line."),
) -> None:
    """LLM post-training methods: estimators, toy paper checks, and an LLM trainer."""
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
    "posttrain.estimators.projections",
    "posttrain.paper_checks",
]


def load_registries() -> None:
    """Import every module that registers something."""
    for name in REGISTERING_MODULES:
        importlib.import_module(name)
    from posttrain.paper_checks import load_all

    load_all()


@app.command("list")
def list_registered(kind: str = typer.Argument(None, help="Only this registry (e.g. advantage).")) -> None:
    """List every registered estimator (and check) with its one-line summary and paper."""
    from rich.text import Text

    from posttrain.registry import REGISTRIES

    load_registries()
    kinds = [kind] if kind else sorted(REGISTRIES)
    for k in kinds:
        if k not in REGISTRIES:
            raise typer.BadParameter(f"unknown registry {k!r}; valid: {', '.join(sorted(REGISTRIES))}")
        reg = REGISTRIES[k]
        table = Table(title=f"{k} ({len(reg)})", show_lines=False)
        table.add_column("name", style="bold")
        table.add_column("summary", overflow="fold")
        table.add_column("paper", style="dim", overflow="fold")
        for e in reg:
            table.add_row(e.name, Text(plain_summary(e)), Text(e.paper))
        console.print(table)


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
    smoke: bool = typer.Option(False, "--smoke", help="Run the small smoke variant of each check."),
    seeds: int = typer.Option(None, "--seeds", help="Override the number of seeds."),
    out: str = typer.Option(None, "--out", help="Directory for report.md, results.json and PNG plots."),
    json_out: bool = typer.Option(False, "--json", help="Print results as JSON."),
    strict: bool = typer.Option(False, "--strict", help="Also exit non-zero when a claim is not reproduced."),
    stability: bool = typer.Option(False, "--stability", help="Also rerun each check at twice its seeds; list flips."),
    update_readme: bool = typer.Option(
        False, "--update-readme", help="After a full run with --out, rewrite the README method table's status column."
    ),
) -> None:
    """Run the paper checks and print a verdict per claim (exit 1 if a check raised)."""
    from posttrain.paper_checks import CHECKS

    load_registries()  # includes every paper-check module
    if len(CHECKS) == 0:
        console.print("No paper checks are registered yet.")
        raise typer.Exit(0)
    runner = importlib.import_module("posttrain.paper_checks._harness")
    code = runner.main(
        ids or [],
        smoke=smoke,
        seeds=seeds,
        out=out,
        json_out=json_out,
        strict=strict,
        check_stability=stability,
        console=console,
    )
    if update_readme and code != 2:
        from pathlib import Path

        from posttrain.paper_checks.readme_table import update_readme as rewrite

        if out is None or smoke:
            console.print("[red]--update-readme needs a full run (no --smoke) with --out[/]")
            raise typer.Exit(2)
        changed = rewrite(Path(out) / "results.json", Path(__file__).resolve().parents[1] / "README.md")
        console.print(f"README method table: {changed} status cells rewritten")
    raise typer.Exit(code)


def _print_edit_report(report: object) -> None:
    from dataclasses import asdict

    data = {k: v for k, v in asdict(report).items() if k != "per_tensor"}  # type: ignore[call-overload]
    table = Table(title="checkpoint edit")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    for k, v in data.items():
        table.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
    console.print(table)


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
    exact: bool = typer.Option(False, "--exact", help="Exact SVD of each delta instead of a randomized one."),
) -> None:
    """SAR: keep the rank-k part of an RL update aligned with the base's spectral frame (arXiv:2607.03065)."""
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
    )
    _print_edit_report(report)


@app.command("merge")
@bad_input_exits
def merge(
    base_dir: str = typer.Argument(..., help="Base checkpoint directory shared by all experts."),
    out_dir: str = typer.Argument(..., help="Where to write the merged checkpoint."),
    tuned_dirs: list[str] = typer.Argument(..., help="Expert checkpoint directories."),
    method: str = typer.Option("sar", "--method", help="sar, task_arithmetic, average or ties."),
    delta_fraction: float = typer.Option(0.01, "--rank", "--delta-fraction", help="SAR rank fraction."),
    dtype: str = typer.Option("auto", "--dtype", help="auto, float32, float16 or bfloat16."),
) -> None:
    """Merge RL experts fine-tuned from one base (SAR-projected sum by default)."""
    from posttrain.llm.tools.sar import edit_checkpoint

    report = edit_checkpoint(
        base_dir, tuned_dirs, out_dir, method=method, delta_fraction=delta_fraction, save_dtype=dtype
    )
    _print_edit_report(report)


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
