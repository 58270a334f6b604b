"""MkDocs hooks: the pages that would drift if written by hand are generated at build time.

- ``reference/config.md``: every section and key of :class:`posttrain.llm.config.RunConfig`
  (type, default, description from the dataclasses; valid names read from the validator);
- ``reference/cli.md``: every ``posttrain`` command with its arguments and options (the typer app);
- ``reference/api/*.md``: one page per subpackage, one mkdocstrings block per module found on disk;
- ``<!-- checks: ID -->`` in a page: the verdict, primary endpoint, tables, mutants and plot of check
  ID from the last full run (``docs/paper_checks/results.json``, ``mutants.json`` and
  ``check_ID.png``, stored by ``posttrain check --out reports --mutants --update-readme``), written
  by the same formatter as ``report.md`` (`posttrain.paper_checks.report.check_markdown`); "no
  full run recorded" when absent;
- ``<!-- checks-overview -->``: the table of every recorded check;
- ``<!-- paper-functions: ID -->`` in a page: the functions of paper ID with their modules and
  summaries, from the paper table `posttrain.papers.PAPERS`.

Pages named in the nav but missing (written by another change) get a short placeholder.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import re
import types
import typing
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.posttrain")

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "posttrain"
CHECKS_DIR = Path(__file__).resolve().parent / "paper_checks"

# API pages: (page name, title, dotted package, recurse into subpackages?)
_API_TOP = [
    ("core", "Core: errors, shapes, registry, testing", "posttrain", False),
    ("estimators", "Estimators", "posttrain.estimators", True),
    ("theory", "Theory", "posttrain.theory", True),
    ("simulators", "Simulators", "posttrain.simulators", True),
    ("paper_checks", "Paper checks", "posttrain.paper_checks", False),
    ("arena", "Arena: judge your own estimator", "posttrain.arena", False),
]

# ----------------------------------------------------------------------------------------------
# Text helpers
# ----------------------------------------------------------------------------------------------

_ROLE = re.compile(r":(?:py:)?(func|class|meth|attr|data|mod|exc|obj):`~?([^`]+)`")
_MATH = re.compile(r":math:`([^`]*)`")


def md_text(text: str) -> str:
    """Docstring text (Sphinx roles or already Markdown) as Markdown for a generated page."""
    text = _MATH.sub(lambda m: f"${m.group(1)}$", text)
    text = _ROLE.sub(lambda m: f"`{m.group(2).split('.')[-1]}`", text)
    return text


def _cell(text: str) -> str:
    """One table cell: a single line; pipes escaped (inside math written as ``\\vert``/``\\Vert``)."""
    text = " ".join(md_text(text).split())
    parts = re.split(r"(\$[^$]+\$)", text)
    for i, part in enumerate(parts):
        if i % 2:
            parts[i] = part.replace("\\|", "\\Vert ").replace("|", "\\vert ")
        else:
            parts[i] = part.replace("|", "\\|")
    return "".join(parts)


# ----------------------------------------------------------------------------------------------
# API reference
# ----------------------------------------------------------------------------------------------


def _modules(dotted: str, recurse: bool) -> list[str]:
    folder = ROOT.joinpath(*dotted.split("."))
    out = []
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        out.append(f"{dotted}.{path.stem}")
    if recurse:  # a subpackage: its own docstring (its table of modules), then its modules
        for sub in sorted(p for p in folder.iterdir() if (p / "__init__.py").exists() and not p.name.startswith("_")):
            out.append(f"{dotted}.{sub.name}")
            out.extend(_modules(f"{dotted}.{sub.name}", True))
    return out


def _api_pages() -> list[tuple[str, str, str, list[str]]]:
    """(file name, title, package, modules) for every API page."""
    pages = []
    for name, title, dotted, recurse in _API_TOP:
        pages.append((f"reference/api/{name}.md", title, dotted, _modules(dotted, recurse)))
    llm = PACKAGE / "llm"
    pages.append(
        ("reference/api/llm.md", "LLM trainer: entry points", "posttrain.llm", _modules("posttrain.llm", False))
    )
    for sub in sorted(p for p in llm.iterdir() if (p / "__init__.py").exists() and not p.name.startswith("_")):
        dotted = f"posttrain.llm.{sub.name}"
        pages.append((f"reference/api/llm_{sub.name}.md", f"LLM: {sub.name}", dotted, _modules(dotted, True)))
    return pages


def _api_markdown(title: str, package: str, modules: list[str]) -> str:
    lines = [f"# {title}", "", "Generated from the docstrings of the modules in this package.", ""]
    lines += [f"::: {package}", "    options:", "      members: false", "      show_root_heading: false", ""]
    for mod in modules:
        if ROOT.joinpath(*mod.split("."), "__init__.py").exists():  # a package re-exports: its docstring only
            lines += [f"::: {mod}", "    options:", "      members: false", ""]
        else:
            lines += [f"::: {mod}", ""]
    return "\n".join(lines)


def _api_index(pages: list[tuple[str, str, str, list[str]]]) -> str:
    lines = [
        "# API reference",
        "",
        "One page per subpackage; each lists the public functions and classes of its modules.",
        "",
    ]
    lines += ["| page | package | modules |", "| --- | --- | --- |"]
    for path, title, package, modules in pages:
        link = path.removeprefix("reference/api/")
        lines.append(f"| [{title}]({link}) | `{package}` | {len(modules)} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------
# Configuration reference
# ----------------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    """An annotation without its limits, as text (``int``, ``str | None``, ``list[float]``)."""
    from posttrain.llm.typed import type_text

    base, _ = _limits(tp)
    args = [a for a in typing.get_args(base) if a is not type(None)]
    if typing.get_origin(base) in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args]
        return " | ".join([*names, "None"] if type(None) in typing.get_args(base) else names)
    if typing.get_origin(base) is typing.Literal:
        return "str"
    text = type_text(base) if not typing.get_args(base) else str(base)
    return text.replace("typing.", "").replace("collections.abc.", "")


def _limits(tp: Any) -> tuple[Any, list[Any]]:
    """``(annotation without Annotated, its metadata)``; the metadata of ``Annotated[T, ...] | None`` too."""
    if typing.get_origin(tp) is typing.Annotated:
        base, *meta = typing.get_args(tp)
        return base, list(meta)
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1 and typing.get_origin(inner[0]) is typing.Annotated:
            base, meta = _limits(inner[0])
            return base | None, meta
    return tp, []


def _accepts(tp: Any) -> str:
    """What the validator accepts for ``tp``, read from its annotation: a range, or the valid names."""
    from posttrain.llm.typed import OneOf, Range

    base, meta = _limits(tp)
    parts = []
    for m in meta:
        if isinstance(m, Range):
            parts.append(m.text("an integer" if _type_name(base).startswith("int") else "a number"))
        elif isinstance(m, OneOf):
            parts.append("one of: " + ", ".join(f"`{v}`" for v in m.valid()))
    inner = [a for a in (typing.get_args(base) or (base,)) if a is not type(None)]
    for a in inner:
        if typing.get_origin(a) is typing.Literal:
            parts.append("one of: " + ", ".join(f"`{v}`" for v in typing.get_args(a)))
        elif isinstance(a, type) and issubclass(a, enum.Enum):
            parts.append("one of: " + ", ".join(f"`{m.value}`" for m in a))
    return "; ".join(parts)


def _attribute_docs(cls: type) -> dict[str, str]:
    """Field docstrings (a string right after the field) and trailing ``# comments`` of a dataclass."""
    import ast
    import inspect

    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    tree = ast.parse(source)
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for i, node in enumerate(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        nxt = body[i + 1] if i + 1 < len(body) else None
        if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            docs[name] = inspect.cleandoc(nxt.value.value)
            continue
        line = lines[node.lineno - 1]
        if "#" in line and line.count('"') % 2 == 0:
            docs[name] = line.split("#", 1)[1].strip()
    return docs


def _default_text(f: dataclasses.Field) -> str:  # type: ignore[type-arg]
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return "(section)"
    else:
        return "(required)"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{json.dumps(value)}`"
    return f"`{value}`"


def _config_markdown() -> str:
    from posttrain.llm import config as cfgmod

    lines = [
        "# Configuration reference",
        "",
        "Generated at build time from the dataclasses in `posttrain.llm.config.schema` (each key's type and",
        "the limits its annotation declares, read by `posttrain.llm.typed`). A run config is a YAML",
        "mapping of these sections; every key is optional and unknown keys fail at load with the list of",
        "valid ones. Override any key on the command line with `--set section.key=value`",
        "(e.g. `posttrain train run.yaml --set optim.lr=1e-4 --set algorithm.kl=null`). Every check runs when the",
        "config loads, before a model is built or the run directory is touched: a bad value ends in one line",
        "naming its key and exit code 2. The option mappings are checked against what they configure:",
        "`data.options` against the task (its dataclass and the limits below), `optim.options` against the",
        "optimizer's keyword parameters, `algorithm.options` against the method's options class, and",
        "`algorithm.loss_options` / `advantage_options` against the estimator (its signature and its own checks).",
        "",
        "```yaml",
        "seed: 0",
        "model: {path: null}        # null: a tiny model built in the run directory",
        "data: {task: multiple, prompts_per_step: 16}",
        "rollout: {group_size: 8, max_new_tokens: 8}",
        "algorithm: {method: grpo}",
        "optim: {steps: 40, lr: 1.0e-5}",
        "```",
        "",
    ]
    root = cfgmod.RunConfig

    def section(cls: type, path: tuple[str, ...], optional: bool) -> None:
        hints = typing.get_type_hints(cls, include_extras=True)
        docs = _attribute_docs(cls)
        title = ".".join(path) if path else "top level"
        lines.append(f"## `{title}`" if path else "## Top level")
        lines.append("")
        if optional:
            lines.extend(["Optional section: absent (`null`) unless set.", ""])
        if cls.__doc__:
            lines.extend([md_text(" ".join(cls.__doc__.split("\n\n")[0].split())), ""])
            rest = cls.__doc__.split("\n\n")[1:]
            if rest:
                lines.extend([md_text(" ".join(" ".join(rest).split())), ""])
        lines.extend(["| key | type | accepts | default | description |", "| --- | --- | --- | --- | --- |"])
        subsections = []
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            sub = _section_class(tp)
            if sub is not None:
                subsections.append((f.name, sub, _default_text(f) == "`null`"))
                lines.append(
                    f"| `{f.name}` | section | | {_default_text(f)} | see [`{'.'.join((*path, f.name))}`](#{_anchor((*path, f.name))}) |"
                )
                continue
            desc = docs.get(f.name, "")
            row = f"| `{f.name}` | `{_type_name(tp)}` | {_cell(_accepts(tp))} | {_default_text(f)} | {_cell(desc)} |"
            lines.append(row)
        lines.append("")
        for name, sub, opt in subsections:
            section(sub, (*path, name), opt)

    section(root, (), False)
    lines += _task_limits_table()
    lines += _needs_table()
    lines += _methods_table()
    return "\n".join(lines) + "\n"


def _task_limits_table() -> list[str]:
    """The limits of the built-in tasks' options (`posttrain.llm.config.targets.TASK_LIMITS`)."""
    from posttrain.llm.config.targets import TASK_LIMITS

    out = ["## Task option limits", "", "| task | option | accepts |", "| --- | --- | --- |"]
    for task, limits in TASK_LIMITS.items():
        for key, meta in limits.fields.items():
            text = meta.text("an integer") if hasattr(meta, "text") else "one of: " + ", ".join(meta.valid())
            out.append(f"| `{task}` | `{key}` | {_cell(text)} |")
    return [*out, ""]


def _needs_table() -> list[str]:
    """`posttrain.llm.methods.needs.NEEDS`: what a method may read from a batch, who provides it, what it requires."""
    from posttrain.llm.methods.needs import NEEDS

    out = [
        "## Batch inputs a method reads (needs)",
        "",
        "A method declares what it reads from a rollout batch; this table says who provides each and which",
        "config key it requires (checked at load). Generated from `posttrain.llm.methods.needs.NEEDS`.",
        "",
        "| need | shape | provided by | requires | what |",
        "| --- | --- | --- | --- | --- |",
    ]
    for need, row in NEEDS.items():
        requires = " or ".join(f"`{k}`" for k in row.requires) or "-"
        out.append(f"| `{need}` | `[{row.shape.replace(' ', ', ')}]` | {row.source.value} | {requires} | {_cell(row.doc)} |")
    return [*out, ""]


def _anchor(path: tuple[str, ...]) -> str:
    return "".join(c for c in ".".join(path).lower() if c.isalnum() or c in "-_")


def _section_class(tp: Any) -> type | None:
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    inner = [a for a in typing.get_args(tp) if a is not type(None)]
    if len(inner) == 1 and isinstance(inner[0], type) and dataclasses.is_dataclass(inner[0]):
        return inner[0]
    return None


def _methods_table() -> list[str]:
    """The presets of ``algorithm.method`` and the registered parts it can override."""
    from posttrain.cli import load_registries
    from posttrain.registry import REGISTRIES

    load_registries()
    out = [
        "## Registered names",
        "",
        "What `algorithm.method`, `algorithm.advantage`, `algorithm.loss` and `algorithm.kl` accept,",
        "with the one-line summary of each (`posttrain list KIND` prints the same).",
        "",
    ]
    methods = REGISTRIES.get("method")
    if methods is not None:
        out += [
            "### method",
            "",
            "A preset names its parts (each overridable by the `algorithm` key of the same name); a",
            "bundle is built by a factory whose keyword options are set in `algorithm.options`.",
            "",
            "| name | parts or options | summary |",
            "| --- | --- | --- |",
        ]
        for e in methods:
            out.append(f"| `{e.name}` | {_cell(_method_parts(e.obj))} | {_cell(_first_sentence(e))} |")
        out.append("")
    for kind in ("advantage", "policy_loss", "kl", "task", "verifier", "replay"):
        reg = REGISTRIES.get(kind)
        if reg is None:
            continue
        out += [f"### {kind}", "", "| name | summary | paper |", "| --- | --- | --- |"]
        for e in reg:
            out.append(f"| `{e.name}` | {_cell(_first_sentence(e))} | {_cell(e.paper)} |")
        out.append("")
    return out


def _method_parts(obj: Any) -> str:
    """``advantage / loss / aggregation`` of a preset, or the factory's keyword options of a bundle."""
    import inspect

    if all(hasattr(obj, a) for a in ("advantage", "loss", "aggregation")):
        text = f"advantage `{obj.advantage}`, loss `{obj.loss}`, aggregation `{obj.aggregation}`"
        for attr in ("advantage_options", "loss_options"):
            opts = dict(getattr(obj, attr, {}) or {})
            if opts:
                text += f", {attr} `{json.dumps(opts, default=str)}`"
        return text
    options = getattr(obj, "options", None)
    if isinstance(options, type) and dataclasses.is_dataclass(options):  # a bundle's typed options class
        hints = typing.get_type_hints(options, include_extras=True)
        shown = []
        for f in dataclasses.fields(options):
            default = f.default if f.default is not dataclasses.MISSING else None
            accepts = _accepts(hints[f.name])
            shown.append(f"`{f.name}={getattr(default, 'value', default)!r}`" + (f" ({accepts})" if accepts else ""))
        return f"bundle; options (`{options.__name__}`): " + (", ".join(shown) if shown else "none")
    factory = getattr(obj, "factory", None)
    if factory is None:
        return ""
    if isinstance(factory, str):  # a lazy import path
        import importlib

        module, _, name = factory.rpartition(".")
        try:
            factory = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            return f"bundle `{obj.factory}`"
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return "bundle"
    opts = [
        f"`{p.name}={getattr(p.default, 'value', p.default)!r}`"
        if p.default is not inspect.Parameter.empty
        else f"`{p.name}`"
        for p in params
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    return "bundle; options: " + (", ".join(opts) if opts else "none")


def _first_sentence(entry: Any) -> str:
    """The entry's summary as Markdown: the docstring's first paragraph when it starts with the summary."""
    text = str(entry.summary)
    doc = getattr(entry.obj, "__doc__", None) or ""
    first = " ".join(doc.strip().split("\n\n", 1)[0].split())
    if text and first.startswith(text.strip()):
        text = first
    return md_text(text)


# ----------------------------------------------------------------------------------------------
# CLI reference
# ----------------------------------------------------------------------------------------------


def _cli_markdown() -> str:
    import typer

    from posttrain.cli import app

    group: Any = typer.main.get_command(app)  # typer may vendor its own click: duck-typed below
    lines = [
        "# Command line",
        "",
        "Generated at build time from the `posttrain` typer app; `posttrain COMMAND --help` prints the same.",
        "",
    ]
    ctx = group.context_class(group, info_name="posttrain")
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        sub = cmd.context_class(cmd, info_name=name, parent=ctx)
        usage = " ".join(cmd.collect_usage_pieces(sub))
        lines += [f"## `posttrain {name}`", "", md_text(" ".join((cmd.help or "").split())), ""]
        lines += ["```text", f"posttrain {name} {usage}", "```", ""]
        rows = []
        for p in cmd.params:
            if p.param_type_name == "argument":
                kind = "argument"
                names = f"`{p.name.upper()}`" if p.name else ""
            else:
                kind = "option"
                names = ", ".join(f"`{o}`" for o in (*p.opts, *p.secondary_opts))
            default = p.default
            if callable(default) or default in (None, (), []) or kind == "argument":
                dtext = "required" if p.required else ""
            else:
                dtext = f"`{default}`"
            help_text = getattr(p, "help", "") or ""
            multiple = " (repeatable)" if getattr(p, "multiple", False) and "repeatable" not in help_text else ""
            if default is False:
                dtext = "off (flag)"
            rows.append(f"| {names} | {kind} | {dtext} | {_cell(help_text + multiple)} |")
        if rows:
            lines += ["| name | kind | default | help |", "| --- | --- | --- | --- |", *rows, ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Paper-check results
# ----------------------------------------------------------------------------------------------


def _stored(name: str) -> dict[str, Any] | None:
    path = CHECKS_DIR / name
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        log.warning("docs/paper_checks/%s is not valid JSON: %s", name, exc)
        return None


def _ids_matching(checks: list[dict[str, Any]], wanted: str) -> list[dict[str, Any]]:
    return [
        c
        for c in checks
        if c.get("id") == wanted or (str(c.get("id", "")).startswith(wanted) and str(c["id"])[len(wanted) :].isalpha())
    ]


def _check_doc_markdown(wanted: str) -> str:
    """The module docstring of the check(s) with id ``wanted``: claim, toy, simplifications, as the code states them."""
    import importlib

    from posttrain.paper_checks import CHECKS, load_all

    load_all()
    modules: list[str] = []
    for name in CHECKS.names():
        if name == wanted or (name.startswith(wanted) and name[len(wanted) :].isalpha()):
            mod = getattr(CHECKS.get(name).run, "__module__", None)
            if mod and mod not in modules:
                modules.append(mod)
    if not modules:
        return f"*No check with id {wanted} is registered.*\n"
    out = []
    for mod in modules:
        doc = importlib.import_module(mod).__doc__ or ""
        body = md_text(doc.strip()).replace("][", "]\\[")
        out += [f'??? abstract "The toy and its simplifications, as `{mod}` states them"', ""]
        out += [("    " + ln) if ln.strip() else "" for ln in body.splitlines()]
        out.append("")
    return "\n".join(out)


def _checks_markdown(wanted: str, page_depth: int) -> str:
    """The recorded verdict of check(s) ``wanted``: the same section as ``report.md`` (one formatter), with mutants."""
    from posttrain.paper_checks.markdown import check_markdown

    data = _stored("results.json")
    if data is None:
        return f"*No full run recorded* for check {wanted}: `posttrain check --out reports --update-readme` records every check.\n"
    hits = _ids_matching(list(data.get("checks", [])), wanted)
    if not hits:
        return f"*No full run recorded* for check {wanted} in `docs/paper_checks/results.json`.\n"
    mutants = list((_stored("mutants.json") or {}).get("mutants", []))
    lines = [f"Last recorded run: {data.get('mode', 'full')} mode.", ""]
    for c in hits:
        png = CHECKS_DIR / f"check_{c['id']}.png"
        image = f"{'../' * page_depth}paper_checks/check_{c['id']}.png" if png.exists() else None
        own = [m for m in mutants if m.get("id") == c["id"]]
        lines += check_markdown(c, image=image, mutants=own, heading="")
    return "\n".join(lines)


def _overview_markdown() -> str:
    from posttrain.paper_checks.readme_table import mutant_status
    from posttrain.paper_checks.report import primary_text

    data = _stored("results.json")
    if data is None:
        return "*No full run recorded*: `posttrain check --out reports --update-readme` writes the results this table shows.\n"
    stored = _stored("mutants.json")
    mutants = None if stored is None else list(stored.get("mutants", []))
    lines = [
        f"Last recorded run: {data.get('mode', 'full')} mode.",
        "",
        "| check | claim | verdict | primary endpoint | can it fail | seeds |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for c in data.get("checks", []):
        lines.append(
            f"| {c.get('id')} | {_cell(c.get('claim', ''))} | {c.get('verdict')} | {_cell(primary_text(c))} | "
            f"{_cell(mutant_status(c['id'], mutants))} | {c.get('seeds')} |"
        )
    return "\n".join(lines) + "\n"


_CHECK_MARK = re.compile(r"<!--\s*checks:\s*([0-9]+[a-z]?)\s*-->")
_CHECK_DOC_MARK = re.compile(r"<!--\s*check-doc:\s*([0-9]+[a-z]?)\s*-->")


# ----------------------------------------------------------------------------------------------
# MkDocs hook entry points
# ----------------------------------------------------------------------------------------------

_GENERATED: dict[str, str] = {}


def on_config(config: Any) -> Any:
    pages = _api_pages()
    _GENERATED.clear()
    for path, title, package, modules in pages:
        _GENERATED[path] = _api_markdown(title, package, modules)
    _GENERATED["reference/api/index.md"] = _api_index(pages)
    for entry in config["nav"]:
        if isinstance(entry, dict) and "Reference" in entry:
            for sub in entry["Reference"]:
                if isinstance(sub, dict) and "API" in sub:
                    sub["API"] = ["reference/api/index.md", *({t: p} for p, t, _, _ in pages)]
    return config


def _nav_paths(nav: Any) -> list[str]:
    out: list[str] = []
    if isinstance(nav, str):
        out.append(nav)
    elif isinstance(nav, list):
        for x in nav:
            out += _nav_paths(x)
    elif isinstance(nav, dict):
        for x in nav.values():
            out += _nav_paths(x)
    return out


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    _GENERATED["reference/config.md"] = _config_markdown()
    _GENERATED["reference/cli.md"] = _cli_markdown()
    for path in _nav_paths(config["nav"]):
        if path.endswith(".md") and files.get_file_from_path(path) is None and path not in _GENERATED:
            log.info("docs: %s is not written yet; a placeholder page is built", path)
            _GENERATED[path] = (
                f"# {Path(path).stem.replace('_', ' ').capitalize()}\n\nThis page has not been written yet.\n"
            )
    for path, content in _GENERATED.items():
        existing = files.get_file_from_path(path)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, path, content=content))
    return files


_PAPER_MARK = re.compile(r"<!--\s*paper-functions:\s*([0-9]{2}|core)\s*-->")


def _paper_functions_markdown(paper_id: str) -> str:
    """The estimator functions of one paper from `posttrain.papers.PAPERS`: function, module, summary."""
    from posttrain.papers import paper, resolve

    p = paper(paper_id)
    lines = ["| function | module | summary |", "| --- | --- | --- |"]
    for entry in p.estimators:
        module, _, name = entry.partition(":")
        doc = (getattr(resolve(entry), "__doc__", None) or "").strip()
        summary = " ".join(doc.split("\n\n", 1)[0].split())
        lines.append(f"| `{name}` | `posttrain.estimators.{module}` | {_cell(summary)} |")
    if p.elsewhere:
        lines += ["", "Elsewhere: " + ", ".join(f"`posttrain.{e.replace(':', '.')}`" for e in p.elsewhere) + "."]
    return "\n".join(lines) if p.estimators else "\n".join(lines[3:]).strip()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    depth = page.file.src_uri.count("/")
    markdown = _PAPER_MARK.sub(lambda m: _paper_functions_markdown(m.group(1)), markdown)
    markdown = _CHECK_MARK.sub(lambda m: _checks_markdown(m.group(1), depth), markdown)
    markdown = _CHECK_DOC_MARK.sub(lambda m: _check_doc_markdown(m.group(1)), markdown)
    if "<!-- checks-overview -->" in markdown:
        markdown = markdown.replace("<!-- checks-overview -->", _overview_markdown())
    return markdown
